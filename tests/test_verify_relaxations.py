"""The smooth gates' linear relaxations (`analysis.verification.ops.gates`), by dense sampling in float64 and
against mpmath: sound and tight lines for any slope (hypothesis over intervals, slopes and λ), the inflection
points, the closed-form swap gap, and soundness in the far tails, where torch's erfc is ~820 ulps off and F
underflows (the slack `G_REL_ERROR` must cover the measured error of the functions called)."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from analysis.verification.ops.gates import (G_REL_ERROR, SMOOTH_GATES, TINY, default_slopes, gate_range, intercepts, slope_range, swap_gap_unit)

GATES = list(SMOOTH_GATES)
# sampled values vs bounds, float64 on both sides: rounding of F(y) − a·y at |y| ≤ 1e4
SAMPLE_TOL = 1e-9
# a relaxation's intercept vs the sampled extremum: the bound is exact up to the sampling grid
GRID_POINTS = 20001
# the slack must exceed the measured relative error of each computed gate by this factor
SLACK_MARGIN = 8.0
mpmath.mp.dps = 40

interval = st.tuples(st.floats(-60, 60), st.floats(0, 80)).map(lambda t: (t[0], t[0] + t[1]))


def _grid(L: float, U: float) -> torch.Tensor:
    return torch.linspace(L, U, GRID_POINTS, dtype=torch.float64)


def _exact_g(gate: str, y: float) -> mpmath.mpf:
    """g(y) in 40-digit arithmetic: Φ, σ, tanh(softplus), erf(softplus)."""
    y = mpmath.mpf(y)
    if gate == "phi":
        return mpmath.erfc(-y / mpmath.sqrt(2)) / 2
    if gate == "sigmoid":
        return 1 / (1 + mpmath.exp(-y))
    if gate == "mish":
        return mpmath.tanh(mpmath.log1p(mpmath.exp(y)))
    return mpmath.erf(mpmath.log1p(mpmath.exp(y)))


TAIL_POINTS = np.concatenate([-np.logspace(-3, np.log10(700), 400), np.logspace(-3, np.log10(700), 400)])


@pytest.mark.parametrize("gate", GATES)
def test_slack_covers_the_measured_error_of_each_gate_function(gate):
    """max over y of |F_torch(y) − F_exact(y)| / |F_exact(y)| (where F is normal in float64), times the margin, is
    below G_REL_ERROR; where F_exact is below the smallest normal, the absolute error is below TINY."""
    g = SMOOTH_GATES[gate]
    y = torch.as_tensor(TAIL_POINTS, dtype=torch.float64)
    got = g.F(y).tolist()
    worst = 0.0
    for yi, fi in zip(TAIL_POINTS, got):
        exact = mpmath.mpf(yi) * _exact_g(gate, yi)
        if abs(exact) < mpmath.mpf(2.3e-308):
            assert abs(mpmath.mpf(fi) - exact) < TINY
            continue
        worst = max(worst, float(abs((mpmath.mpf(fi) - exact) / exact)))
    assert worst * SLACK_MARGIN < G_REL_ERROR, f"{gate}: measured relative error {worst:.3g}"


@pytest.mark.parametrize("gate", GATES)
# (-37.258625, ...): where torch's erfc is measured furthest below the exact value while Φ is still a normal float64
@pytest.mark.parametrize("box", [(-700.0, -30.0), (-45.0, -36.0), (-37.258625, -37.0), (-37.363025, -36.0), (30.0, 700.0)])
def test_lines_hold_against_exact_values_in_the_far_tails(gate, box):
    """The IBP range and CROWN's lines contain F(y) computed exactly, on boxes deep in both tails."""
    g = SMOOTH_GATES[gate]
    L, U = (torch.tensor([v], dtype=torch.float64) for v in box)
    ys = np.linspace(box[0], box[1], 301)
    exact = [mpmath.mpf(v) * _exact_g(gate, v) for v in ys]
    lo, hi = intercepts(g, L, U, torch.zeros(1, dtype=torch.float64))
    assert all(mpmath.mpf(float(lo)) <= e <= mpmath.mpf(float(hi)) for e in exact)
    a_lo, a_up = default_slopes(g, L, U)
    b_lo, _ = intercepts(g, L, U, a_lo)
    _, b_up = intercepts(g, L, U, a_up)
    for v, e in zip(ys, exact):
        assert mpmath.mpf(float(a_lo)) * v + mpmath.mpf(float(b_lo)) <= e <= mpmath.mpf(float(a_up)) * v + mpmath.mpf(float(b_up))


@settings(max_examples=150, deadline=None)
@given(gate=st.sampled_from(GATES), box=interval, t=st.floats(-0.5, 1.5))
def test_any_slope_gives_sound_and_tight_lines(gate, box, t):
    """For any slope a, a·y + min and a·y + max of F(y) − a·y enclose F on [L, U] (sound), and touch it (tight)."""
    g = SMOOTH_GATES[gate]
    L, U = box
    lo_s, hi_s = slope_range(g, torch.tensor(L, dtype=torch.float64), torch.tensor(U, dtype=torch.float64))
    a = torch.tensor(float(lo_s + t * (hi_s - lo_s)), dtype=torch.float64)  # inside and outside the slope range
    lo, hi = intercepts(g, torch.tensor(L, dtype=torch.float64), torch.tensor(U, dtype=torch.float64), a)
    y = _grid(L, U)
    e = g.F(y) - a * y
    scale = 1 + float((g.F(y).abs() + (a * y).abs()).max())
    assert float(e.max()) <= float(hi) + SAMPLE_TOL * scale, "upper line below the function"
    assert float(e.min()) >= float(lo) - SAMPLE_TOL * scale, "lower line above the function"
    # tight: the grid comes within one grid step's change of e (|e'| ≤ |F'| + |a| ≤ 3) of each intercept
    step = (U - L) / (GRID_POINTS - 1)
    assert float(hi) - float(e.max()) <= 3 * step + 1e-9 * scale
    assert float(e.min()) - float(lo) <= 3 * step + 1e-9 * scale


@settings(max_examples=100, deadline=None)
@given(gate=st.sampled_from(GATES), box=interval, lam=st.floats(0.5, 300))
def test_default_relaxation_and_ibp_are_sound_in_x(gate, box, lam):
    """CROWN's lines (least-area slope) and the IBP range, mapped back to x = y/λ."""
    g = SMOOTH_GATES[gate]
    l, u = box[0] / lam, box[1] / lam
    lt, ut, lamt = (torch.tensor([v], dtype=torch.float64) for v in (l, u, lam))
    a_lo, a_up = default_slopes(g, lamt * lt, lamt * ut)
    b_lo, _ = intercepts(g, lamt * lt, lamt * ut, a_lo)
    _, b_up = intercepts(g, lamt * lt, lamt * ut, a_up)
    x = _grid(l, u)
    f = g.f(x, lam)
    tol = SAMPLE_TOL * (1 + float(f.abs().max()) + float(x.abs().max()))
    assert torch.all(f <= a_up * x + b_up / lam + tol)
    assert torch.all(f >= a_lo * x + b_lo / lam - tol)
    rlo, rhi = gate_range(g, lamt, lt, ut)
    assert float(f.min()) >= float(rlo) - tol and float(f.max()) <= float(rhi) + tol


@pytest.mark.parametrize("gate", GATES)
def test_each_gate_has_exactly_its_two_inflection_points(gate):
    """The exact-extremum search relies on F'' < 0, > 0, < 0 on three pieces: scan the sign of F''."""
    g = SMOOTH_GATES[gate]
    y = torch.linspace(-50, 50, 1_000_001, dtype=torch.float64)
    s = torch.sign(g.d2F_sign(y))
    changes = y[1:][(s[1:] != s[:-1]) & (s[1:] != 0)]
    assert changes.numel() == 2
    np.testing.assert_allclose(changes.numpy(), g.inflections, atol=2e-4)
    y1, y2 = g.inflections
    assert float(g.d2F_sign(torch.tensor(y1 - 1.0))) < 0 < float(g.d2F_sign(torch.tensor(0.5 * (y1 + y2))))
    assert float(g.d2F_sign(torch.tensor(y2 + 1.0))) < 0
    # and F' really is the derivative of F
    yy = torch.linspace(-8, 8, 1601, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(g.F(yy).sum(), yy)
    np.testing.assert_allclose(g.dF(yy.detach()).numpy(), grad.numpy(), rtol=0, atol=1e-12)


def test_gelu_gap_peaks_at_the_closed_form_point():
    """sup_z |ReLU(z) − z·Φ(λz)| = c/λ with c = max_u u·Φ(−u) ≈ 0.169971 at u ≈ 0.751792 (docs/architecture.md)."""
    g = SMOOTH_GATES["phi"]
    assert g.peaks[0] == pytest.approx(0.751792, abs=1e-5) and g.peaks[1] == pytest.approx(0.751792, abs=1e-5)
    assert g.peak_values[0] == pytest.approx(0.169971, abs=1e-6)
    for lam in (1.0, 7.5, 160.0):
        b = swap_gap_unit(g, torch.tensor([lam]), torch.tensor([-5.0]), torch.tensor([5.0]))
        assert float(b) == pytest.approx(0.1699712 / lam, rel=1e-5)


@settings(max_examples=150, deadline=None)
@given(gate=st.sampled_from(GATES), box=st.tuples(st.floats(-3, 3), st.floats(0, 4)), lam=st.floats(0.5, 300))
def test_swap_gap_closed_form_is_the_sup(gate, box, lam):
    """The closed form (endpoint or peak t*/λ on each side) bounds |ReLU − f| on [l, u] and equals its max."""
    g = SMOOTH_GATES[gate]
    l, u = box[0], box[0] + box[1]
    z = _grid(l, u)
    z = torch.cat([z, torch.tensor([g.peaks[0] / lam, -g.peaks[1] / lam], dtype=torch.float64).clamp(l, u)])
    diff = (z.clamp(min=0) - g.f(z, lam)).abs()
    b = float(swap_gap_unit(g, torch.tensor([lam], dtype=torch.float64), torch.tensor([l], dtype=torch.float64),
                            torch.tensor([u], dtype=torch.float64)))
    # the direct difference cancels: one float64 ulp of |z| is its own rounding error
    assert float(diff.max()) <= b * (1 + 1e-9) + 4e-16 * (1 + max(abs(l), abs(u)))
    assert b - float(diff.max()) <= 1e-6 * b + 1e-12  # attained (the peaks are in the sample)
