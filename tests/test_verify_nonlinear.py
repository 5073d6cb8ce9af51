"""The transformer ops' relaxations (`analysis.verification.ops`: curves, products, norm, softmax) by dense sampling in float64, each side apart,
against mpmath where float64 itself is the question, and tight where they touch the function; the products' planes
through the interface `bounds.Bounder` uses (`relax`/`back`), so a sign error in a coefficient fails here."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

from analysis.verification.ops import products
from analysis.verification.ops.base import OutOfDomain
from analysis.verification.ops.curves import REL_SLACK, Exp, Reciprocal, Rsqrt, Sqrt, Square
from analysis.verification.ops.products import BatchMatMul, Product
from analysis.verification.ops.softmax import ExpSums

DT = torch.float64
POINTS = 4001  # samples per interval, the ends included
# a line touches its function at the chord's ends and at the tangent point: there the gap is only the slack
TOUCH_TOL = 1e-9
mpmath.mp.dps = 40

# (op, exact function in mpmath, intervals): wide, narrow, a point, near the domain's edge, far out
CASES = {
    "exp": (Exp, mpmath.exp, [(-3.0, 2.0), (-40.0, -39.0), (0.0, 0.0), (-1e-9, 1e-9), (5.0, 30.0), (-700.0, 5.0), (2.0, 2.0 + 1e-12)]),
    "reciprocal": (Reciprocal, lambda v: 1 / v, [(1.0, 3.0), (1e-3, 1.0), (1.0, 1e4), (2.0, 2.0), (0.5, 0.5 + 1e-11), (1e-8, 1e-7)]),
    "rsqrt": (Rsqrt, lambda v: 1 / mpmath.sqrt(v), [(1e-5, 1.0), (0.1, 0.3), (3.0, 3.0), (1e-5, 1e-5 + 1e-13), (1.0, 1e6)]),
    "sqrt": (Sqrt, mpmath.sqrt, [(0.0, 1.0), (0.0, 0.0), (1e-6, 4.0), (4.0, 4.0 + 1e-12), (100.0, 1e5)]),
    "square": (Square, lambda v: v * v, [(-2.0, 3.0), (-3.0, -1.0), (0.5, 0.7), (0.0, 0.0), (-1e-8, 1e-8), (-1e3, 1e3)]),
}


def _grid(l: float, u: float) -> torch.Tensor:
    return torch.linspace(l, u, POINTS, dtype=DT)


@pytest.mark.parametrize("name", list(CASES))
def test_curve_lines_and_range_hold_by_dense_sampling_each_side_apart(name):
    cls, _, intervals = CASES[name]
    op = cls(len(intervals))
    l = torch.tensor([a for a, _ in intervals], dtype=DT)
    u = torch.tensor([b for _, b in intervals], dtype=DT)
    al, bl, au, bu = op.lines(l, u)
    lo, hi = op.interval(l, u)
    for i, (a, b) in enumerate(intervals):
        x = _grid(a, b)
        f = op.f(x)
        lower, upper = al[i] * x + bl[i], au[i] * x + bu[i]
        assert bool(torch.all(lower <= f)), f"{name} [{a}, {b}]: lower line above f by {float((lower - f).max()):.3g}"
        assert bool(torch.all(f <= upper)), f"{name} [{a}, {b}]: upper line below f by {float((f - upper).max()):.3g}"
        assert bool(torch.all((lo[i] <= f) & (f <= hi[i]))), f"{name} [{a}, {b}]: range misses f"


@pytest.mark.parametrize("name", list(CASES))
def test_curve_lines_hold_against_mpmath_and_touch_the_function(name):
    """Against 40-digit values (the slack covers torch's own rounding of f), and tight: each line meets f within
    TOUCH_TOL·(1 + |f|) somewhere (at the chord's ends, at the tangent point)."""
    cls, exact, intervals = CASES[name]
    op = cls(len(intervals))
    l = torch.tensor([a for a, _ in intervals], dtype=DT)
    u = torch.tensor([b for _, b in intervals], dtype=DT)
    al, bl, au, bu = op.lines(l, u)
    for i, (a, b) in enumerate(intervals):
        xs = np.unique(np.concatenate([np.linspace(a, b, 201), [(a + b) / 2]]))
        gap_lo = gap_hi = math.inf
        for x in xs:
            fx = exact(mpmath.mpf(float(x)))
            lo_line = mpmath.mpf(float(al[i])) * mpmath.mpf(float(x)) + mpmath.mpf(float(bl[i]))
            hi_line = mpmath.mpf(float(au[i])) * mpmath.mpf(float(x)) + mpmath.mpf(float(bu[i]))
            assert lo_line <= fx <= hi_line, f"{name} [{a}, {b}] at {x}"
            gap_lo, gap_hi = min(gap_lo, float(fx - lo_line)), min(gap_hi, float(hi_line - fx))
        scale = 1 + float(abs(exact(mpmath.mpf(float(b))))) + float(abs(exact(mpmath.mpf(float(a)))))
        assert gap_lo <= TOUCH_TOL * scale and gap_hi <= TOUCH_TOL * scale, f"{name} [{a}, {b}]: gaps {gap_lo:.3g}, {gap_hi:.3g}"


def test_lines_outside_the_domain_are_refused_and_ranges_unknown():
    l, u = torch.tensor([-1.0, 0.5], dtype=DT), torch.tensor([2.0, 1.0], dtype=DT)
    with pytest.raises(OutOfDomain, match="Reciprocal .*lower bound -1"):
        Reciprocal(2, "n7").lines(l, u)
    lo, hi = Reciprocal(2).interval(l, u)
    assert lo[0] == -math.inf and hi[0] == math.inf and float(lo[1]) <= 1.0 <= 2.0 <= float(hi[1])
    with pytest.raises(OutOfDomain, match="exceeds 700"):
        Exp(1).lines(torch.tensor([0.0], dtype=DT), torch.tensor([800.0], dtype=DT))


def _lower_holds(op, l, u, A, samples):
    """A·op(h) ≥ A_in·h + c at every sample h (rows of A apart): the relaxation as back-substitution uses it."""
    A_in, c = op.back(A, op.relax(l, u))
    lhs = op.forward(samples) @ A.T  # [S, rows]
    rhs = samples @ A_in.T + c
    return float((rhs - lhs).max())


def _box_samples(l, u, n, gen):
    r = torch.rand(n, l.numel(), generator=gen, dtype=DT)
    corners = torch.where(torch.rand(n, l.numel(), generator=gen) < 0.5, l, u)
    return torch.cat([l + r * (u - l), corners, l[None], u[None]])


@pytest.mark.parametrize("planes", ["edge", "middle"])
@pytest.mark.parametrize("seed", range(4))
def test_product_planes_hold_each_side_by_dense_sampling(seed, planes, monkeypatch):
    monkeypatch.setattr(products, "PLANES", planes)
    gen = torch.Generator().manual_seed(seed)
    n = 6
    c = torch.randn(2 * n, generator=gen, dtype=DT) * 3
    w = torch.rand(2 * n, generator=gen, dtype=DT) * torch.tensor([0.0, 1e-9, 0.5, 2, 5, 1] * 2, dtype=DT)
    l, u = c - w, c + w
    op = Product(n)
    s = _box_samples(l, u, 20000, gen)
    eye = torch.eye(n, dtype=DT)
    assert _lower_holds(op, l, u, eye, s) <= 0  # lower side
    assert _lower_holds(op, l, u, -eye, s) <= 0  # upper side
    lo, hi = op.interval(l, u)
    z = op.forward(s)
    assert bool(torch.all((lo <= z) & (z <= hi)))
    # tight: McCormick's worst gap per side, (x_u − x_l)(y_u − y_l) for one plane, half that for the averaged two
    wx, wy = (u - l)[:n], (u - l)[n:]
    for rows in (eye, -eye):
        A_in, cst = op.back(rows, op.relax(l, u))
        worst = (rows @ z.T).T - (s @ A_in.T + cst)
        assert bool(torch.all(worst.max(0).values <= (0.5 if planes == "middle" else 1.0) * wx * wy + 1e-9))
        if planes == "edge":  # exact on the edge x = x_l, both sides (to the intercepts' slack)
            on_edge = torch.cat([l[:n].expand(len(s), n), s[:, n:]], 1)
            gap = (rows @ op.forward(on_edge).T).T - (on_edge @ A_in.T + cst)
            assert float(gap.abs().max()) < 1e-9
    (Ml, lo_l, up_l), (Mu, lo_u, up_u) = op.milp_rows(l, u)
    zn, sn = z.numpy(), s.numpy()
    assert np.all(zn - sn @ Ml.toarray().T >= lo_l - 1e-9) and np.all(up_l == np.inf)
    assert np.all(zn - sn @ Mu.toarray().T <= up_u + 1e-9) and np.all(lo_u == -np.inf)


@pytest.mark.parametrize("planes", ["edge", "middle"])
@pytest.mark.parametrize("seed", range(3))
def test_batch_matmul_relaxation_holds_for_mixed_sign_rows_by_dense_sampling(seed, planes, monkeypatch):
    monkeypatch.setattr(products, "PLANES", planes)
    gen = torch.Generator().manual_seed(seed)
    b, m, k, n = 2, 3, 4, 2
    op = BatchMatMul(b, m, k, n)
    size = op.in_sizes()[0]
    c = torch.randn(size, generator=gen, dtype=DT)
    w = torch.rand(size, generator=gen, dtype=DT) * 0.7
    l, u = c - w, c + w
    s = _box_samples(l, u, 6000, gen)
    rows = torch.cat([torch.eye(op.out_size, dtype=DT), -torch.eye(op.out_size, dtype=DT),
                      torch.randn(8, op.out_size, generator=gen, dtype=DT)])
    assert _lower_holds(op, l, u, rows, s) <= 0
    lo, hi = op.interval(l, u)
    z = op.forward(s)
    assert bool(torch.all((lo <= z) & (z <= hi)))
    # the exact product on the box's centre is what forward computes (A [b, m, k] @ B [b, k, n])
    a, bb = c[: b * m * k].reshape(b, m, k), c[b * m * k:].reshape(b, k, n)
    torch.testing.assert_close(op.forward(c[None])[0], (a @ bb).reshape(-1))


@pytest.mark.parametrize("seed", range(4))
def test_exp_sums_relaxation_and_range_hold_each_side_by_dense_sampling(seed):
    """The softmax's sums Σ_j exp(x_j − x_i) as one op: e_r and −e_r rows (each side apart) and mixed-sign rows, on
    narrow and wide logit intervals, against the float64 forward; the range contains every sample."""
    gen = torch.Generator().manual_seed(seed)
    op = ExpSums(3, 5)
    n = op.in_sizes()[0]
    c = 3 * torch.randn(n, generator=gen, dtype=DT)
    w = torch.rand(n, generator=gen, dtype=DT) * (0.05 if seed % 2 else 2.0)
    l, u = c - w, c + w
    s = _box_samples(l, u, 6000, gen)
    z = op.forward(s)
    # forward is the sum itself (1/softmax)
    xs = s.reshape(-1, 3, 5)
    torch.testing.assert_close(z, (torch.exp(xs[:, :, None, :] - xs[:, :, :, None]).sum(-1)).reshape(len(s), -1))
    eye = torch.eye(op.out_size, dtype=DT)
    assert _lower_holds(op, l, u, eye, s) <= 0  # lower side
    assert _lower_holds(op, l, u, -eye, s) <= 0  # upper side
    assert _lower_holds(op, l, u, torch.randn(8, op.out_size, generator=gen, dtype=DT), s) <= 0
    lo, hi = op.interval(l, u)
    assert bool(torch.all((lo <= z) & (z <= hi))) and bool(torch.all(lo >= 1 - 1e-12))
    # not vacuous on narrow intervals: the lines' gap at the centre is of the order of the widths
    if seed % 2:
        A_in, cst = op.back(eye, op.relax(l, u))
        assert float((z - (s @ A_in.T + cst)).max()) < 0.1 * float(z.max())
    (Ml, lo_l, _), (Mu, _, hi_u) = op.milp_rows(l, u)
    gap_l, gap_u = z.numpy() - s.numpy() @ Ml.toarray().T, z.numpy() - s.numpy() @ Mu.toarray().T
    assert np.all(gap_l >= lo_l - 1e-9) and np.all(gap_u <= hi_u + 1e-9)
    d = torch.rand(n, generator=gen, dtype=DT) * 0.05
    zp = op.forward((s + (2 * torch.rand(s.shape, generator=gen, dtype=DT) - 1) * d))
    assert bool(torch.all((zp - z).abs() <= op.gap(l, u, d)))


def test_exp_sums_refuses_an_overflowing_difference_only_where_a_row_reads_its_upper_line():
    """Row 0's differences x_j − x_2 reach 800 (exp overflows float64): s_2 gets 1 ≤ s_2 ≤ ∞; a coefficient row that needs
    an upper line there (a negative coefficient) is refused, one that reads only the lower line or only row 1 gets sound
    bounds (dense samples of the box, in float64, each side apart)."""
    op = ExpSums(2, 3)
    l = torch.tensor([0.0, 0.0, -400.0, 0.1, -0.3, 0.2], dtype=DT)
    u = torch.tensor([0.0, 400.0, 0.0, 0.4, 0.1, 0.5], dtype=DT)
    lo, hi = op.interval(l, u)
    assert bool(torch.isinf(hi[:3]).any()) and bool(torch.all(lo >= 1 - 1e-12)) and bool(torch.isfinite(hi[3:]).all())
    relax = op.relax(l, u)
    with pytest.raises(OutOfDomain, match="a softmax row the bound reads"):
        op.back(torch.tensor([[0.0, 0.0, -1.0, 1.0, 0.0, 0.0]], dtype=DT), relax)
    gen = torch.Generator().manual_seed(9)
    s = _box_samples(l, u, 4000, gen)
    with np.errstate(over="ignore"):
        z = op.forward(s)  # +inf where exp overflows: above any lower bound
    # lower sides: a nonnegative row on the overflowing sums (s_i ≥ 1 there), any row on the others; upper sides of
    # row 1's sums only (the rows below, negated, bound them from above)
    A = torch.cat([torch.rand(8, 3, generator=gen, dtype=DT), torch.randn(8, 3, generator=gen, dtype=DT)], 1)
    A = torch.cat([A, -torch.cat([torch.zeros(8, 3, dtype=DT), torch.rand(8, 3, generator=gen, dtype=DT)], 1)])
    A_in, cst = op.back(A, relax)
    bound = s @ A_in.T + cst  # the relaxation's lower bound of A·z at each sample
    value = torch.where(A[None] == 0, torch.zeros(()), A[None] * z[:, None, :]).sum(-1)  # A·z, 0·∞ read as 0
    assert bool(torch.all(value >= bound - 1e-9)), float((bound - value).max())
    # the overflowing sum read from below alone: the constant line s_2 ≥ 1 (to its rounding), no coefficient on the logits
    A_in, cst = op.back(torch.eye(6, dtype=DT)[2:3], relax)
    assert bool(torch.all(A_in == 0)) and np.allclose(cst.numpy(), 1.0, rtol=1e-9)


@pytest.mark.parametrize("planes", ["edge", "middle"])
def test_batch_matmul_milp_rows_are_the_planes_of_relax(planes, monkeypatch):
    monkeypatch.setattr(products, "PLANES", planes)
    gen = torch.Generator().manual_seed(5)
    op = BatchMatMul(1, 2, 3, 2)
    size = op.in_sizes()[0]
    c, w = torch.randn(size, generator=gen, dtype=DT), torch.rand(size, generator=gen, dtype=DT)
    l, u = c - w, c + w
    (Ml, glo, inf_l), (Mu, inf_u, ghi) = op.milp_rows(l, u)
    assert np.all(inf_l == np.inf) and np.all(inf_u == -np.inf)
    eye = torch.eye(op.out_size, dtype=DT)
    A_lo, c_lo = op.back(eye, op.relax(l, u))  # lower side: z ≥ A_lo·x + c_lo
    A_up, c_up = op.back(-eye, op.relax(l, u))  # upper side: −z ≥ A_up·x + c_up
    np.testing.assert_allclose(Ml.toarray(), A_lo.numpy(), atol=1e-15)
    np.testing.assert_allclose(glo, c_lo.numpy(), atol=1e-15)
    np.testing.assert_allclose(Mu.toarray(), -A_up.numpy(), atol=1e-15)
    np.testing.assert_allclose(ghi, -c_up.numpy(), atol=1e-15)
    s = _box_samples(l, u, 2000, gen)
    z = op.forward(s).numpy()
    assert np.all(z - s.numpy() @ Ml.toarray().T >= glo - 1e-12) and np.all(z - s.numpy() @ Mu.toarray().T <= ghi + 1e-12)


def test_swap_gap_rules_bound_the_change_of_each_op():
    """|op(z') − op(z)| ≤ gap(l, u, d) for z in [l, u], |z' − z| ≤ d (sampled)."""
    gen = torch.Generator().manual_seed(3)
    for op, (lo, hi) in [(Exp(5), (-2.0, 1.0)), (Reciprocal(5), (0.5, 2.0)), (Rsqrt(5), (0.3, 2.0)), (Sqrt(5), (0.0, 2.0)),
                         (Square(5), (-2.0, 2.0))]:
        l = torch.full((5,), lo, dtype=DT)
        u = l + torch.rand(5, generator=gen, dtype=DT) * (hi - lo)
        d = torch.rand(5, generator=gen, dtype=DT) * 0.1
        z = l + torch.rand(3000, 5, generator=gen, dtype=DT) * (u - l)
        zp = z + (2 * torch.rand(3000, 5, generator=gen, dtype=DT) - 1) * d
        if isinstance(op, Sqrt):
            zp = zp.clamp(min=0)
        assert bool(torch.all((op.forward(zp) - op.forward(z)).abs() <= op.gap(l, u, d))), type(op).__name__
    op = Product(3)
    l, u = -torch.rand(6, generator=gen, dtype=DT), torch.rand(6, generator=gen, dtype=DT)
    d = torch.rand(6, generator=gen, dtype=DT) * 0.2
    z = l + torch.rand(3000, 6, generator=gen, dtype=DT) * (u - l)
    zp = z + (2 * torch.rand(3000, 6, generator=gen, dtype=DT) - 1) * d
    assert bool(torch.all((op.forward(zp) - op.forward(z)).abs() <= op.gap(l, u, d)))


def test_slack_is_far_above_float64_rounding_of_the_lines():
    """REL_SLACK (2⁻⁴⁰) against the rounding it covers: the lines' coefficients and f, ~1e-16 relative."""
    assert REL_SLACK > 1000 * np.finfo(np.float64).eps


@pytest.mark.parametrize("seed", range(3))
def test_variance_range_and_planes_hold_by_dense_sampling(seed):
    """`Variance` reads (x, c = Px): its range (the norm bound from x's box, the separable one from c's intervals) and its
    two planes hold at sampled x of the box (c computed from x, so the samples respect c = Px)."""
    from analysis.verification.ops.norm import Variance

    gen = torch.Generator().manual_seed(seed)
    R, N = 3, 5
    op = Variance(R, N, 1e-5)
    x0 = torch.randn(R * N, generator=gen, dtype=DT) * 2
    r = torch.rand(R * N, generator=gen, dtype=DT) * torch.tensor([0.01, 0.3, 1.0], dtype=DT).repeat_interleave(N)
    xl, xu = x0 - r, x0 + r
    xs = _box_samples(xl, xu, 20000, gen)
    cs = (xs.reshape(-1, R, N) - xs.reshape(-1, R, N).mean(-1, keepdim=True)).reshape(len(xs), -1)
    cl, cu = cs.min(0).values - 1e-3, cs.max(0).values + 1e-3  # c's intervals: any enclosure of the samples' c
    l, u = torch.cat([xl, cl]), torch.cat([xu, cu])
    h = torch.cat([xs, cs], -1)
    v = op.forward(h)
    lo, hi = op.interval(l, u)
    assert bool(torch.all((lo <= v) & (v <= hi)))
    assert float(lo[0]) > 1e-5 * 10  # the first row's box is narrow: the norm bound keeps its variance off 0
    # c's own box alone (x's box vacuous): the bound from c's centre and half-widths holds and keeps row 0 off 0
    lo_c, _ = op.interval(torch.cat([xl - 1e3, cl]), torch.cat([xu + 1e3, cu]))
    assert bool(torch.all(lo_c <= v)) and float(lo_c[0]) > 1e-5 * 10
    eye = torch.eye(R, dtype=DT)
    assert _lower_holds(op, l, u, eye, h) <= 0 and _lower_holds(op, l, u, -eye, h) <= 0
    # the tangent planes at each unit's end nearest 0 hold too, and are never below the separable bound of c's box
    near = op.relax(l, u, tangent="near")
    A_in, cst = op.back(eye, near)
    assert float((h @ A_in.T + cst - v).max()) <= 0
    sep = torch.where((cl <= 0) & (cu >= 0), torch.zeros_like(cl), torch.minimum(cl * cl, cu * cu)).reshape(R, N).mean(-1)
    plane_min = (torch.minimum(A_in[:, R * N:] * cl, A_in[:, R * N:] * cu)).sum(-1) + cst  # the planes' least on c's box
    assert bool(torch.all(plane_min >= sep + 1e-5 - 1e-9))
