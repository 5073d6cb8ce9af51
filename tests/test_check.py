"""The per-layer empirical check: streamed statistics equal a direct computation, verdicts are right."""

import math

import pytest
import torch
from torch import nn

from analysis.check import empirical_check
from pipeline.activations import gate_sites
from pipeline.activations import GELU, LambdaGELU
from pipeline.data import Split
from pipeline.gates import gate_bounds

SUP_GAP_C = gate_bounds("phi").sup

STREAM_RTOL = 1e-10  # streamed float64 sums vs one-shot sums over the same values
PRED_RTOL = 0.05  # p̂(0)·closed form vs empirical mean, for smooth N(0, 1) pre-activations at λ = 160
EPS = 5e-3


def _net(lam: float | None):
    torch.manual_seed(0)
    act = GELU() if lam is None else LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1)
    if lam is not None:
        act.freeze(torch.tensor([lam]))
    return nn.Sequential(nn.Identity(), act, nn.Linear(64, 3))


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
    net = _net(lam)
    layers = empirical_check(net, Split(x, torch.zeros(3000, dtype=torch.long)), 256, "cpu", EPS, 1e-3, 3.0, 1e-9)
    assert len(layers) == 1 and layers[0]["n_preactivations"] == x.numel()
    ref = _direct(x, lam or 1.0)
    for k, v in ref.items():
        assert layers[0][k] == pytest.approx(v, rel=STREAM_RTOL, abs=1e-15), k
    assert layers[0]["max_gap"] <= SUP_GAP_C / (lam or 1.0) * (1 + 1e-9)
    assert layers[0]["checks"]["sup"]["pass"]


def test_closed_form_prediction_and_verdicts():
    torch.manual_seed(2)
    x = torch.randn(20000, 64)
    split = Split(x, torch.zeros(len(x), dtype=torch.long))
    hard = empirical_check(_net(160.0), split, 4096, "cpu", EPS, 1e-3, 3.0, 1e-9)[0]
    # N(0,1) density at 0 is 1/√(2π): the empirical means follow p(0)·E∞(λ) and p(0)/(2λ²).
    assert hard["gate_error"] == pytest.approx(hard["gate_error_predicted"], rel=PRED_RTOL)
    assert hard["gate_error"] == pytest.approx(2 / (160 * math.sqrt(2 * math.pi)) / math.sqrt(2 * math.pi), rel=PRED_RTOL)
    assert hard["mean_gap"] == pytest.approx(hard["mean_gap_predicted"], rel=PRED_RTOL)
    assert hard["pass"] and hard["checks"]["gate_l1"]["pass"]
    soft = empirical_check(_net(None), split, 4096, "cpu", EPS, 1e-3, 3.0, 1e-9)[0]
    assert soft["gate_error"] > 0.1 and not soft["checks"]["gate_l1"]["pass"] and not soft["pass"]
    assert soft["checks"]["sup"]["pass"]  # the sup bound c/λ holds at λ = 1 too


def test_gate_sites_skip_relu():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), GELU(), LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1))
    assert [n for n, _ in gate_sites(net)] == ["2", "3"]


def test_swap_certificate_is_sound_and_certifies_hardened_nets():
    from analysis.check import swap_certificate

    torch.manual_seed(3)
    lam = 160.0
    gates = [LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1) for _ in range(2)]
    for g in gates:
        g.freeze(torch.tensor([lam]))
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), gates[0], nn.Linear(32, 32), gates[1], nn.Linear(32, 4))
    x = torch.rand(500, 1, 4, 4)
    cert = swap_certificate(net, Split(x, torch.zeros(500, dtype=torch.long)), 128, (1, 4, 4))
    assert cert["sound_on_split"] and cert["measured_max_logit_change"] <= cert["bound_max"]
    assert cert["max_excess_over_per_sample_bound"] <= 1e-5  # float32 rounding only
    assert cert["certified_fraction"] <= cert["certified_fraction_per_sample"] <= 1.0
    assert cert["certified_fraction_per_sample"] > 0.9  # at λ = 160 almost every prediction is provably kept


def test_analyze_command_writes_tables(tmp_path, capsys):
    from pipeline.cli import main

    assert main(["analyze", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "analysis.md").read_text()
    import json

    rows = json.loads((tmp_path / "analysis.json").read_text())["claims"]
    wrong = {r["statement"] for r in rows if r["verdict"] == "wrong"}
    assert any("e/√(2π)" in s for s in wrong) and any("GELU(x) ≤ x" in s for s in wrong)
    assert "| lambda_gelu_160 |" in md and "| gelu |" in md and "1.128904" in md
