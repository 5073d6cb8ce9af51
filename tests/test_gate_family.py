"""Adding a gate family is one registration (`pipeline.gates.register`): a family the project has never seen,
x·tanh(e^{λx}) (TanhExp, Liu & Di 2020, with a λ), registered in the test and run through every stage of a digits
pipeline run: trained and annealed to its own λ_target, checked against its own constants, certified, swapped,
exported, quantized, pruned, verified through its ONNX pattern and reported.

The family's numbers are checked against references computed here independently of `pipeline.gates`: its
constants a and c by mpmath at 30 digits, its inflection points by a dense float64 scan of F'', its relaxation by
dense sampling of F on random intervals (one side at a time).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import mpmath
import pytest
import torch
from scipy import special

from pipeline import gates
from pipeline.activations import ACTIVATIONS
from pipeline.cli import main

ROOT = Path(__file__).resolve().parent.parent
NAME, ACTIVATION = "tanhexp", "lambda_tanhexp"
EPSILON = 5e-3  # the digits-tiny config's harden.epsilon (the default)
CONSTANT_RTOL = 1e-9  # the family's a and c (scipy quadrature, a bounded search, nudged 1e-12) against mpmath
INFLECTION_ATOL = 1e-6  # Brent's roots against the sign changes of a float64 scan of step 1e-6
RELAXATION_SLACK = 1e-12  # sampled F below/above the relaxation's lines by at most this (float64 evaluation)
W_CLAMP = 40.0  # e^y is clamped at e^40 inside F' and F'': w·sech²(w) is 0 in float64 long before


def _g(y: torch.Tensor) -> torch.Tensor:
    """tanh(e^y), with finite gradients everywhere: e^y is clamped at e^40, where tanh is 1 in float64 already (an
    unclamped e^y overflows float32 at y = 89, and its gradient e^y·sech²(e^y) becomes ∞·0). Traced for ONNX as the
    plain Exp → Tanh, its pattern: onnxruntime's Tanh(∞) is 1."""
    if torch.jit.is_tracing():
        return torch.tanh(torch.exp(y))
    return torch.tanh(torch.exp(y.clamp(max=W_CLAMP)))


def _sym(y):
    import sympy as sp

    return sp.tanh(sp.exp(y))


def _dF(y: torch.Tensor) -> torch.Tensor:  # F'(y) = g + y·e^y·sech²(e^y)
    w = torch.exp(y.clamp(max=W_CLAMP))
    return torch.tanh(w) + y * w / torch.cosh(w) ** 2


def _d2F_sign(y: torch.Tensor) -> torch.Tensor:  # F'' = w·sech²(w)·(2 + y(1 − 2w·tanh w)), w = e^y
    w = torch.exp(y.clamp(max=W_CLAMP))
    return 2.0 + y * (1.0 - 2.0 * w * torch.tanh(w))


TANHEXP = gates.GateFamily(
    NAME, "λ-TanhExp  x·tanh(e^{λx})", _g, _sym,
    upper_tail=lambda u: 2.0 * float(special.expit(-2.0 * math.exp(min(u, 700.0)))),  # 1 − tanh(s) = 2σ(−2s)
    lower_tail=lambda u: math.tanh(math.exp(-u)),
    numeric=True, complement=lambda y: 2.0 * torch.sigmoid(-2.0 * torch.exp(y)),
    relaxation=gates.Relaxation(_dF, _d2F_sign, ((-4.0, -1.0), (0.3, 1.5))),
    onnx=gates.OnnxPattern(("Exp", "Tanh")), hardenable=ACTIVATION)


@pytest.fixture(scope="module")
def registered():
    gates.register(TANHEXP)
    try:
        yield TANHEXP
    finally:
        gates.unregister(NAME)


def _reference_constants() -> tuple[float, float]:
    """(a, c) of x·tanh(e^{λx}) by mpmath at 30 digits: a = ∫t₊ + ∫t₋, c = the larger of the two sides' maxima of
    u·t(u) (each a root of its derivative, started at the best point of a grid)."""
    with mpmath.workdps(30):
        tails = (lambda u: 1 - mpmath.tanh(mpmath.exp(u)), lambda u: mpmath.tanh(mpmath.exp(-u)))
        # the upper tail is below 1e-1000 beyond u = 8 (and mpmath cannot evaluate it at u = 1e10)
        a = mpmath.quad(tails[0], [0, 1, 4, 8]) + mpmath.quad(tails[1], [0, 1, 4, 16, mpmath.inf])

        def peak(t):
            u0 = max((mpmath.mpf(i) / 100 for i in range(1, 1000)), key=lambda u: u * t(u))
            u = mpmath.findroot(lambda v: mpmath.diff(lambda s: s * t(s), v), u0)
            return u * t(u)

        return float(a), float(max(peak(t) for t in tails))


def test_one_registration_makes_the_family_known_everywhere(registered):
    from analysis.verification.ops.gates import SMOOTH_GATES
    from analysis.verification.readers import gate_patterns

    spec = ACTIVATIONS[ACTIVATION]
    assert spec.hardenable and spec.gate == NAME and ACTIVATIONS[f"linked_{ACTIVATION}"].expansion == 2
    assert NAME in SMOOTH_GATES and gate_patterns()[("Exp", "Tanh")].name == NAME
    a, c = _reference_constants()
    assert gates.gate_bounds(NAME).gate_l1 == pytest.approx(a, rel=CONSTANT_RTOL)
    assert gates.sup_constant(NAME) == pytest.approx(c, rel=CONSTANT_RTOL) and gates.sup_constant(NAME) >= c
    y = torch.arange(-10.0, 10.0, 1e-6, dtype=torch.float64)
    s = _d2F_sign(y)
    scan = y[:-1][(s[:-1] * s[1:]) < 0]
    assert scan.numel() == 2 and torch.allclose(torch.tensor(gates.inflections(NAME), dtype=torch.float64), scan,
                                                rtol=0, atol=INFLECTION_ATOL)


def test_the_new_familys_relaxation_is_sound_by_dense_sampling(registered):
    from analysis.verification.ops.gates import SMOOTH_GATES, default_slopes, intercepts

    gate = SMOOTH_GATES[NAME]
    gen = torch.Generator().manual_seed(0)
    centre = 8 * torch.rand(256, generator=gen, dtype=torch.float64) - 5
    width = torch.rand(256, generator=gen, dtype=torch.float64) * 4
    L, U = centre - width / 2, centre + width / 2
    lo_slope, up_slope = default_slopes(gate, L, U)
    lo, _ = intercepts(gate, L, U, lo_slope)
    _, hi = intercepts(gate, L, U, up_slope)
    t = torch.linspace(0, 1, 2001, dtype=torch.float64)[:, None]
    y = L + t * (U - L)
    F = gate.F(y)
    assert float((lo_slope * y + lo - F).max()) <= RELAXATION_SLACK  # the lower line stays below F
    assert float((F - (up_slope * y + hi)).max()) <= RELAXATION_SLACK  # the upper line above


@pytest.fixture(scope="module")
def family_run(registered, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("family")
    args = ["run", "-c", str(ROOT / "configs" / "digits-tiny.toml"), f"out_dir={out}", "name=fam", "threads=1",
            f"variants={ACTIVATION}", "model.hidden=[16]", "train.epochs=4", "train.switch_fraction=0.5",
            "check.float32_jacobian_samples=64", "quantize.repeats=1", "quantize.timing_blocks=1",
            "quantize.throughput_batch=16", "quantize.calibration_samples=128", "quantize.sqnr_samples=16",
            "export.check_samples=64", "verify.samples=2", "verify.epsilons=[0.01]", "verify.budget_s=10",
            "verify.int8_budget_s=5"]
    assert main(args) == 0
    return out / "fam"


def test_a_registered_family_runs_through_every_stage(family_run):
    run = family_run
    manifest = json.loads((run / "manifest.json").read_text())
    assert all(st["status"] == "done" for st in manifest["stages"].values()), manifest["stages"]
    record = manifest["variants"][ACTIVATION]
    a, _ = _reference_constants()
    assert record["gate"] == NAME and record["lambda_target"] == pytest.approx(a / EPSILON, rel=CONSTANT_RTOL)
    # train + harden: every gate annealed to the family's own λ_target (float32 storage of λ)
    last = [r for r in (run / "train" / "metrics.csv").read_text().splitlines()][-1].split(",")
    header = (run / "train" / "metrics.csv").read_text().splitlines()[0].split(",")
    lams = [float(v) for k, v in zip(header, last) if k.startswith("lambda_") and v]
    assert lams and all(v == pytest.approx(record["lambda_target"], rel=1e-6) for v in lams)
    # check: the family's sympy/mpmath derivations, its c in the sup verdict, and a sound certificate
    bounds = json.loads((run / "check" / "bounds.json").read_text())
    assert NAME in bounds["symbolic"]["gates"]
    layers = bounds["variants"][ACTIVATION]["layers"]
    assert layers and all(l["gate"] == NAME and l["checks"]["sup"]["pass"] for l in layers)
    assert all(l["c"] == gates.sup_constant(NAME) for l in layers)
    cert = bounds["variants"][ACTIVATION]["certificate"]
    assert all(cert[k].get("status") != "violated" and cert[k].get("pass", True) for k in ("float32", "float32_global"))
    # swap and export: ReLU after the swap; the smooth graph carries the family's ONNX pattern and passes its check
    swap = json.loads((run / "swap" / "swap.json").read_text())
    assert ACTIVATION in swap
    export = json.loads((run / "export" / "export.json").read_text())["models"][ACTIVATION]
    assert {"Exp", "Tanh"} <= set(export["smooth"]["ops"]) and "Relu" in export["relu"]["ops"]
    assert export["smooth"]["torch_bound_ratio"] <= 1 and export["smooth"]["ort_bound_ratio"] <= 1
    # int8, sparsity: the swapped model went through both
    assert (run / "quantize" / ACTIVATION).is_dir() and (run / "sparsity" / "sparsity.json").is_file()
    # verify: the engine read the smooth graph as gates of this family (its λ) and answered every property
    verify = json.loads((run / "verify" / "summary.json").read_text())
    smooth = verify["smooth_models"][ACTIVATION]
    assert smooth["network"] and all(v == pytest.approx(record["lambda_target"], rel=1e-6) for v in smooth["mean_lambda_per_layer"])
    with open(run / "verify" / "smooth.csv") as f:
        rows = list(csv.DictReader(f))
    routes = {r["route"] for r in rows}
    assert routes == {"direct", "via-relu"} and all(r["result"] in ("unsat", "sat", "timeout", "unknown") for r in rows), rows
    assert any(r["route"] == "direct" and r["result"] == "unsat" for r in rows)  # decided through the family's relaxation
    report = (run / "report" / "report.md").read_text()
    assert ACTIVATION in report and NAME in report
