"""The check stage: streamed statistics equal a direct computation, and every verdict says what it compares
and fails on a realistic input (a GELU layer, a gate that computes with another λ than it reports, a swap
walker that puts LeakyReLU where ReLU belongs); the report never claims what a verdict did not prove."""

import json
import math

import pytest
import torch
from torch import nn

from analysis import bounds_check as check
from pipeline.stages import check as check_stage
from analysis.bounds_check import empirical_check, swap_certificate
from pipeline.activations import GELU, LambdaGELU, gate_sites, lambda_gelu
from pipeline.data import Split
from pipeline.gates import gate_bounds

SUP_GAP_C = gate_bounds("phi").sup
U_PHI = 0.7517915  # argmax of u·Φ(−u) (to 7 digits; enough to land within 1e-6 of the maximum gap)

STREAM_RTOL = 1e-10  # streamed float64 sums vs one-shot sums over the same values
PRED_RTOL = 0.05  # p̂(0)·closed form vs empirical mean, for smooth N(0, 1) pre-activations at λ = 160
DELTA, BAND, SUP_RTOL = 1e-3, 3.0, 1e-9  # the CheckConfig defaults


def _gate(lam: float | None) -> nn.Module:
    if lam is None:
        return GELU()
    g = LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1)
    g.freeze(torch.tensor([lam]))
    return g


class WrongLambda(LambdaGELU):
    """A bug-injected gate: reports λ (gate_of reads .lam) but computes x·Φ(λx/4)."""

    def forward(self, x):
        return lambda_gelu(x, self._lam_for(x) / 4)


def _net(lam: float | None, gate: nn.Module | None = None):
    torch.manual_seed(0)
    return nn.Sequential(nn.Identity(), gate or _gate(lam), nn.Linear(64, 3))


def _split(x: torch.Tensor) -> Split:
    return Split(x, torch.zeros(len(x), dtype=torch.long))


def _direct(x: torch.Tensor, lam: float) -> dict:
    x = x.double()
    phi = 0.5 * torch.erfc(-lam * x / math.sqrt(2))
    gap = (torch.relu(x) - x * phi).abs()
    heav = (x > 0).double()
    return {"mean_gap": float(gap.mean()), "max_gap": float(gap.max()), "gate_error": float((heav - phi).abs().mean()),
            "soft_fraction": float(((phi > 1e-3) & (phi < 1 - 1e-3)).double().mean())}


@pytest.mark.parametrize("lam", [160.0, None])
def test_streamed_stats_equal_direct_computation(lam):
    torch.manual_seed(1)
    x = torch.randn(3000, 64)
    layers = empirical_check(_net(lam), _split(x), 256, "cpu", DELTA, BAND, SUP_RTOL)
    assert len(layers) == 1 and layers[0]["n_preactivations"] == x.numel()
    ref = _direct(x, lam or 1.0)
    for k, v in ref.items():
        assert layers[0][k] == pytest.approx(v, rel=STREAM_RTOL, abs=1e-15), k
    assert layers[0]["max_gap"] <= SUP_GAP_C / (lam or 1.0) * (1 + 1e-9)


def test_predictions_hold_for_a_hardened_layer_and_fail_for_gelu():
    torch.manual_seed(2)
    split = _split(torch.randn(20000, 64))
    hard = empirical_check(_net(160.0), split, 4096, "cpu", DELTA, BAND, SUP_RTOL)[0]
    # N(0,1) density at 0 is 1/√(2π): the empirical means follow p(0)·E∞(λ) and p(0)/(2λ²).
    assert hard["gate_error"] == pytest.approx(hard["gate_error_predicted"], rel=PRED_RTOL)
    assert hard["gate_error"] == pytest.approx(2 / (160 * math.sqrt(2 * math.pi)) / math.sqrt(2 * math.pi), rel=PRED_RTOL)
    assert hard["mean_gap"] == pytest.approx(hard["mean_gap_predicted"], rel=PRED_RTOL)
    assert all(c["pass"] for c in hard["checks"].values()) and check.predictions([hard])["pass"]
    # At λ = 1 the density is not flat over |x| < band/λ = 3: both predictions are off, and say so.
    soft = empirical_check(_net(None), split, 4096, "cpu", DELTA, BAND, SUP_RTOL)[0]
    for name in ("gate_l1", "act_l1"):
        c = soft["checks"][name]
        assert not c["pass"] and c["relative_error"] > c["tolerance"], name
        assert "prediction" in c["rule"] and c["measured"] > 0 and c["predicted"] > 0
    assert soft["checks"]["sup"]["pass"]  # GELU is within c of ReLU: a true statement about that module
    assert not check.predictions([soft])["pass"] and {o["check"] for o in check.predictions([soft])["off"]} == {"gate_l1", "act_l1"}


def test_sup_check_measures_the_module_not_the_formula():
    """λ·max|ReLU − f̂| ≤ c must hold for the module that ships; a gate computing with λ/4 fails it."""
    x = torch.full((8, 64), -U_PHI * 4 / 160.0)  # where the λ/4 gate is farthest from ReLU
    x = torch.cat([x, torch.randn(100, 64)])
    good = empirical_check(_net(160.0), _split(x), 64, "cpu", DELTA, BAND, SUP_RTOL)[0]
    assert good["checks"]["sup"]["pass"]
    bug = WrongLambda(nn.Parameter(torch.zeros(1)), 0.1)
    bug.freeze(torch.tensor([160.0]))
    bad = empirical_check(_net(None, bug), _split(x), 64, "cpu", DELTA, BAND, SUP_RTOL)[0]
    assert bad["lambda_mean"] == pytest.approx(160.0)  # it reports λ = 160 ...
    c = bad["checks"]["sup"]
    assert not c["pass"] and c["measured"] == pytest.approx(4 * SUP_GAP_C, rel=1e-3)  # ... and is 4c/λ from ReLU


def test_gate_sites_skip_relu():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), GELU(), LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1))
    assert [n for n, _ in gate_sites(net)] == ["2", "3"]


def _hardened(lam: float = 160.0) -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 32), _gate(lam), nn.Linear(32, 32), _gate(lam), nn.Linear(32, 4))


def test_certificate_is_sound_and_certifies_hardened_nets():
    x = torch.rand(500, 1, 4, 4)
    cert = swap_certificate(_hardened(), _split(x), 128, x[:1])
    assert cert["global"]["status"] == "sound" and cert["per_sample"]["status"] == "sound"
    for key in ("float32", "float32_global"):
        v = cert[key]
        assert v["status"] == "sound" and v["pass"] and v["violations"] == 0 and v["max_excess"] < 0, key
        assert "measured float32" in v["rule"]
    assert cert["measured_max_logit_change"] <= cert["bound_max"]
    assert cert["float32_global"]["certified_fraction"] <= cert["float32"]["certified_fraction"] <= 1.0
    assert cert["float32"]["certified_fraction"] > 0.9  # at λ = 160 almost every prediction is provably kept


def test_certificate_report_names_the_smallest_slack_and_how_loose_each_bound_is():
    """The float32 line states the smallest slack (it was labelled the largest margin) and the bound-to-change ratio,
    which cannot be below 1 for a bound that held; the real-arithmetic line says it is not a float32 statement."""
    x = torch.rand(300, 1, 4, 4)
    cert = swap_certificate(_hardened(), _split(x), 100, x[:1])
    for key in ("float32", "float32_global"):
        r = cert[key]["bound_to_change"]
        assert 250 <= r["samples"] <= 300 and 1.0 <= r["median"] <= r["max"], (key, r)  # samples the swap changed
    p = cert["per_sample"]  # real arithmetic against a float32 change: no ratio floor, but never tighter than δ̃ + ε̃
    assert p["bound_to_change"]["median"] > 0 and p["top1_kept_in_real_arithmetic"] >= cert["float32"]["certified_fraction"]
    text = "\n".join(check_stage.certificate_lines(cert))
    assert "largest margin" not in text and f"smallest slack, bound minus measured change: {-cert['float32']['max_excess']:.3g}" in text
    assert "× the measured change" in text and "says nothing about float32 runs" in text
    for key in ("float32", "float32_global", "float32_jacobian"):  # what the float32 statements are about, in words
        assert f"- {key} (each" in text and "both networks" in cert["about"][key] and "by PyTorch on the CPU" in cert["about"][key]


def test_certificate_verdict_fails_for_a_gate_that_lies_about_its_lambda():
    """The global bound uses c/λ with the reported λ; a gate computing with λ/4 moves the logits 4× further."""
    bug = WrongLambda(nn.Parameter(torch.zeros(1)), 0.1)
    bug.freeze(torch.tensor([160.0]))
    net = nn.Sequential(nn.Linear(4, 32), bug, nn.Linear(32, 3))
    with torch.no_grad():
        net[0].weight.zero_()
        net[0].bias.fill_(-U_PHI * 4 / 160.0)  # every unit where x·Φ(λx/4) is farthest from ReLU
        net[2].weight.abs_()
    x = torch.randn(64, 4)
    cert = swap_certificate(net, _split(x), 32, x[:1])
    assert cert["float32"]["pass"]  # the per-sample bound uses the module's own outputs: still sound
    g = cert["float32_global"]
    assert g["status"] == "sound" and not g["pass"] and g["violations"] == 64 and g["certified_fraction"] is None
    text = "\n".join(check_stage.certificate_lines(cert))
    assert "float32_global" in text and "**violated** on 64 of 64" in text and "nothing is claimed" in text


def test_certificate_verdict_fails_for_a_swap_that_is_not_relu(monkeypatch):
    """A swap walker bug (LeakyReLU in place of ReLU): the measured change leaves every certified bound."""
    from pipeline.relu_swap import replace_modules

    monkeypatch.setattr(check, "to_relu", lambda m, example=None: replace_modules(m, lambda mod, _: isinstance(mod, LambdaGELU),
                                                                    lambda mod, _: nn.LeakyReLU(0.5)))
    x = torch.rand(300, 1, 4, 4) * 4 - 2
    cert = swap_certificate(_hardened(), _split(x), 100, x[:1])
    for key in ("float32", "float32_global"):
        assert cert[key]["status"] == "sound" and not cert[key]["pass"] and cert[key]["certified_fraction"] is None, key


def test_refusals_are_reported_as_refusals():
    class Sin(nn.Module):
        def forward(self, x):
            return torch.sin(x)

    net = nn.Sequential(nn.Linear(4, 8), _gate(20.0), Sin(), nn.Linear(8, 2))
    x = torch.randn(32, 4)
    cert = swap_certificate(net, _split(x), 32, x[:1])
    for key in ("global", "per_sample", "float32", "float32_global", "float32_jacobian"):
        assert cert[key]["status"] == "refused" and "`sin`" in cert[key]["reason"], key
    assert "bound_max" not in cert  # nothing for readers of the old key either
    text = "\n".join(check_stage.certificate_lines(cert))
    assert "provably" not in text and text.count("refused") == 5


def test_check_stage_on_a_linked_gelu_run(tmp_path):
    """The audit's case end to end: a linked GELU pair is not certified unchanged; the report says what holds."""
    from tests._digits import make_run, trained

    nets = {"linked_gelu": trained("linked_gelu", epochs=3), "lambda_gelu": trained("lambda_gelu", epochs=3, lam=160.0)}
    run = make_run(tmp_path, nets)
    metrics = check_stage.run_check(run.cfg, run)
    b = json.loads(run.file("check", "bounds.json").read_text())
    linked = b["variants"]["linked_gelu"]["certificate"]
    assert linked["global"]["bound_max"] >= linked["measured_max_logit_change"] > 0.01
    assert linked["float32"]["pass"] and linked["float32"]["certified_fraction"] < 1.0
    assert metrics["lambda_gelu"]["certificate"] == {"global": "pass", "float32": "pass", "float32_global": "pass",
                                                     "float32_jacobian": "pass"}
    section = check_stage.report_section(run.cfg, run)
    assert "### `linked_gelu`" in section and "holds on all" in section


def test_analyze_command_writes_tables(tmp_path, capsys):
    from pipeline.cli import main

    assert main(["analyze", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "analysis.md").read_text()
    rows = json.loads((tmp_path / "analysis.json").read_text())["claims"]
    wrong = {r["statement"] for r in rows if r["verdict"] == "wrong"}
    assert any("e/√(2π)" in s for s in wrong) and any("GELU(x) ≤ x" in s for s in wrong)
    assert "| lambda_gelu_160 |" in md and "| gelu |" in md and "1.128904" in md


def test_per_channel_lambda_of_token_inputs_is_checked_on_the_channel_axis():
    """[B, T, C] tokens with a per-channel λ (C ≠ T): the check views λ on the last dim, as the gate does; a gate
    whose λ differs per channel gets each channel's own bound."""
    torch.manual_seed(4)
    T, C = 5, 8
    g = LambdaGELU(nn.Parameter(torch.zeros(C)), 0.1)
    lam = torch.linspace(20.0, 160.0, C)
    g.freeze(lam)
    x = torch.randn(200, T, C)
    layer = empirical_check(nn.Sequential(g), _split(x), 64, "cpu", DELTA, BAND, SUP_RTOL)[0]
    ref = (torch.relu(x.double()) - x.double() * 0.5 * torch.erfc(-lam.double() * x.double() / math.sqrt(2))).abs()
    assert layer["mean_gap"] == pytest.approx(float(ref.mean()), rel=STREAM_RTOL)  # λ per channel on dim 2
    assert layer["checks"]["sup"]["pass"] and layer["sup_bound"] == pytest.approx(SUP_GAP_C / 20.0)


@pytest.mark.slow
def test_deit_with_per_channel_lambda_passes_the_check_stage(tmp_path):
    """The run that crashed in the check stage (λ viewed on dim 1 of [B, T, C] tokens), end to end."""
    from pathlib import Path

    from pipeline.cli import main

    cfg = Path(__file__).resolve().parent.parent / "configs" / "digits-tiny.toml"
    assert main(["run", "-c", str(cfg), f"out_dir={tmp_path}", "name=deit", "model.name=deit_tiny", "model.patch_size=2",
                 "model.dim=32", "model.depth=2", "model.heads=2", "gate.granularity=channel", "stages=train,harden,check",
                 "train.epochs=2", "threads=1", "device=cpu"]) == 0
    b = json.loads((tmp_path / "deit" / "check" / "bounds.json").read_text())
    layers = b["variants"]["lambda_gelu"]["layers"]
    assert len(layers) == 2 and all(l["checks"]["sup"]["pass"] for l in layers)
