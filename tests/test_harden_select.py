"""Algorithm 1 as a library object (`pipeline.hardener.Hardener`) and the checkpoint it selects (`harden.select`,
`harden.method`, `harden.hold`): the schedule, its state across a checkpoint, and a selection that cannot
silently skip hardening.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline import checkpoint
from pipeline.activations import LambdaGELU, LambdaSwish, hardenable_gates
from pipeline.cli import main
from pipeline.config import GateConfig, HardenConfig, ModelConfig
from pipeline.gates import lambda_target
from pipeline.hardener import HARDENED_RTOL, Hardener
from pipeline.models import build_model, make_spec

ROOT = Path(__file__).resolve().parent.parent
TINY = ["-c", str(ROOT / "configs" / "digits-tiny.toml"), "stages=train,harden,swap"]
LAMBDA_RTOL = 1e-6  # λ stored in float32 buffers


def _model(activation: str = "lambda_gelu") -> nn.Module:
    from _digits import digits

    torch.manual_seed(0)
    return build_model(make_spec(ModelConfig(name="mlp", hidden=[16, 16]), activation, GateConfig(), digits().info))


def test_schedule_learns_then_anneals_each_family_to_its_own_target():
    net = nn.Sequential(nn.Linear(3, 4), LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1), nn.Linear(4, 4),
                        LambdaSwish(nn.Parameter(torch.zeros(1)), 0.1))
    h = Hardener(net, epochs=8, switch_fraction=0.25)
    assert h.targets == [lambda_target(5e-3, gate="phi"), lambda_target(5e-3, gate="sigmoid")]
    lam0 = h.lambdas()
    assert [h.start_epoch(e) for e in (1, 2)] == ["learn", "learn"] and h.lambdas() == lam0  # λ from s, untouched
    assert h.start_epoch(3) == "anneal" and all(g.frozen for g in h.gates)
    for e in range(3, 9):
        h.start_epoch(e)
        for lam, lam_s, t in zip(h.lambdas(), lam0, h.targets):
            assert lam == pytest.approx(lam_s + (e - 2) / 6 * (t - lam_s), rel=LAMBDA_RTOL)
    assert h.hardened() and h.hardness() == pytest.approx(1.0, rel=LAMBDA_RTOL)


def test_hold_reaches_the_target_early_and_keeps_it():
    h = Hardener(_model(), HardenConfig(hold=3), 10, switch_fraction=0.2)  # the harden section, then T
    assert (h.switch, h.anneal_end) == (2, 7)
    phases = [h.start_epoch(e) for e in range(1, 11)]
    assert phases == ["learn"] * 2 + ["anneal"] * 5 + ["hold"] * 3
    assert h.hardened()


def test_the_harden_section_sets_the_targets():
    h = Hardener(_model(), HardenConfig(epsilon=1e-2), 8)
    assert h.targets == [pytest.approx(2 / (1e-2 * math.sqrt(2 * math.pi)), rel=1e-12)] * len(h.gates)  # E∞ = 2/(λ√(2π)) = ε
    assert Hardener(_model(), HardenConfig(lambda_target=40.0), 8).targets == [40.0] * len(h.gates)
    with pytest.raises(ValueError, match="epochs"):
        Hardener(_model())


def test_in_a_run_the_hardener_reads_e_s_and_the_target_from_the_variants_record():
    """λ_target and e_s are decided once per run (`records.decide`) and read: a record that says otherwise than the
    config (here on purpose) is what the schedule follows, and a record of another gate family is refused."""
    import dataclasses

    from pipeline import variant_record as records
    from pipeline.config import TrainConfig

    record = dataclasses.replace(records.decide("lambda_gelu", HardenConfig(), TrainConfig(epochs=8)),
                                 lambda_target=40.0, switch_epoch=3)
    h = Hardener(_model(), HardenConfig(), 8, record=record)
    assert h.targets == [40.0] * len(h.gates) and h.switch == 3
    assert [h.start_epoch(e) for e in (3, 4)] == ["learn", "anneal"]
    with pytest.raises(ValueError, match="not for this model's 'phi' gates"):
        Hardener(_model(), HardenConfig(), 8, record=dataclasses.replace(record, gate="sigmoid"))


def test_per_step_schedule_ends_each_epoch_where_the_per_epoch_one_is():
    a, b = Hardener(_model(), epochs=6), Hardener(_model(), epochs=6)
    for e in range(1, 7):
        a.start_epoch(e)
        for i in range(5):
            b.start_step(e, i, 5)
            if e > b.switch and i < 4:
                assert b.lambdas()[0] < a.lambdas()[0]  # rises within the epoch
        assert b.lambdas() == pytest.approx(a.lambdas(), rel=LAMBDA_RTOL)


def test_state_dict_resumes_mid_anneal_with_the_same_lambdas():
    net = _model()
    h = Hardener(net, epochs=8)
    for e in range(1, 6):
        h.start_epoch(e)
    saved = {"model": copy.deepcopy(net.state_dict()), "hardener": h.state_dict()}
    h.start_epoch(6)
    expected = h.lambdas()
    net2 = _model()  # a fresh process: new model, new hardener, then the checkpoint
    net2.load_state_dict(saved["model"])
    h2 = Hardener(net2, epochs=8)
    h2.load_state_dict(saved["hardener"])
    h2.start_epoch(6)
    assert h2.lambdas() == expected
    with pytest.raises(ValueError, match="T=8"):
        Hardener(_model(), epochs=9).load_state_dict(saved["hardener"])


def test_param_groups_put_s_at_c_lr_without_weight_decay():
    h = Hardener(_model(), epochs=4, lr_mult=9.0)
    groups = {g["name"]: g for g in h.param_groups(lr=0.1, weight_decay=1e-4)}
    assert groups["hardness"]["lr"] == pytest.approx(0.9) and groups["hardness"]["weight_decay"] == 0.0
    assert {id(p) for p in groups["hardness"]["params"]} == {id(g.s) for g in hardenable_gates(h.model)}


# --------------------------------------------------------------------------------------------------
# Selection in the pipeline


def _payload(run: Path, variant: str = "lambda_gelu") -> dict:
    return checkpoint.load_payload(run / "train" / variant / "best.pt")


def _history(run: Path, variant: str) -> list[dict]:
    with open(run / "train" / "metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r["variant"] == variant]


@pytest.mark.parametrize("select", ["best_val", "best_hardened", "last", "best_swapped"])
def test_each_select_rule_picks_what_it_says(tmp_path, select):
    assert main(["run", *TINY, f"out_dir={tmp_path}", "name=s", f"harden.select={select}", "harden.hold=2"]) == 0
    run = tmp_path / "s"
    rows = _history(run, "lambda_gelu")
    p = _payload(run)
    col = "val_accuracy_swapped" if select == "best_swapped" else "val_accuracy"
    eligible = [r for r in rows if select != "best_hardened" or r["phase"] == "hold"]
    if select == "last":
        assert p["epoch"] == 8
    else:
        best = max(float(r[col]) for r in eligible)
        # ties go to the later (more hardened) epoch
        assert p["epoch"] == max(int(r["epoch"]) for r in eligible if float(r[col]) == best)
    if select in ("best_hardened", "last"):
        assert p["hardened"] and p["hardness"] >= 1 - HARDENED_RTOL


def test_selection_before_annealing_is_warned_and_reported(tmp_path):
    """breast_cancer's validation split has 46 samples: best validation lands before annealing on it (the audit
    saw it on every seed), and the swap then is GELU's. The run must say so, loudly."""
    args = ["run", "-c", str(ROOT / "configs" / "digits-tiny.toml"), f"out_dir={tmp_path}", "name=b", "data.name=breast_cancer",
            "variants=lambda_gelu", "model.hidden=16,16", "train.epochs=12", "train.lr=0.2", "seed=2", "harden.select=best_val",
            "stages=train,harden,swap,report"]  # seed 2, lr 0.2: validation peaks (1.0) at e_s = 3 and not after
    with pytest.warns(RuntimeWarning, match="is not hardened"):
        assert main(args) == 0
    run = tmp_path / "b"
    p = _payload(run)
    assert p["epoch"] <= 3 and not p["hardened"]  # e_s = 3: selected in the learn phase
    m = json.loads((run / "manifest.json").read_text())
    assert "not hardened" in m["stages"]["harden"]["metrics"]["lambda_gelu"]["warning"]
    assert "not hardened" in (run / "report" / "report.md").read_text()
    # best_hardened on the same data cannot skip hardening
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert main([*args[:5], "name=h", *args[6:-1], "harden.select=best_hardened", "harden.hold=2"]) == 0
    assert _payload(tmp_path / "h")["hardened"]


def test_swap_method_fine_tunes_the_relu_network_after_the_switch(tmp_path):
    assert main(["run", *TINY, f"out_dir={tmp_path}", "name=w", "harden.method=swap", "variants=gelu,lambda_gelu"]) == 0
    run = tmp_path / "w"
    for v in ("gelu", "lambda_gelu"):
        assert [r["phase"] for r in _history(run, v)][2:] == ["finetune"] * 6
        last = checkpoint.load_payload(run / "train" / v / "last.pt")
        assert last["spec"]["activation"] == "relu"  # the network trained in the last epochs is the ReLU one
        model, _ = checkpoint.load_model(run / "train" / v / "last.pt")
        assert not any(hasattr(m, "GATE") for m in model.modules())
    swap = json.loads((run / "swap" / "swap.json").read_text())
    for v, r in swap.items():  # a fine-tuned ReLU checkpoint swaps to itself
        if _payload(run, v)["epoch"] > 2:
            assert r["val_before"] == r["val_after"] and r["max_logit_change"] == 0.0
