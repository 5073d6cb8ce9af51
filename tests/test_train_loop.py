"""The train stage's loop (`pipeline.train_loop`) against a plain float64 loop written here: one epoch's updates, its
mean loss and accuracy, the untrained loss, the first non-finite batch; the divergence rule and the selection
rule on hand-made cases; a hardened run's loop ends at λ_target with the record it was given."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline import train_loop as train
from pipeline.config import Config
from pipeline.data import Split

F64_RTOL = 1e-12  # the same float64 operations in the same order: equal up to the last bits


def _cfg(**train_kw) -> Config:
    cfg = Config(seed=3)
    cfg.data.batch_size = 16
    cfg.train.precision = "fp64"
    for k, v in train_kw.items():
        setattr(cfg.train, k, v)
    return cfg


def _data(n: int = 70) -> Split:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 5, generator=g)
    return Split(x, (x[:, 0] + 0.3 * x[:, 1] > 0).long())


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).double()


def _reference_epoch(model: nn.Module, split: Split, cfg: Config, epoch: int, lr: float) -> dict:
    """Plain SGD (no momentum, no weight decay) over the same seeded batch order, in float64."""
    order = torch.randperm(len(split), generator=torch.Generator().manual_seed(cfg.seed * 100_003 + epoch))
    losses, correct, first = [], 0, None
    for i in range(0, len(split), cfg.data.batch_size):
        idx = order[i:i + cfg.data.batch_size]
        x, y = split.x[idx].double(), split.y[idx]
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        first = float(loss.detach()) if first is None else first
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        losses.append(float(loss.detach()) * len(y))
        correct += int((logits.argmax(-1) == y).sum())
    return {"train_loss": sum(losses) / len(split), "train_top1": correct / len(split), "first_loss": first}


def test_one_epoch_equals_a_plain_float64_loop():
    cfg, split = _cfg(), _data()
    a, b = _net(), _net()
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    got = train._train_epoch(a, opt, split, cfg, epoch=2, device=torch.device("cpu"))
    ref = _reference_epoch(b, split, cfg, epoch=2, lr=0.1)
    for k in ("train_loss", "train_top1", "first_loss"):
        assert got[k] == pytest.approx(ref[k], rel=F64_RTOL), k
    assert got["nonfinite_batch"] is None
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=F64_RTOL, atol=0)


def test_the_epoch_order_depends_on_seed_and_epoch_only():
    cfg, split = _cfg(), _data()
    runs = []
    for _ in range(2):
        net = _net()
        train._train_epoch(net, torch.optim.SGD(net.parameters(), lr=0.1), split, cfg, 1, torch.device("cpu"))
        runs.append(torch.cat([p.detach().flatten() for p in net.parameters()]))
    assert torch.equal(runs[0], runs[1])
    other = _net()
    train._train_epoch(other, torch.optim.SGD(other.parameters(), lr=0.1), split, cfg, 2, torch.device("cpu"))
    assert not torch.equal(torch.cat([p.detach().flatten() for p in other.parameters()]), runs[0])


def test_the_first_non_finite_batch_is_named():
    cfg, split = _cfg(), _data()
    order = torch.randperm(len(split), generator=train.epoch_generator(cfg.seed, 1))
    x = split.x.clone()
    x[order[40]] = math.nan  # batch 40 // 16 = 2 of this epoch's order
    net = _net()
    got = train._train_epoch(net, torch.optim.SGD(net.parameters(), lr=0.1), Split(x, split.y), cfg, 1, torch.device("cpu"))
    assert got["nonfinite_batch"] == 2


@pytest.mark.parametrize("loss, initial, factor, expected", [
    (5.0, 1.0, 10.0, False), (10.0, 1.0, 10.0, False), (10.5, 1.0, 10.0, True),  # above factor × untrained
    (100.0, 1.0, 0.0, False),  # the rule off
    (math.inf, 1.0, 0.0, True), (math.nan, 1.0, 10.0, True),  # non-finite always
    (3.0, None, 2.0, False),  # no untrained loss recorded: only finiteness is checked
])
def test_divergence_rule(loss, initial, factor, expected):
    assert train.diverged(loss, initial, factor) is expected


def test_selection_ties_go_to_the_later_epoch_and_hardened_epochs_win():
    best = {"value": 0.8, "hardened": False}
    assert train._selects("best_val", "accuracy", 0.8, False, best)  # a tie: the later, more hardened epoch
    assert not train._selects("best_val", "accuracy", 0.79, False, best)
    assert train._selects("best_val", "perplexity", 0.79, False, best)  # lower is better
    assert train._selects("best_hardened", "accuracy", 0.1, True, best)  # the first hardened epoch wins outright
    assert not train._selects("best_hardened", "accuracy", 0.99, False, {"value": 0.1, "hardened": True})
    assert train._selects("last", "accuracy", 0.0, False, best)


def test_a_variant_ends_at_its_records_lambda_target(tmp_path):
    """train_variant over both phases: the last epoch's λ is the record's λ_target, the history covers every epoch."""
    from pipeline import variant_record as records
    from pipeline.rundir import RunDir
    from tests._digits import digits

    cfg = Config(name="loop", out_dir=str(tmp_path), variants=["lambda_gelu"], device="cpu", threads=1)
    cfg.data.name = "digits"
    cfg.model.hidden = [8]
    cfg.train.epochs = 4
    run = RunDir.create(cfg)
    run.record_variants({"lambda_gelu": records.decide("lambda_gelu", cfg.harden, cfg.train)})
    record = run.variant("lambda_gelu")
    histories: dict = {}
    ds = copy.copy(digits())
    for phase_end, harden in ((record.switch_epoch, False), (cfg.train.epochs, True)):
        out = train.train_variant(cfg, run, ds, "lambda_gelu", record, phase_end, harden, histories, torch.device("cpu"),
                                  log=lambda msg: None)
    assert [r["epoch"] for r in histories["lambda_gelu"]] == [1, 2, 3, 4]
    assert [r["phase"] for r in histories["lambda_gelu"]] == ["learn", "anneal", "anneal", "anneal"]
    assert out["lambdas"] == [pytest.approx(record.lambda_target, rel=1e-6)]  # one gate layer; float32 λ buffers
    assert record.lambda_target == pytest.approx(2 / (cfg.harden.epsilon * math.sqrt(2 * math.pi)), rel=1e-12)
