"""Whole-step CUDA graphs in the train loop (`pipeline.step_graph`): the same training as eager launches, captured
again only when what a capture bakes in changes; and the reasons a run trains eagerly."""

from __future__ import annotations

import copy

import pytest
import torch

from pipeline import distributed, step_graph
from pipeline.activations import hardenable_gates
from pipeline.config import Config, apply_overrides
from pipeline.data import Split, dataset_for
from pipeline.hardener import Hardener
from pipeline.models import build_model, make_spec
from pipeline.schedule import lr_at, param_groups
from pipeline.train_loop import OPTIMIZERS, EpochSums, _train_epoch, fused_optimizer, graph_unavailable

ADAMW_RTOL = 1e-5  # capturable AdamW: step count and bias corrections in float32 on the device, not Python floats
EPOCHS = 4


def _cfg(*over: str) -> Config:
    return apply_overrides(Config(), ["data.name=digits", "model.hidden=[32,32]", "data.batch_size=64",
                                      f"train.epochs={EPOCHS}", "train.switch_fraction=0.5", *over])


def _train(cfg: Config, graphs_on: bool, device: str = "cuda"):
    """EPOCHS epochs of Algorithm 1 (learn, then anneal) through the train loop; (model, per-epoch stats, graphs)."""
    dev = torch.device(device)
    ds = dataset_for(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(make_spec(cfg.model, "lambda_gelu", cfg.gate, ds.info)).to(dev)
    hardener = Hardener(model, cfg.harden, cfg.train.epochs, switch_fraction=cfg.train.switch_fraction)
    opt = OPTIMIZERS[cfg.train.optimizer](param_groups(model, cfg.train.lr, cfg.train.weight_decay, cfg.gate.lr_mult),
                                          cfg.train, graphs_on, fused_optimizer(model, dev))
    split = Split(ds.train.x.to(dev), ds.train.y.to(dev))
    graphs = step_graph.GraphSteps(split.x, split.y, cfg.data.batch_size, EpochSums(dev)) if graphs_on else None
    stats = []
    for epoch in range(1, cfg.train.epochs + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(epoch, cfg.train.epochs, cfg.train.lr, cfg.train.schedule) * group["lr_mult"]
        hardener.start_epoch(epoch)
        stats.append(_train_epoch(model, opt, split, cfg, epoch, dev, hardener=hardener, graphs=graphs))
    return model, stats, graphs


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _assert_same(a: torch.nn.Module, b: torch.nn.Module, rtol: float = 0.0) -> None:
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        if rtol == 0.0:
            assert torch.equal(p, q), f"{name}: max |Δ| {float((p.double() - q.double()).abs().max()):.3g}"
        else:
            torch.testing.assert_close(p, q, rtol=rtol, atol=rtol, msg=f"{name}")


@pytest.mark.cuda
@cuda
def test_sgd_replays_give_the_eager_bits():
    """SGD (the default): the replayed kernels are the eager step's own, so weights, λ and the epoch's numbers are equal."""
    cfg = _cfg()
    eager, s_eager, _ = _train(cfg, False)
    graphed, s_graph, graphs = _train(cfg, True)
    _assert_same(graphed, eager)
    assert s_graph == s_eager
    # the cosine schedule changes the learning rate every epoch: one capture per epoch, the first after the warm-up
    assert graphs.captures == EPOCHS and graphs.warm == step_graph.WARMUP


@pytest.mark.cuda
@cuda
def test_a_constant_learning_rate_captures_once_per_phase():
    """λ's anneal writes the frozen buffer in place: no capture per epoch; the switch to frozen λ captures again."""
    cfg = _cfg("train.schedule=constant")
    eager, s_eager, _ = _train(cfg, False)
    graphed, s_graph, graphs = _train(cfg, True)
    _assert_same(graphed, eager)
    assert graphs.captures == 2  # learn, anneal
    lam = [float(g.lam.mean()) for g in hardenable_gates(graphed)]
    assert lam == [float(g.lam.mean()) for g in hardenable_gates(eager)] and min(lam) > 100  # annealed to λ_target


@pytest.mark.cuda
@cuda
def test_adamw_and_the_step_schedule_stay_within_rounding_of_eager():
    cfg = _cfg("train.optimizer=adamw", "train.lr=0.003", "harden.schedule=step", "train.grad_clip=1.0")
    eager, s_eager, _ = _train(cfg, False)
    graphed, s_graph, _ = _train(cfg, True)
    _assert_same(graphed, eager, ADAMW_RTOL)
    for a, b in zip(s_graph, s_eager):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=ADAMW_RTOL)


@pytest.mark.cuda
@cuda
def test_a_pipeline_run_records_the_graphed_path(tmp_path):
    from pipeline import runner

    cfg = _cfg("variants=lambda_gelu", "stages=train,harden", f"out_dir={tmp_path}", "name=g", "device=cuda")
    run = runner.create(cfg)
    out = runner.run_pipeline(cfg, run, log=lambda m: None)
    assert out["train"]["lambda_gelu"]["training_path"].startswith("cuda_graph")
    assert out["harden"]["lambda_gelu"]["training_path"].startswith("cuda_graph")


def test_reasons_for_eager_training():
    """Where whole-step graphs cannot run, the loop trains eagerly and says why (recorded per variant)."""
    cpu = torch.device("cpu")
    split = Split(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    world = distributed.World()
    assert graph_unavailable(_cfg(), cpu, world, split) == "not on CUDA"
    assert graph_unavailable(_cfg("train.cuda_graph=off"), cpu, world, split) == "train.cuda_graph=off"
    gpu = torch.device("cuda", 0)
    assert "memory" in graph_unavailable(_cfg(), gpu, world, split)  # the split stayed in host memory
    why = step_graph.unavailable(gpu, False, True, "flip_crop", False)
    assert "augment" in why
    assert "DDP" in step_graph.unavailable(gpu, True, True, "none", False)
    assert "compile" in step_graph.unavailable(gpu, False, True, "none", True)
    assert step_graph.unavailable(gpu, False, True, "none", False) is None


def test_eager_runs_record_their_path(tmp_path):
    from pipeline import runner

    cfg = _cfg("variants=lambda_gelu", "stages=train", f"out_dir={tmp_path}", "name=e", "device=cpu",
               "train.epochs=2")
    run = runner.create(cfg)
    out = runner.run_pipeline(cfg, run, log=lambda m: None)
    assert out["train"]["lambda_gelu"]["training_path"] == "eager (not on CUDA)"


def test_the_capture_key_names_what_a_capture_bakes_in():
    model = build_model(make_spec(_cfg().model, "lambda_gelu", _cfg().gate, dataset_for(_cfg()).info))
    opt = torch.optim.SGD(param_groups(model, 0.1, 0.0, 9.0), lr=0.1)
    k0 = step_graph.capture_key(model, opt)
    opt.param_groups[0]["lr"] = 0.05
    k1 = step_graph.capture_key(model, opt)
    for g in hardenable_gates(model):
        g.freeze(torch.tensor(3.0))
    k2 = step_graph.capture_key(model, opt)
    g = hardenable_gates(model)[0]
    g.freeze(torch.tensor(7.0))  # a new λ value is read from the buffer: same key
    k3 = step_graph.capture_key(model, opt)
    assert len({k0, k1, k2}) == 3 and k3 == k2
    other = copy.deepcopy(model)
    opt2 = torch.optim.SGD(param_groups(other, 0.05, 0.0, 9.0), lr=0.05)
    assert step_graph.capture_key(other, opt2)[2] != k3[2]  # other parameters: captured again, after a warm-up
