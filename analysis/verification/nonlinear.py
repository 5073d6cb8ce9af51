"""The nonlinear ops a transformer adds to a verification graph, each with a sound linear relaxation of its own (the ops
`bounds.Bounder` does not optimize; branch and bound splits only ReLUs, these keep their relaxations):

- elementwise, convex or concave on their domain (`Curve`): `Exp`, `Reciprocal` (x > 0), `Sqrt` (x ≥ 0), `Rsqrt`
  (1/√x, x > 0) and `Square`. Over an input interval [l, u] the chord through (l, f(l)) and (u, f(u)) is on one side
  of f and the tangent at the middle m = (l + u)/2 on the other (auto_LiRPA's `BoundExp`, `BoundReciprocal`,
  `BoundSqrt` choose the same lines; the middle is the tangent point of least area between line and curve, since the
  area's derivative in m is f''(m)·((l + u)/2 − m));
- products of two variables: `Product` (x ⊙ y elementwise) and `BatchMatMul` (A @ B over a batch of matrices). Each
  product term x·y over the box [x_l, x_u] × [y_l, y_u] gets one McCormick plane per side, both through the edge
  x = x_l (auto_LiRPA's `MulHelper.interpolated_relaxation`, its default):

      x·y ≥ y_l·x + x_l·y − x_l·y_l,      x·y ≤ y_u·x + x_l·y − x_l·y_u,

  with gaps (x − x_l)(y − y_l) ≥ 0 and (x − x_l)(y_u − y) ≥ 0, exact on that edge. The coefficient on y is x_l on
  both sides, so a MatMul's relaxation is three matrix products (coefficients Λ₊·B_lᵀ + Λ₋·B_uᵀ and A_lᵀ·Λ) and two
  constant matrices −A_l·B_l, −A_l·B_u, never a tensor per product term. `PLANES = "middle"` gives the two planes of
  each side averaged instead (auto_LiRPA's `middle` option: both sides share coefficients, half the worst gap per
  term), which measured far looser through attention: on a 17-token, two-block timm ViT the margin's CROWN bound at
  ε 0.002 was −140.9 against −17.0 with the edge planes, and −4584 with attention's planes through x = x_u
  (benchmarks/peers/crown-vit/README.md). The anchor matters because the first operand of attention's products is
  the query or the softmax's probabilities, whose lower ends lie nearest the values the box reaches.

A softmax is read as exp and reciprocal (`readers`: softmax_i = 1/Σ_j exp(x_j − x_i), Wei et al. 2023's
exp-reciprocal form: no division of two variables, and exp(x_i − x_i) = 1 exactly, so the sum is ≥ 1), a LayerNorm
as centring, its `Variance` (one op on the whole row, whose range uses ‖P(x − x₀)‖ ≤ ‖r‖₂: interval arithmetic
through Square gives a lower bound of 0 as soon as every centred unit's interval holds 0, and a LayerNorm's
1/√(var + ε) then reaches 1/√ε), Rsqrt and a Product.

A product's op reads one input, the concatenation of its two operands (the reader adds the `Concat`), so every
nonlinear node of the graph is an activation site with one input interval, as ReLUs and gates are.

Floating point: the lines are computed in float64 from torch's exp/sqrt/reciprocal (within a few ulps); each intercept
is moved outward by `REL_SLACK` times the magnitudes involved plus `TINY`, far more than the rounding of the
line's coefficients (relative 1e-16) and of the functions (tests/test_verify_nonlinear.py samples each relaxation
densely in float64, each side apart, and checks exp against mpmath).

An input interval outside an op's domain (a divisor whose lower bound is ≤ 0 on the box, an exp argument above
`EXP_MAX`) has no sound finite relaxation: `OutOfDomain`, one line naming the node and the interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .ops import DTYPE, Activation, UnsupportedModel, as_tensor

REL_SLACK = 2.0 ** -40  # relative widening of every intercept (~9e-13; the rounding it covers is ~1e-15)
TINY = 1e-300
EXP_MAX = 700.0  # exp overflows float64 just above 709.78


class OutOfDomain(UnsupportedModel):
    """A nonlinear op's input interval leaves the op's domain on this box: no finite sound relaxation."""


# ---------------------------------------------------------------------------------------------
# elementwise convex / concave functions


@dataclass(eq=False)
class Curve(Activation):
    """y = f(x) elementwise for a function convex (or concave) on its domain; subclasses give f, f', the side and the
    domain. `interval` is the exact range (f monotone, or Square's minimum at 0); `lines` the chord and the tangent
    at the middle."""

    size: int
    source: str = ""  # the ONNX node it came from (for messages)

    convex: ClassVar[bool] = True
    increasing: ClassVar[bool | None] = True  # None: not monotone (Square)
    domain: ClassVar[tuple[float, bool] | None] = None  # (a, open): x > a (open) or x ≥ a; None: all reals
    name: ClassVar[str] = ""

    def f(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def df(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.f(h)

    def check(self, l: torch.Tensor, u: torch.Tensor) -> None:
        """OutOfDomain unless every unit's interval lies in the domain (one host read per site)."""
        bad = None
        if self.domain is not None:
            a, open_ = self.domain
            low = l.min() if l.numel() else None
            if low is not None and (bool(low <= a) if open_ else bool(low < a)):
                bad = f"its input's lower bound {float(low):.4g} is not {'>' if open_ else '≥'} {a:g}"
        if bad is None and isinstance(self, Exp) and u.numel() and bool(u.max() > EXP_MAX):
            bad = f"its input's upper bound {float(u.max()):.4g} exceeds {EXP_MAX:g} (exp overflows)"
        if bad is not None:
            raise OutOfDomain(f"{self.name} ({self.source or 'a node'}): {bad} on this box, so it has no finite sound "
                              "relaxation here")

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The range over [l, u]; (−∞, ∞) for a unit whose interval leaves the domain (interval arithmetic goes on
        with it unknown; `lines` refuses it), +∞ where exp overflows."""
        if self.domain is not None:
            a, open_ = self.domain
            out = (l <= a) if open_ else (l < a)
            if bool(out.any()):
                inside = torch.where(out, torch.full_like(l, a + 1.0), l)
                lo, hi = self.interval(inside, torch.maximum(u, inside))
                inf = torch.full_like(l, math.inf)
                return torch.where(out, -inf, lo), torch.where(out, inf, hi)
        fl, fu = self.f(l), self.f(u)
        if self.increasing is True:
            lo, hi = fl, fu
        elif self.increasing is False:
            lo, hi = fu, fl
        else:  # Square: the minimum at 0 when the interval holds it
            lo = torch.where((l <= 0) & (u >= 0), torch.zeros_like(l), torch.minimum(fl, fu))
            hi = torch.maximum(fl, fu)
        lo = lo - (REL_SLACK * lo.abs() + TINY)  # each end widened by its own rounding (an overflow at one end
        hi = hi + (REL_SLACK * hi.abs() + TINY)  # leaves the other finite)
        if self.domain is not None or self.increasing is None:  # ranges ≥ 0 stay ≥ 0 (a reciprocal's, a square's)
            lo = lo.clamp(min=0)
        return lo, hi

    def lines(self, l: torch.Tensor, u: torch.Tensor):
        self.check(l, u)
        fl, fu = self.f(l), self.f(u)
        m = (l + u) / 2
        fm, dm = self.f(m), self.df(m)
        width = u - l
        # the chord anchored at l (its error over [l, u] is that of f(l), f(u) and k·(x − l), whatever the width)
        k = torch.where(width > 0, (fu - fl) / torch.where(width > 0, width, torch.ones_like(width)), self.df(l))
        chord_b = fl - k * l
        tan_b = fm - dm * m
        mag = fl.abs() + fu.abs() + fm.abs() + (k.abs() + dm.abs()) * (l.abs() + u.abs())
        slack = REL_SLACK * mag + TINY
        if self.convex:
            return dm, tan_b - slack, k, chord_b + slack
        return k, chord_b - slack, dm, tan_b + slack

    def gap(self, l: torch.Tensor, u: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """A bound on |f(z') − f(z)| for z in [l, u] and |z' − z| ≤ d (the swap gap through this op): the largest |f'|
        on [l − d, u + d] times d (|f'| is monotone on the domain, so it is largest at an end)."""
        lo, hi = l - d, u + d
        self.check(lo, hi)
        L = torch.maximum(self.df(lo).abs(), self.df(hi).abs())
        return L * d * (1 + REL_SLACK) + TINY


@dataclass(eq=False)
class Exp(Curve):
    name: ClassVar[str] = "Exp"

    def f(self, x):
        return torch.exp(x)

    def df(self, x):
        return torch.exp(x)


@dataclass(eq=False)
class Reciprocal(Curve):
    """1/x on x > 0 (a division by a positive quantity: a softmax's normalising sum, a LayerNorm's deviation)."""

    increasing: ClassVar[bool | None] = False
    domain: ClassVar[tuple[float, bool] | None] = (0.0, True)
    name: ClassVar[str] = "Reciprocal"

    def f(self, x):
        return 1.0 / x

    def df(self, x):
        return -1.0 / (x * x)


@dataclass(eq=False)
class Rsqrt(Curve):
    """1/√x on x > 0 (a LayerNorm's 1/√(var + ε) as one convex function: tighter than √ then 1/x)."""

    increasing: ClassVar[bool | None] = False
    domain: ClassVar[tuple[float, bool] | None] = (0.0, True)
    name: ClassVar[str] = "Rsqrt"

    def f(self, x):
        return torch.rsqrt(x)

    def df(self, x):
        return -0.5 * torch.rsqrt(x) / x


@dataclass(eq=False)
class Sqrt(Curve):
    """√x on x ≥ 0, concave: the chord below, the tangent at the middle above."""

    convex: ClassVar[bool] = False
    domain: ClassVar[tuple[float, bool] | None] = (0.0, False)
    name: ClassVar[str] = "Sqrt"

    def f(self, x):
        return torch.sqrt(x)

    def df(self, x):
        return 0.5 / torch.sqrt(x)  # +inf at 0: only the tangent at a middle > 0 and the chord are used

    def lines(self, l, u):
        al, bl, au, bu = super().lines(l, u)
        point = u <= 0  # the interval [0, 0]: the constant 0
        zero = torch.zeros_like(l)
        return (torch.where(point, zero, al), torch.where(point, zero - TINY, bl), torch.where(point, zero, au),
                torch.where(point, zero + TINY, bu))

    def gap(self, l, u, d):
        lo = (l - d).clamp(min=0)
        # |√a − √b| ≤ √|a − b| always; d/(2√lo) where the interval stays away from 0
        via_slope = torch.where(lo > 0, d / (2 * torch.sqrt(torch.where(lo > 0, lo, torch.ones_like(lo)))), torch.full_like(d, math.inf))
        return torch.minimum(torch.sqrt(d), via_slope) * (1 + REL_SLACK) + TINY


@dataclass(eq=False)
class Square(Curve):
    increasing: ClassVar[bool | None] = None
    name: ClassVar[str] = "Square"

    def f(self, x):
        return x * x

    def df(self, x):
        return 2 * x

    def gap(self, l, u, d):
        # |z'² − z²| = |z' − z|·|z' + z| ≤ d·(2·max|z| + d)
        return d * (2 * torch.maximum(l.abs(), u.abs()) + d) * (1 + REL_SLACK) + TINY


CURVES: dict[str, type[Curve]] = {c.name: c for c in (Exp, Reciprocal, Rsqrt, Sqrt, Square)}


# ---------------------------------------------------------------------------------------------
# products of two variables


class _Bilinear(Activation):
    """An op on the concatenation (x, y) of two operands, bilinear in them: not elementwise, so it gives `relax` (a
    tuple of tensors) and `back` (the coefficients on its input and the constant, given that tuple) instead of
    per-unit lines. `bounds.Bounder` calls those; `milp.encode` calls `milp_rows`."""

    elementwise: ClassVar[bool] = False

    def split(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def relax(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def back(self, A: torch.Tensor, relax: tuple[torch.Tensor, ...], unknown: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """`unknown`: `relax` may hold ±∞ (or its constants may overflow; `_read`); False (the caller checked every tensor
        of `relax` is finite, once per relaxation) skips the guard, a pass over the coefficients per constant."""
        raise NotImplementedError

    def milp_rows(self, l: torch.Tensor, u: torch.Tensor) -> list[tuple[Any, np.ndarray, np.ndarray]]:
        """[(M, lo, hi)]: each lo ≤ z − M·x ≤ hi (x the op's input, z its output), M a scipy matrix (out, in)."""
        raise NotImplementedError

    def lines(self, l, u):
        raise NotImplementedError(f"{type(self).__name__} is not elementwise: its relaxation is `relax`/`back`")


def _read(A: torch.Tensor, c: torch.Tensor, unknown: bool = True) -> torch.Tensor:
    """A·c elementwise, with 0·(±∞) read as 0 where `unknown`: a relaxation's constant overflows on a unit whose interval
    is unknown (±1e300, `bounds.UNKNOWN`: one the output does not depend on keeps interval arithmetic's,
    `Bounder.needed`), and a coefficient of 0 does not read it (a coefficient ≠ 0 gets ∓∞: no bound, as it should)."""
    if not unknown:
        return A * c
    return torch.where(A == 0, torch.zeros((), dtype=A.dtype, device=A.device), A * c)


PLANES = "edge"  # "edge": McCormick's planes through x = x_l (module docstring); "middle": each side's two averaged


def _planes(xl, xu, yl, yu):
    """Per product term x·y: (x's coefficient below, x's above, y's on both sides, the constant below, above)."""
    if PLANES == "middle":
        ym = (yl + yu) / 2
        return ym, ym, (xl + xu) / 2, -(xu * yu + xl * yl) / 2, -(xl * yu + xu * yl) / 2
    return yl, yu, xl, -xl * yl, -xl * yu


@dataclass(eq=False)
class Product(_Bilinear):
    """z = x ⊙ y for two operands of `size` units each; input (x, y) concatenated, 2·size units."""

    size: int
    source: str = ""

    def in_sizes(self) -> tuple[int, ...]:
        return (2 * self.size,)

    @property
    def out_size(self) -> int:
        return self.size

    def split(self, v):
        return v[..., :self.size], v[..., self.size:]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x, y = self.split(h)
        return x * y

    def interval(self, l, u):
        (xl, yl), (xu, yu) = self.split(l), self.split(u)
        c = torch.stack([xl * yl, xl * yu, xu * yl, xu * yu])
        lo, hi = c.min(0).values, c.max(0).values
        slack = REL_SLACK * c.abs().max(0).values + TINY
        return lo - slack, hi + slack

    def relax(self, l, u):
        (xl, yl), (xu, yu) = self.split(l), self.split(u)
        cx_lo, cx_up, cy, gl, gu = _planes(xl, xu, yl, yu)
        slack = REL_SLACK * 4 * torch.maximum(xl.abs(), xu.abs()) * torch.maximum(yl.abs(), yu.abs()) + TINY
        return cx_lo, cx_up, cy, gl - slack, gu + slack

    def back(self, A, relax, unknown: bool = True):
        cx_lo, cx_up, cy, gl, gu = relax
        Ap, An = A.clamp(min=0), A.clamp(max=0)
        const = _read(Ap, gl, unknown).sum(-1) + _read(An, gu, unknown).sum(-1)
        return torch.cat([Ap * cx_lo + An * cx_up, A * cy], dim=-1), const

    def milp_rows(self, l, u):
        from scipy import sparse

        cx_lo, cx_up, cy, gl, gu = (t.numpy() for t in self.relax(l, u))
        inf = np.full(self.size, np.inf)
        below = sparse.hstack([sparse.diags(cx_lo), sparse.diags(cy)], format="csr")
        above = sparse.hstack([sparse.diags(cx_up), sparse.diags(cy)], format="csr")
        return [(below, gl, inf), (above, -inf, gu)]

    def gap(self, l, u, d):
        (xl, yl), (xu, yu) = self.split(l), self.split(u)
        dx, dy = self.split(d)
        mx, my = torch.maximum(xl.abs(), xu.abs()), torch.maximum(yl.abs(), yu.abs())
        # |x'y' − xy| ≤ |x' − x|·|y'| + |x|·|y' − y|
        return (dx * (my + dy) + mx * dy) * (1 + REL_SLACK) + TINY


@dataclass(eq=False)
class BatchMatMul(_Bilinear):
    """Z = A @ B per batch entry: A [b, m, k] and B [b, k, n] (flat, concatenated in that order) → Z [b, m, n]."""

    b: int
    m: int
    k: int
    n: int
    source: str = ""

    def in_sizes(self) -> tuple[int, ...]:
        return (self.b * self.k * (self.m + self.n),)

    @property
    def out_size(self) -> int:
        return self.b * self.m * self.n

    def split(self, v):
        lead = v.shape[:-1]
        na = self.b * self.m * self.k
        return v[..., :na].reshape(*lead, self.b, self.m, self.k), v[..., na:].reshape(*lead, self.b, self.k, self.n)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a, b = self.split(h)
        return (a @ b).reshape(h.shape[0], -1)

    def interval(self, l, u):
        (al, bl), (au, bu) = self.split(l), self.split(u)
        # per product term A_ik·B_kj: the extremes of its four corners, [b, m, k, n], summed over k
        x = torch.stack([al, au])[:, None, :, :, :, None]  # [2, 1, b, m, k, 1]
        y = torch.stack([bl, bu])[None, :, :, None, :, :]  # [1, 2, b, 1, k, n]
        c = (x * y).reshape(4, self.b, self.m, self.k, self.n)
        lo, hi = c.min(0).values.sum(2), c.max(0).values.sum(2)
        slack = REL_SLACK * (self.k + 2) * c.abs().max(0).values.sum(2) + TINY
        return (lo - slack).reshape(-1), (hi + slack).reshape(-1)

    def relax(self, l, u):
        """(B's coefficients below, above: [b, k, n]; A's on both sides: [b, m, k]; the constants below, above:
        [b, m, n]), each term's planes `_planes`'s, summed over k."""
        (al, bl), (au, bu) = self.split(l), self.split(u)
        ma, mb = torch.maximum(al.abs(), au.abs()), torch.maximum(bl.abs(), bu.abs())
        slack = REL_SLACK * 4 * (self.k + 2) * (ma @ mb) + TINY
        if PLANES == "middle":
            am, bm = (al + au) / 2, (bl + bu) / 2
            return bm, bm, am, -(au @ bu + al @ bl) / 2 - slack, -(au @ bl + al @ bu) / 2 + slack
        return bl, bu, al, -(al @ bl) - slack, -(al @ bu) + slack

    def back(self, A, relax, unknown: bool = True):
        b_lo, b_up, a_both, gl, gu = relax
        R = A.shape[0]
        Lam = A.reshape(R, self.b, self.m, self.n)
        Lp, Ln = Lam.clamp(min=0), Lam.clamp(max=0)
        coef_a = Lp @ b_lo.transpose(-1, -2) + Ln @ b_up.transpose(-1, -2)  # [R, b, m, k]
        coef_b = a_both.transpose(-1, -2) @ Lam  # [R, b, k, n]
        const = _read(Lp, gl, unknown).sum((1, 2, 3)) + _read(Ln, gu, unknown).sum((1, 2, 3))
        return torch.cat([coef_a.reshape(R, -1), coef_b.reshape(R, -1)], dim=-1), const

    def milp_rows(self, l, u):
        from scipy import sparse

        b_lo, b_up, a_both, gl, gu = (t.numpy() for t in self.relax(l, u))
        b, m, k, n = self.b, self.m, self.k, self.n
        # row (β, i, j): Σ_k B's coefficient[β, k, j]·A[β, i, k] + a_both[β, i, k]·B[β, k, j]
        B_, I, J, K = np.meshgrid(np.arange(b), np.arange(m), np.arange(n), np.arange(k), indexing="ij")
        row = ((B_ * m + I) * n + J).ravel()
        col_a = ((B_ * m + I) * k + K).ravel()
        col_b = b * m * k + ((B_ * k + K) * n + J).ravel()
        rows, cols = np.concatenate([row, row]), np.concatenate([col_a, col_b])

        def plane(bc):
            vals = np.concatenate([bc[B_, K, J].ravel(), a_both[B_, I, K].ravel()])
            return sparse.csr_matrix((vals, (rows, cols)), shape=(self.out_size, self.in_sizes()[0]))

        inf = np.full(self.out_size, np.inf)
        return [(plane(b_lo), gl.reshape(-1), inf), (plane(b_up), -inf, gu.reshape(-1))]

    def gap(self, l, u, d):
        (al, bl), (au, bu) = self.split(l), self.split(u)
        da, db = self.split(d)
        ma, mb = torch.maximum(al.abs(), au.abs()), torch.maximum(bl.abs(), bu.abs())
        return ((da @ (mb + db) + ma @ db) * (1 + REL_SLACK)).reshape(-1) + TINY


def curve(name: str, size: int, source: str = "") -> Curve:
    return CURVES[name](size, source)


__all__ = ["Curve", "Exp", "Reciprocal", "Rsqrt", "Sqrt", "Square", "Product", "BatchMatMul", "ExpSums", "OutOfDomain", "CURVES",
           "REL_SLACK", "DTYPE", "as_tensor"]


@dataclass(eq=False)
class Variance(_Bilinear):
    """v = mean(c²) + ε per row of R rows × N, c = x − mean x (a LayerNorm's variance). Its input is the concatenation
    (x, c), so that both come with their own (CROWN-tightened) intervals: with c = Px (P the centring, a projection)
    and x in a box of centre x₀ and half-widths r, ‖c‖ ≥ ‖Px₀‖ − ‖P(x − x₀)‖ ≥ ‖Px₀‖ − ‖r‖₂, so
    v ≥ (‖Px₀‖ − ‖r‖₂)₊²/N + ε, the same from c's own box (‖c‖ ≥ ‖c_m‖ − ‖ρ‖₂, c_m and ρ its centre and half-widths),
    besides the separable bound Σ dist(0, [c_l, c_u])²/N + ε of c's intervals (what interval
    arithmetic through Square gives, 0 as soon as every unit's interval holds 0). Lines on c: below, the tangent plane
    at a point t (‖c‖² ≥ 2tᵀc − ‖t‖², for every t): c's centre by default, or with `tangent="near"` each unit's end
    nearest 0 (0 where its interval holds 0: auto_LiRPA's `BoundSqr`), which is never below the separable bound, or
    points given (`Bounder._variance_lower` optimizes them per row of a variance's query); above, the chords
    c_i² ≤ (c_l + c_u)c_i − c_l·c_u."""

    R: int
    N: int
    eps: float
    source: str = ""

    def in_sizes(self) -> tuple[int, ...]:
        return (2 * self.R * self.N,)

    @property
    def out_size(self) -> int:
        return self.R

    def split(self, v):
        n = self.R * self.N
        rows = lambda t: t.reshape(*t.shape[:-1], self.R, self.N)  # noqa: E731
        return rows(v[..., :n]), rows(v[..., n:])

    def forward(self, h):
        _, c = self.split(h)
        return (c * c).mean(-1) + self.eps

    def interval(self, l, u):
        (xl, cl), (xu, cu) = self.split(l), self.split(u)
        sep = torch.where((cl <= 0) & (cu >= 0), torch.zeros_like(cl), torch.minimum(cl * cl, cu * cu)).sum(-1)
        x0 = (xl + xu) / 2
        c0 = x0 - x0.mean(-1, keepdim=True)
        norm = (c0.norm(dim=-1) - ((xu - xl) / 2).norm(dim=-1)).clamp(min=0) ** 2
        # the same from c's own box (centre m, half-widths ρ): ‖c‖ ≥ ‖m‖ − ‖c − m‖ ≥ ‖m‖ − ‖ρ‖₂; tighter where CROWN
        # bounds c closer than x's box does (c = Px from x's correlated units)
        norm_c = (((cl + cu) / 2).norm(dim=-1) - ((cu - cl) / 2).norm(dim=-1)).clamp(min=0) ** 2
        lo = torch.maximum(torch.maximum(sep, norm), norm_c) / self.N + self.eps
        hi = torch.maximum(cl * cl, cu * cu).sum(-1) / self.N + self.eps
        return lo * (1 - 4 * REL_SLACK) - TINY, hi * (1 + 4 * REL_SLACK) + TINY

    @staticmethod
    def tangent_points(cl: torch.Tensor, cu: torch.Tensor, tangent: str) -> torch.Tensor:
        """The lower plane's tangent point of each centred unit over [cl, cu]: "centre", or "near" (its end nearest 0;
        0 where the interval holds 0)."""
        return (cl + cu) / 2 if tangent == "centre" else cl.clamp(min=0) - (-cu).clamp(min=0)

    def relax(self, l, u, tangent: str | torch.Tensor = "centre"):
        """`tangent`: "centre", "near", or the tangent points themselves ([R, N], inside c's intervals: a point outside
        gives a plane that the nearest end's dominates over the box)."""
        (_, cl), (_, cu) = self.split(l), self.split(u)
        c0 = tangent if isinstance(tangent, torch.Tensor) else self.tangent_points(cl, cu, tangent)
        lo_coef = 2 * c0 / self.N
        lo_const = -(c0 * c0).sum(-1) / self.N + self.eps
        up_coef = (cl + cu) / self.N
        up_const = -(cl * cu).sum(-1) / self.N + self.eps
        mag = torch.maximum(cl.abs(), cu.abs())
        slack = 8 * REL_SLACK * ((mag * mag).sum(-1) / self.N + self.eps) + TINY
        return lo_coef.reshape(-1), lo_const - slack, up_coef.reshape(-1), up_const + slack

    def back(self, A, relax, unknown: bool = True):
        lo_coef, lo_const, up_coef, up_const = relax
        Ap, An = A.clamp(min=0), A.clamp(max=0)  # [rows, R]
        lc, uc = lo_coef.reshape(self.R, self.N), up_coef.reshape(self.R, self.N)
        coef = Ap[..., None] * lc + An[..., None] * uc  # [rows, R, N] on c
        return torch.cat([A.new_zeros(A.shape[0], self.R * self.N), coef.reshape(A.shape[0], -1)], -1), \
            _read(Ap, lo_const, unknown).sum(-1) + _read(An, up_const, unknown).sum(-1)

    def milp_rows(self, l, u):
        from scipy import sparse

        lo_coef, lo_const, up_coef, up_const = (t.numpy() for t in self.relax(l, u))
        n = self.R * self.N
        rows = np.repeat(np.arange(self.R), self.N)
        cols = n + np.arange(n)
        shape = (self.R, 2 * n)
        inf = np.full(self.R, np.inf)
        return [(sparse.csr_matrix((lo_coef, (rows, cols)), shape=shape), lo_const, inf),
                (sparse.csr_matrix((up_coef, (rows, cols)), shape=shape), -inf, up_const)]

    def gap(self, l, u, d):
        # |mean(c'²) − mean(c²)| ≤ (‖c'‖ + ‖c‖)·‖c' − c‖/N ≤ (2‖c‖_max + ‖d_c‖)·‖d_c‖/N per row
        (_, cl), (_, cu) = self.split(l), self.split(u)
        _, dc = self.split(d)
        cmax = torch.maximum(cl.abs(), cu.abs()).norm(dim=-1)
        dn = dc.norm(dim=-1)
        return (2 * cmax + dn) * dn / self.N * (1 + REL_SLACK) + TINY


@dataclass(eq=False)
class LayerNormRounding(_Bilinear):
    """y + e, |e| ≤ E: onnxruntime's float32 LayerNormalization of an int8 graph, on the exact one y. Its input is
    the concatenation (y [R·N], x [R·N], v [R]) of the LayerNorm's exact output, its input and its variance + ε
    (graph nodes), so E can use their intervals over the box.

    Derivation (`layer_norm_rounding`; x̃ the runtime's input, |x̃ − x| ≤ e, |x̃| ≤ A, v + ε ≥ V over the box):
    |ỹ − y(x)| ≤ |ỹ − LN(x̃)| + |LN(x̃) − LN(x)|. The second term: LN's Jacobian γ·r·(P − z·zᵀ/N) has row sums
    ≤ |γ|·r·(2 + √N) (Σz² ≤ N), r ≤ 1/√V along the segment. The first: the one-pass sums m̃ and E[x²]~ are within
    γ_{N+2}·A and γ_{N+2}·A² of m and E[x²], so the variance within Δv = γ_{N+2}A² + Δm(2A + Δm) + u(A + Δm)² +
    2.1uA², √(fl(v + ε)) within a relative ρ = τ + u + τu of √(v + ε) (τ = (Δv + u(V + Δv))/V, |√(1 + t) − 1| ≤ |t|),
    x − m̃ within Δc = Δm + u(2A + Δm), the quotient within Δz = Δc·r/(1 − ρ) + √N·ρ/(1 − ρ), and the scale and
    shift add 2.1u·(|γ|(√N + Δq) + |β|). Where ρ ≥ ½ or E exceeds `LN_CAP` of the output's bound, E is ∞ (unknown)."""

    R: int
    N: int
    eps: float
    e_in: torch.Tensor  # [R]: max |x̃ − x| per row (the LayerNorm input's followed error)
    gamma_: torch.Tensor  # [N]
    beta: torch.Tensor  # [N]
    source: str = ""

    def __post_init__(self):
        self.e_in, self.gamma_, self.beta = (as_tensor(t).reshape(-1) for t in (self.e_in, self.gamma_, self.beta))

    def in_sizes(self):
        return (2 * self.R * self.N + self.R,)

    @property
    def out_size(self):
        return self.R * self.N

    def cap(self) -> torch.Tensor:
        from .quantized import LN_CAP

        return LN_CAP * (self.gamma_.abs() * math.sqrt(self.N) + self.beta.abs()) + 1e-30

    def split(self, v):
        n = self.R * self.N
        return v[..., :n], v[..., n:2 * n], v[..., 2 * n:]

    def bound(self, l, u):
        """E per unit on the box the intervals (l, u) of (y, x, v) describe; ∞ beyond `cap` (no bound, or a larger one
        than the reading's magnitudes allow): those units are unknown, which costs nothing where nothing reads them (a
        LayerNorm over every token of which the head reads one)."""
        _, xl, vl = self.split(l)
        _, xu, _ = self.split(u)
        mag = torch.maximum(xl.abs(), xu.abs()).reshape(self.R, self.N) + self.e_in.to(l.dtype)[:, None]
        A = (mag.mean(1), (mag * mag).mean(1), mag.max(1).values)
        from .quantized import layer_norm_rounding

        E = layer_norm_rounding(A, vl, self.e_in.to(l.dtype), self.gamma_.to(l.dtype), self.beta.to(l.dtype),
                                self.N, self.eps)
        beyond = ~(E <= self.cap().to(l.dtype)[None])
        return torch.where(beyond, torch.full_like(E, math.inf), E).reshape(-1)

    def forward(self, h):
        return self.split(h)[0]

    def interval(self, l, u):
        E = self.bound(l, u)
        return self.split(l)[0] - E, self.split(u)[0] + E

    def relax(self, l, u):
        return (self.bound(l, u),)

    def back(self, A, relax, unknown: bool = True):
        (E,) = relax
        rest = A.new_zeros(A.shape[0], self.R * self.N + self.R)
        # an unbounded unit costs −∞ only to the rows that read it (0·∞ is 0 here, not NaN)
        cost = torch.where(A != 0, A.abs() * E, torch.zeros_like(A))
        return torch.cat([A, rest], dim=-1), -cost.sum(-1)

    def milp_rows(self, l, u):
        from scipy import sparse

        E = self.bound(l, u).numpy()
        n = self.R * self.N
        M = sparse.hstack([sparse.identity(n), sparse.csr_matrix((n, n + self.R))], format="csr")
        return [(M, -E, E)]

    def gap(self, l, u, d):
        return self.split(d)[0]


@dataclass(eq=False)
class ExpSums(_Bilinear):
    """s_i = Σ_j exp(x_j − x_i) per row of R rows × T (a softmax's denominators in the exp-reciprocal form: softmax_i =
    1/s_i), as one op on the logits x. Read as a Linear to the T² differences, an Exp on each and a sum, the
    differences are a layer of R·T² units (a 64-token ViT with 2 heads: 549,250, against 8,450 logits) that every
    later back-substitution carries, and CROWN queried each of them (1.1 M rows a softmax).

    Relaxation: the differences' intervals from the logits' (x_j − x_i ∈ [l_j − u_i, u_j − l_i], exactly 0 at j = i),
    the `Exp` lines on each (tangent at the middle below, chord above, each intercept widened as `Curve.lines` does),
    summed over j: s_i ≥ Σ_j al_ij·(x_j − x_i) + bl_ij and s_i ≤ Σ_j au_ij·(x_j − x_i) + bu_ij. `back` applies them to
    coefficient rows Λ [rows, R, T] without the T² layer: x_j gets Σ_i Λ⁺_i·al_ij + Λ⁻_i·au_ij (one batched matrix
    product per row of logits), x_i gets −Λ⁺_i·Σ_j al_ij − Λ⁻_i·Σ_j au_ij."""

    R: int
    T: int
    source: str = ""
    # Below this many differences (R·T²) a reader keeps them an explicit layer: its intervals then come from CROWN,
    # which keeps the correlation of x_j and x_i that [l_j − u_i, u_j − l_i] loses. On deit_tiny 32×2 (R·T² = 500 per
    # softmax) ExpSums alone left a CROWN margin of −0.200 where the explicit layer gives −0.044 (sample 4, ε 0.008).
    MIN_DIFFS = 8192

    def in_sizes(self) -> tuple[int, ...]:
        return (self.R * self.T,)

    @property
    def out_size(self) -> int:
        return self.R * self.T

    def forward(self, h):
        x = h.reshape(h.shape[0], self.R, self.T)
        s = torch.exp(torch.logsumexp(x, -1, keepdim=True) - x)
        return s.reshape(h.shape[0], -1)

    def _diffs(self, l, u):
        """The intervals [dl, du] of x_j − x_i, [R, T(i), T(j)], exactly 0 on the diagonal."""
        l, u = l.reshape(self.R, self.T), u.reshape(self.R, self.T)
        dl = l[:, None, :] - u[:, :, None]
        du = u[:, None, :] - l[:, :, None]
        eye = torch.eye(self.T, dtype=torch.bool, device=l.device)
        zero = torch.zeros_like(dl)
        return torch.where(eye, zero, dl), torch.where(eye, zero, du), eye

    def interval(self, l, u):
        dl, du, _ = self._diffs(l, u)
        el, eu = Exp(dl.numel()).interval(dl.reshape(-1), du.reshape(-1))  # each end widened; +∞ where it overflows
        lo = (el.reshape(dl.shape).sum(-1) * (1 - self.T * REL_SLACK)).clamp(min=1.0)  # exp(x_i − x_i) = 1, the rest > 0
        return lo.reshape(-1), (eu.reshape(du.shape).sum(-1) * (1 + self.T * REL_SLACK)).reshape(-1)

    def relax(self, l, u):
        """The lines above. A sum s_i with some difference above `EXP_MAX` (exp overflows) gets the constant lines
        1 ≤ s_i ≤ ∞ (s_i ≥ exp(0) = 1 always): no finite upper line, which `back` refuses only for rows that read it, so
        the rows of a softmax the output does not depend on (block 1's non-class tokens in a ViT) cost nothing."""
        dl, du, eye = self._diffs(l, u)
        over = (du > EXP_MAX).any(-1)  # [R, T(i)]
        du = du.clamp(max=EXP_MAX)
        dl = torch.minimum(dl, du)
        al, bl, au, bu = (t.reshape(dl.shape) for t in Exp(dl.numel()).lines(dl.reshape(-1), du.reshape(-1)))
        zero, one = torch.zeros_like(al), torch.ones_like(al)
        # exp(x_i − x_i) = 1 exactly: the constant line
        al, au = torch.where(eye, zero, al), torch.where(eye, zero, au)
        bl, bu = torch.where(eye, one, bl), torch.where(eye, one, bu)
        al, au = torch.where(over[..., None], zero, al), torch.where(over[..., None], zero, au)
        # the sums over j of the intercepts, each widened by its own rounding (T terms)
        sl, su = bl.sum(-1), bu.sum(-1)
        slack = REL_SLACK * self.T * (bl.abs().sum(-1) + bu.abs().sum(-1)) + TINY
        sl, su = sl - slack, su + slack
        sl = torch.where(over, torch.ones_like(sl) * (1 - REL_SLACK), sl)
        su = torch.where(over, torch.full_like(su, math.inf), su)
        return al, au, al.sum(-1), au.sum(-1), sl, su

    def back(self, A, relax, unknown: bool = True):
        al, au, al_sum, au_sum, sl, su = relax
        rows = A.shape[0]
        Lam = A.reshape(rows, self.R, self.T)
        Ap, An = Lam.clamp(min=0), Lam.clamp(max=0)
        over = torch.isinf(su)
        if unknown and bool(over.any()):
            if bool((An < 0).logical_and(over).any()):
                raise OutOfDomain(f"Exp ({self.source or 'a softmax'}): a difference of its logits exceeds {EXP_MAX:g} on "
                                  "this box (exp overflows) in a softmax row the bound reads, so that row has no finite "
                                  "sound upper relaxation here")
        # coefficient of x_j: Σ_i Λ⁺_i·al_ij + Λ⁻_i·au_ij, per logit row r a [rows, T] @ [T, T] product
        cj = (Ap.transpose(0, 1) @ al + An.transpose(0, 1) @ au).transpose(0, 1)
        ci = Ap * al_sum + An * au_sum
        const = _read(Ap, sl, unknown).sum((1, 2)) + _read(An, su, unknown).sum((1, 2))
        return (cj - ci).reshape(rows, -1), const

    def _planes(self, a, a_sum):
        from scipy import sparse

        R, T = self.R, self.T
        r, i, j = np.meshgrid(np.arange(R), np.arange(T), np.arange(T), indexing="ij")
        rows = (r * T + i).ravel()
        vals = np.concatenate([a.reshape(-1), -a_sum.reshape(-1)])
        cols = np.concatenate([(r * T + j).ravel(), np.arange(R * T)])
        return sparse.csr_matrix((vals, (np.concatenate([rows, np.arange(R * T)]), cols)), shape=(R * T, R * T))

    def milp_rows(self, l, u):
        al, au, al_sum, au_sum, sl, su = (t.numpy() for t in self.relax(l, u))
        inf = np.full(self.R * self.T, np.inf)
        return [(self._planes(al, al_sum), sl.reshape(-1), inf), (self._planes(au, au_sum), -inf, su.reshape(-1))]

    def gap(self, l, u, d):
        # |s'_i − s_i| ≤ Σ_j max exp over [dl − δ, du + δ] · δ_ij, δ_ij = d_i + d_j how far x_j − x_i moves
        dl, du, eye = self._diffs(l, u)
        dd = d.reshape(self.R, self.T)
        delta = torch.where(eye, torch.zeros_like(dl), dd[:, None, :] + dd[:, :, None])
        hi = du + delta
        if bool(hi.max() > EXP_MAX):
            raise OutOfDomain(f"Exp ({self.source or 'a softmax'}): its swap gap needs exp of {float(hi.max()):.4g}")
        return ((torch.exp(hi) * delta).sum(-1) * (1 + self.T * REL_SLACK)).reshape(-1) + TINY
