"""Activation property table: values against the symbolic derivations and known closed forms, and
the numeric-only path against the sympy path."""

from __future__ import annotations

import math

import pytest
import sympy as sp
import torch

from analysis.theory import properties as P
from analysis.theory import symbolic as S

VALUE_TOL = 1e-10  # sympy-polished minima and Lipschitz constants
NUMERIC_TOL = 1e-7  # grid + Brent refinement only
C = float(S.sup_constant("phi").c)
U = float(S.sup_constant("phi").u)
L = float(S.lipschitz_constant("phi").value)


@pytest.fixture(scope="module")
def table() -> dict[str, dict]:
    return {r["name"]: r for r in P.property_table()}


def test_every_default_activation_has_a_row(table):
    assert set(table) == set(P.default_activations())
    assert all(r["method"] == "sympy+numeric" for r in table.values())


@pytest.mark.parametrize("lam", P.LAMBDA_GRID)
def test_lambda_gelu_rows_match_symbolic(table, lam):
    r = table[f"lambda_gelu_{lam}"]
    assert r["inf"] == pytest.approx(-C / lam, abs=VALUE_TOL / lam)
    assert r["argmin"] == pytest.approx(-U / lam, abs=VALUE_TOL)
    assert r["lipschitz"] == pytest.approx(L, abs=VALUE_TOL)  # the same for every λ
    assert r["lipschitz_at"] == pytest.approx(math.sqrt(2) / lam, abs=VALUE_TOL)
    assert r["min_slope"] == pytest.approx(1 - L, abs=1e-9)
    assert not r["monotone"]
    assert (r["limit_neg"], r["limit_pos"]) == (0.0, math.inf)
    assert r["smoothness"] == "C∞"


def test_gelu_equals_lambda_gelu_1(table):
    for key in ("inf", "argmin", "lipschitz", "lipschitz_at", "min_slope"):
        assert table["gelu"][key] == pytest.approx(table["lambda_gelu_1"][key], abs=1e-12)


def test_piecewise_rows(table):
    relu = table["relu"]
    assert relu["inf"] == 0.0 and relu["min_attained"] and relu["argmin_set"] == "x ≤ 0"
    assert relu["lipschitz"] == 1.0 and relu["lipschitz_at"] is None and relu["monotone"]
    assert relu["smoothness"] == "C0" and relu["kinks"] == [0.0]
    leaky = table["leaky_relu"]
    assert leaky["inf"] == -math.inf and leaky["limit_neg"] == -math.inf and leaky["min_slope"] == pytest.approx(0.01)
    elu = table["elu"]
    assert elu["inf"] == -1.0 and not elu["min_attained"] and elu["smoothness"] == "C1"
    selu = table["selu"]
    assert selu["smoothness"] == "C0"
    assert selu["lipschitz"] == pytest.approx(P.SELU_SCALE * P.SELU_ALPHA, rel=1e-12)  # slope at 0⁻
    assert selu["inf"] == pytest.approx(-P.SELU_SCALE * P.SELU_ALPHA, rel=1e-12)
    hs = table["hardswish"]
    assert hs["inf"] == pytest.approx(-0.375, abs=1e-12) and hs["argmin"] == pytest.approx(-1.5, abs=1e-6)
    assert hs["lipschitz"] == pytest.approx(1.5, abs=1e-6) and hs["min_slope"] == pytest.approx(-0.5, abs=1e-6)
    assert hs["smoothness"] == "C0" and hs["kinks"] == [-3.0, 3.0]


def test_smooth_rows(table):
    sp_ = table["softplus"]
    assert sp_["inf"] == 0.0 and not sp_["min_attained"] and sp_["monotone"] and sp_["smoothness"] == "C∞"
    silu = table["silu"]  # SiLU = x·σ(x): the sigmoid gate at λ = 1
    assert silu["inf"] == pytest.approx(-float(S.sup_constant("sigmoid").c), abs=VALUE_TOL)
    assert silu["lipschitz"] == pytest.approx(float(S.lipschitz_constant("sigmoid").value), abs=VALUE_TOL)
    assert table["serf"]["inf"] == pytest.approx(-0.348437, abs=5e-7)
    assert table["mish"]["inf"] == pytest.approx(-0.308843, abs=5e-7)
    for name in ("serf", "mish", "silu", "gelu_tanh"):
        assert table[name]["smoothness"] == "C∞" and not table[name]["monotone"]


def test_rows_hold_on_samples(table):
    """Each row is a bound: f ≥ inf and |f'| ≤ Lipschitz on 1e5 samples (one side each)."""
    acts = P.default_activations()
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(100_000, generator=g, dtype=torch.float64) * 3, torch.linspace(-20, 20, 40_001, dtype=torch.float64)])
    for name, fn in acts.items():
        r = table[name]
        xx = x.clone().requires_grad_(True)
        y = fn(xx)
        (d,) = torch.autograd.grad(y.sum(), xx)
        assert y.min().item() >= r["inf"] - 1e-12, name
        assert d.abs().max().item() <= r["lipschitz"] + 1e-9, name
        assert (d.min().item() >= -P.MONO_TOL) == r["monotone"], name


NUMERIC_SUBSET = ("relu", "elu", "hardswish", "gelu", "serf", "lambda_gelu_160")


def test_numeric_path_agrees_with_sympy_path(table):
    acts = P.default_activations()
    rows = {r["name"]: r for r in P.property_table({k: acts[k] for k in NUMERIC_SUBSET}, sympy_forms={})}
    for name, r in rows.items():
        s = table[name]
        assert r["method"] == "numeric"
        for key in ("inf", "lipschitz", "min_slope", "limit_neg", "limit_pos"):
            assert r[key] == pytest.approx(s[key], abs=NUMERIC_TOL), (name, key)
        if s["argmin"] is not None:
            assert r["argmin"] == pytest.approx(s["argmin"], abs=1e-6), name
        assert r["monotone"] == s["monotone"]
        if s["smoothness"] == "C∞":
            assert r["smoothness"] == f"C≥{P.K_MAX} (numeric)"
        else:
            assert r["smoothness"] == s["smoothness"] and r["kinks"] == pytest.approx(s["kinks"], abs=1e-6), name


def test_accepts_any_dict_of_callables():
    rows = P.property_table({"swish2": lambda x: x * torch.sigmoid(2 * x)}, sympy_forms={})
    (r,) = rows
    assert r["inf"] == pytest.approx(-float(S.sup_constant("sigmoid").c) / 2, abs=NUMERIC_TOL)


def test_wrong_sympy_form_is_rejected():
    with pytest.raises(ValueError, match="disagrees"):
        P.activation_properties("gelu", torch.nn.functional.gelu, lambda x: x / (1 + sp.exp(-x)))


def test_render_markdown(table):
    md = P.render_markdown(list(table.values()))
    lines = md.strip().splitlines()
    assert len(lines) == 2 + len(table)
    assert lines[0].startswith("| activation |")
    assert "| relu | 0 | x ≤ 0 | 1 |" in md
    assert "−∞" in md and "C∞" in md
    assert all(isinstance(v, str) or not (isinstance(v, float) and not math.isfinite(v)) for r in P.jsonable(list(table.values())) for v in r.values())


# ---------------------------------------------------------------------------------------------
# The registry's other activations: algebraic tails and discontinuities

LIMIT_ABS = 1e-9  # extrapolated limits of algebraic tails, sampled out to |x| = 1e12


def _registry_rows(*names: str) -> dict[str, dict]:
    from pipeline.activations import ACTIVATIONS, GateContext
    from pipeline.config import GateConfig

    fns = {}
    for n in names:
        with torch.no_grad():
            m = ACTIVATIONS[n].build(GateContext(1, 0, 1, GateConfig(), {})).double().eval()
        fns[n] = lambda x, m=m: m(x)
    return {r["name"]: r for r in P.property_table(fns, sympy_forms={})}


def test_algebraic_tails_have_their_limits():
    """softsign = x/(1 + |x|) tends to ±1 only like 1/x: the table showed nan for its limits and infimum."""
    rows = _registry_rows("softsign", "tanh", "sigmoid", "logsigmoid", "relu6")
    ss = rows["softsign"]
    assert ss["limit_neg"] == pytest.approx(-1.0, abs=LIMIT_ABS) and ss["limit_pos"] == pytest.approx(1.0, abs=LIMIT_ABS)
    assert ss["inf"] == pytest.approx(-1.0, abs=LIMIT_ABS) and not ss["min_attained"]
    assert ss["lipschitz"] == pytest.approx(1.0, abs=NUMERIC_TOL) and ss["lipschitz_at"] == 0.0 and ss["monotone"]
    assert ss["smoothness"] == "C1" and ss["kinks"] == [0.0]  # f'' = ∓2/(1 + |x|)³ jumps at 0
    assert (rows["tanh"]["limit_neg"], rows["tanh"]["limit_pos"]) == (-1.0, 1.0)
    assert (rows["sigmoid"]["limit_neg"], rows["sigmoid"]["limit_pos"]) == (0.0, 1.0)
    assert (rows["logsigmoid"]["limit_neg"], rows["logsigmoid"]["limit_pos"]) == (-math.inf, 0.0)
    assert (rows["relu6"]["limit_neg"], rows["relu6"]["limit_pos"]) == (0.0, 6.0)
    # a slower tail with an offset: 2 + 1/√(1 + x²) → 2 like 1/|x|; x/√(1 + x²) → ±1 like 1/x²
    r = {x["name"]: x for x in P.property_table({"offset": lambda x: 2 + 1 / torch.sqrt(1 + x**2),
                                                  "isru": lambda x: x / torch.sqrt(1 + x**2)}, sympy_forms={})}
    assert r["offset"]["limit_pos"] == pytest.approx(2.0, abs=LIMIT_ABS) and r["offset"]["inf"] == pytest.approx(2.0, abs=LIMIT_ABS)
    assert (r["isru"]["limit_neg"], r["isru"]["limit_pos"]) == (pytest.approx(-1.0, abs=LIMIT_ABS), pytest.approx(1.0, abs=LIMIT_ABS))


def test_a_discontinuous_activation_is_not_lipschitz():
    """hardshrink jumps by 0.5 at ±0.5: |f(a) − f(b)|/|a − b| is unbounded, whatever f' is elsewhere."""
    rows = _registry_rows("hardshrink", "softshrink")
    hs = rows["hardshrink"]
    assert hs["smoothness"] == "discontinuous" and hs["kinks"] == pytest.approx([-0.5, 0.5], abs=1e-6)
    assert hs["lipschitz"] == math.inf and hs["lipschitz_at"] is None
    assert "not Lipschitz" in hs["lipschitz_note"] and "-0.5" in hs["lipschitz_note"]
    md = P.render_markdown([hs, rows["softshrink"]])
    assert "| hardshrink | −∞ | not attained | not Lipschitz: discontinuous at -0.5, 0.5 |" in md
    assert rows["softshrink"]["lipschitz"] == pytest.approx(1.0, abs=NUMERIC_TOL)  # continuous: 1-Lipschitz
    # the claim holds on samples: a difference quotient across the jump exceeds any constant
    h = 1e-9
    f = torch.nn.Hardshrink()
    jump = (f(torch.tensor([0.5 + h], dtype=torch.float64)) - f(torch.tensor([0.5], dtype=torch.float64))).item()
    assert jump / h > 1e8
