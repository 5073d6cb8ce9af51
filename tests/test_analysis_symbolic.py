"""The sympy derivations equal their closed forms, and every bound holds on dense float64 samples
(each side checked separately, tolerances named)."""

from __future__ import annotations

import json
import math

import mpmath
import numpy as np
import pytest
import sympy as sp
import torch
from scipy.integrate import quad
from scipy.optimize import minimize_scalar
from scipy.special import erfc, expit, lambertw

from analysis.theory import symbolic as S
from pipeline import gates

LAM = S.LAM
SUP_TOL = 1e-12  # sampled sup may exceed c/λ by float64 rounding only
TIGHT_REL = 1e-6  # a dense grid around the argmax gets within this fraction of c/λ
INTEGRAL_REL = 1e-9  # scipy quad vs closed form
RIEMANN_REL = 1e-4  # a 2e5-point midpoint sum vs closed form
LIP_TOL = 1e-12
MIN_TOL = 1e-15
N_SAMPLES = 200_000
LAMBDAS = (1.0, 2.0, 10.0, 160.0)

rng = np.random.default_rng(0)


def Phi(y):
    return 0.5 * erfc(-y / math.sqrt(2))


def gate_np(gate: str):
    return {"phi": Phi, "sigmoid": expit}[gate]


def samples(lam: float, u: float) -> np.ndarray:
    """1e5+ points at the scale of the gate: Gaussian, wide uniform, and dense around ±u/λ."""
    parts = [
        rng.standard_normal(N_SAMPLES // 2) * 3 / lam,
        rng.uniform(-50 / lam, 50 / lam, N_SAMPLES // 2),
        np.linspace(-(u + 0.01) / lam, -(u - 0.01) / lam, 20_001),
        np.linspace((u - 0.01) / lam, (u + 0.01) / lam, 20_001),
        np.array([0.0, 1e300, -1e300]),
    ]
    return np.concatenate(parts)


def gap(x: np.ndarray, lam: float, gate: str) -> np.ndarray:
    return np.abs(np.maximum(x, 0.0) - x * gate_np(gate)(lam * x))


# ---------------------------------------------------------------------------------------------
# Closed forms


def test_gate_l1_phi_closed_form():
    expr = S.gate_l1_bound("phi")
    assert sp.simplify(expr - sp.sqrt(2) / (sp.sqrt(sp.pi) * LAM)) == 0
    assert sp.simplify(expr - 2 / (LAM * sp.sqrt(2 * sp.pi))) == 0  # the paper's form
    assert float(expr.subs(LAM, 1)) == pytest.approx(math.sqrt(2 / math.pi), rel=1e-15)


def test_act_l1_closed_forms():
    assert sp.simplify(S.act_l1_bound("phi") - 1 / (2 * LAM**2)) == 0
    assert sp.simplify(S.act_l1_bound("sigmoid") - sp.pi**2 / (6 * LAM**2)) == 0


def test_sigmoid_gate_l1_closed_form():
    expr = S.gate_l1_bound("sigmoid")
    assert sp.simplify(expr - 2 * sp.log(2) / LAM) == 0
    assert float(expr.subs(LAM, 1)) == pytest.approx(2 * math.log(2), rel=1e-15)


def test_sup_constant_phi_matches_independent_optimum():
    sc = S.sup_constant("phi")
    assert sc.n_critical == 1 and sc.second_derivative < 0
    res = minimize_scalar(lambda u: -u * Phi(-u), bounds=(0.1, 3), method="bounded", options={"xatol": 1e-12})
    assert float(sc.u) == pytest.approx(res.x, abs=1e-8)
    assert float(sc.c) == pytest.approx(-res.fun, abs=1e-14)
    assert float(sc.c) == pytest.approx(0.169971, abs=5e-7)
    assert float(sc.u) == pytest.approx(0.751792, abs=5e-7)
    # Stationarity Φ(−u) = u·φ(u) makes c = u²·φ(u): an identity the nsolve root must satisfy.
    u = sp.Float(sc.u, 30)
    assert abs(sc.c - u**2 * sp.exp(-(u**2) / 2) / sp.sqrt(2 * sp.pi)) < 1e-25


def test_sup_constant_sigmoid_is_lambert_w():
    sc = S.sup_constant("sigmoid")
    w = float(lambertw(1 / math.e).real)  # u·σ(u) = 1 ⟹ u = 1 + W(1/e), c = u − 1
    assert float(sc.c) == pytest.approx(w, abs=1e-14)
    assert float(sc.u) == pytest.approx(1 + w, abs=1e-14)


def test_lipschitz_phi_closed_form():
    lip = S.lipschitz_constant("phi")
    assert lip.u_star == sp.sqrt(2)
    u = sp.sqrt(2)
    expected = (1 + sp.erf(u / sp.sqrt(2))) / 2 + u * sp.exp(-(u**2) / 2) / sp.sqrt(2 * sp.pi)  # Φ(√2) + √2φ(√2)
    assert sp.simplify(lip.closed_form - expected) == 0
    assert float(lip.value) == pytest.approx(1.128904, abs=5e-7)
    assert float(lip.min_slope) == pytest.approx(1 - float(lip.value), abs=1e-14)  # at −√2
    assert lip.limits == (0, 1)


def test_activation_minimum_is_minus_c():
    for gate in ("phi", "sigmoid"):
        mn, sc = S.activation_minimum(gate), S.sup_constant(gate)
        assert abs(mn.value_scaled + sc.c) < 1e-25
        assert abs(mn.u + sc.u) < 1e-25
    x, v = S.activation_minimum("phi").at(160.0)
    assert x == pytest.approx(-0.751792 / 160, abs=5e-7 / 160)  # the quoted 6-digit values
    assert v == pytest.approx(-0.169971 / 160, abs=5e-7 / 160)


def test_lambda_targets():
    eps = 5e-3
    assert S.lambda_target(eps, "gate_l1") == pytest.approx(2 / (eps * math.sqrt(2 * math.pi)), rel=1e-14)
    assert S.lambda_target(eps, "gate_l1") == pytest.approx(159.577, abs=5e-4)
    assert S.lambda_target(eps, "act_l1") == pytest.approx(10.0, rel=1e-14)  # 1/(2λ²) = 5e-3
    # c = max_u u·Φ(−u) by a 30-digit root of its stationarity condition Φ(−u) = u·φ(u), independent of symbolic.py
    u = mpmath.findroot(lambda v: mpmath.ncdf(-v) - v * mpmath.npdf(v), 0.75)
    assert S.lambda_target(eps, "sup") == pytest.approx(float(u * mpmath.ncdf(-u)) / eps, rel=1e-14)
    assert S.lambda_target(eps, "gate_l1", "sigmoid") == pytest.approx(2 * math.log(2) / eps, rel=1e-14)
    # The target meets the tolerance, and anything smaller does not.
    for crit in S.CRITERIA:
        lt = S.lambda_target(eps, crit)
        b = S.bound(crit)
        assert float(b.subs(LAM, lt)) <= eps * (1 + 1e-12)
        assert float(b.subs(LAM, lt * (1 - 1e-6))) > eps


def test_bad_arguments():
    with pytest.raises(ValueError, match="criterion"):
        S.lambda_target(5e-3, "nope")
    with pytest.raises(ValueError, match="eps"):
        S.lambda_target(0.0)
    with pytest.raises(ValueError, match="unknown gate"):
        S.gate_l1_bound("nope")


def test_register_gate_derives_a_new_gate():
    # g(y) = σ(2y) = (1 + tanh y)/2: the sigmoid results at twice the hardness.
    sig = gates.gate_bounds("sigmoid")
    tail = lambda u: float(expit(-2 * u))  # noqa: E731  1 − (1 + tanh u)/2 = σ(−2u), both sides
    spec = gates.GateFamily("tanh_step", "x·(1+tanh(λx))/2", lambda y: 0.5 * (1 + torch.tanh(y)), lambda y: (1 + sp.tanh(y)) / 2,
                            tail, tail, l1=lambda: (sig.gate_l1 / 2, sig.act_l1 / 4), tail_series=lambda k: ((-1) ** (k + 1), 2 * k))
    S.register_gate(spec)
    try:
        assert sp.simplify(S.gate_l1_bound("tanh_step") - sp.log(2) / LAM) == 0
        assert float(S.sup_constant("tanh_step").c) == pytest.approx(float(S.sup_constant("sigmoid").c) / 2, rel=1e-12)
        assert gates.gate_bounds("tanh_step").sup == pytest.approx(sig.sup / 2, rel=1e-11)  # from its own tails
    finally:
        del S.GATES["tanh_step"]
        gates.gate_bounds.cache_clear()
        gates.tail_peaks.cache_clear()


def test_summary_is_json_and_fast_enough():
    out = S.summary()
    text = json.dumps(out)  # JSON-serialisable
    back = json.loads(text)
    phi = back["gates"]["phi"]
    assert phi["gate_l1"]["expr"] == "sqrt(2)/(sqrt(pi)*lambda)"
    assert phi["act_l1"]["expr"] == "1/(2*lambda**2)"
    assert phi["lambda_target"]["gate_l1"] == pytest.approx(159.57691216, abs=1e-6)
    assert phi["lipschitz"]["u_star_expr"] == "sqrt(2)"
    assert back["gates"]["sigmoid"]["gate_l1"]["expr"] == "2*log(2)/lambda"
    assert all(v >= 0 for v in back["timings_s"].values())


# ---------------------------------------------------------------------------------------------
# Soundness on samples, one side at a time


@pytest.mark.parametrize("gate", ["phi", "sigmoid"])
@pytest.mark.parametrize("lam", LAMBDAS)
def test_sup_bound_holds_and_is_tight(gate, lam):
    sc = S.sup_constant(gate)
    c, u = float(sc.c), float(sc.u)
    x = samples(lam, u)
    g = gap(x, lam, gate)
    assert g.max() <= c / lam + SUP_TOL  # never exceeded
    dense = np.concatenate([np.linspace(-(u + 1e-3) / lam, -(u - 1e-3) / lam, 10_001), np.linspace((u - 1e-3) / lam, (u + 1e-3) / lam, 10_001)])
    gd = gap(dense, lam, gate)
    assert gd.max() >= c / lam * (1 - TIGHT_REL)  # and reached, on both sides
    assert gd[:10_001].max() >= c / lam * (1 - TIGHT_REL) and gd[10_001:].max() >= c / lam * (1 - TIGHT_REL)


@pytest.mark.parametrize("gate", ["phi", "sigmoid"])
@pytest.mark.parametrize("lam", LAMBDAS)
def test_l1_bounds_match_quadrature_and_samples(gate, lam):
    g = gate_np(gate)
    gl1 = float(S.gate_l1_bound(gate).subs(LAM, lam))
    al1 = float(S.act_l1_bound(gate).subs(LAM, lam))
    q_gate = quad(lambda x: g(lam * x), -np.inf, 0, epsabs=0, epsrel=1e-12)[0] + quad(lambda x: 1 - g(lam * x), 0, np.inf, epsabs=0, epsrel=1e-12)[0]
    q_act = quad(lambda x: -x * g(lam * x), -np.inf, 0, epsabs=0, epsrel=1e-12)[0] + quad(lambda x: x * (1 - g(lam * x)), 0, np.inf, epsabs=0, epsrel=1e-12)[0]
    assert q_gate == pytest.approx(gl1, rel=INTEGRAL_REL)
    assert q_act == pytest.approx(al1, rel=INTEGRAL_REL)
    # Midpoint sums over 2e5 samples: neither above nor below the closed form beyond RIEMANN_REL.
    h = 80.0 / lam / N_SAMPLES
    xm = -40.0 / lam + h * (np.arange(N_SAMPLES) + 0.5)
    s_gate = np.sum(np.abs((xm > 0) - g(lam * xm))) * h
    s_act = np.sum(gap(xm, lam, gate)) * h
    assert gl1 * (1 - RIEMANN_REL) <= s_gate <= gl1 * (1 + RIEMANN_REL)
    assert al1 * (1 - RIEMANN_REL) <= s_act <= al1 * (1 + RIEMANN_REL)


@pytest.mark.parametrize("gate", ["phi", "sigmoid"])
@pytest.mark.parametrize("lam", LAMBDAS)
def test_minimum_and_lipschitz_hold_on_samples(gate, lam):
    mn, lip = S.activation_minimum(gate), S.lipschitz_constant(gate)
    xmin, vmin = mn.at(lam)
    L, us = float(lip.value), float(lip.u_star)
    x = torch.tensor(samples(lam, float(S.sup_constant(gate).u))[:-2], dtype=torch.float64, requires_grad=True)  # drop ±1e300
    f = S.smooth_activation(x, lam, gate)
    (df,) = torch.autograd.grad(f.sum(), x)
    f, df = f.detach(), df.detach()
    assert f.min().item() >= vmin - MIN_TOL  # minimum never undercut
    near = torch.linspace(xmin - 1e-3 / lam, xmin + 1e-3 / lam, 20_001, dtype=torch.float64)
    assert S.smooth_activation(near, lam, gate).min().item() <= vmin + 1e-12 / lam  # and reached
    assert df.abs().max().item() <= L + LIP_TOL  # Lipschitz: |f'| ≤ L everywhere sampled
    xs = x.detach()
    a, b = xs[: N_SAMPLES // 2], xs[N_SAMPLES // 2 : N_SAMPLES]
    fa, fb = S.smooth_activation(a, lam, gate), S.smooth_activation(b, lam, gate)
    mask = (a - b).abs() > 1e-9 / lam
    assert ((fa - fb).abs()[mask] / (a - b).abs()[mask]).max().item() <= L + 1e-9  # difference quotients too
    peak = torch.linspace((us - 1e-3) / lam, (us + 1e-3) / lam, 20_001, dtype=torch.float64, requires_grad=True)
    (dp,) = torch.autograd.grad(S.smooth_activation(peak, lam, gate).sum(), peak)
    assert dp.max().item() >= L - 1e-9  # and L is reached at x = u*/λ
