"""Standalone smooth activations anywhere in a graph: Sigmoid, Tanh, Softplus, Elu, Selu, Softsign and Erf (`FUNCTIONS`),
each a `Smooth` op with sound linear relaxations on an input interval, slopes α-CROWN may optimize, and input intervals
branch and bound may split (`smooth_bab`). The self-gated ones (SiLU x·σ(x), GELU x·Φ(x), Mish x·tanh(softplus(x)))
are gates at λ = 1 (`gates.Gate`).

Every function here is increasing, and its derivative f' is monotone on each piece between its `breaks` (sigmoid,
tanh, softsign, erf: rising below 0, falling above, the S shape; softplus: rising everywhere; elu, selu: rising below
0 and constant above, with a jump at 0). The relaxation is the one `gates` gives the gates, for any slope a:

    f(y) ≤ a·y + max_[l,u](f(y) − a·y),      f(y) ≥ a·y + min_[l,u](f(y) − a·y),

where the extremes of e(y) = f(y) − a·y lie at l, u, a break inside [l, u], or where f'(y) = a, at most one point per
monotone piece, found by bisection; the bracket's width times max |f' − a| at its ends bounds what the bisection
misses. So each line is sound whatever its slope, and a slope is only a choice of tightness: CROWN's choice among
the secant and the tangents at l, the middle and u (the least area between line and curve, DeepPoly's rule, which
picks the secant and the middle tangent on a convex or concave piece and the tangents through an end on an S-shaped
crossing interval, as auto_LiRPA's BoundSigmoid), and α-CROWN's optimized slopes within [min f', max f'] on [l, u]
(the intercept's gradient in a is −y*, the envelope theorem). A slope a is a tangent point: the point where f' = a.

Floating point: f is evaluated in float64 by torch (sigmoid, tanh, expm1, log1p, erf: within a few ulps, measured
against mpmath in tests/test_verify_smooth.py), and every candidate's value is widened by `G_REL_ERROR` of the
magnitudes involved plus `TINY` (the gates' slack, far above that error). An end at ±∞ has lines of slope 0 through
the function's limits there (±∞ where it has none).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import DTYPE, Activation, UnsupportedModel
from .gates import BISECT_STEPS, G_REL_ERROR, OPT_BISECT_STEPS, TINY, extreme, extremes, least_area_slopes

SQRT_PI = math.sqrt(math.pi)
# a closed-form root of f' = a is used with this relative bracket around it: its slack (bracket width × the largest
# |f' − a| at its ends, ~ f''·width²) is far below the rounding slack, and the bracket is wide enough that the sign
# check across it is not lost in f''s own rounding
ROOT_BRACKET = 1e-7


@dataclass(frozen=True)
class Function:
    """An increasing f with f' monotone on each piece between `breaks` (`rising[i]`: f' nondecreasing on piece i)."""

    name: str
    f: Callable[[torch.Tensor], torch.Tensor]
    df: Callable[[torch.Tensor], torch.Tensor]
    breaks: tuple[float, ...]
    rising: tuple[bool, ...]
    limits: tuple[float, float]  # f(−∞), f(+∞)
    # per piece, the y where f' = a in closed form, a with a leading piece axis (NaN or anything where there is none:
    # `_roots` checks each against f' and bisects where it fails); None: bisection only
    inverse: Callable[[torch.Tensor], torch.Tensor] | None = None

    def at(self, y: torch.Tensor) -> torch.Tensor:
        """f, with its limits at ±∞."""
        out = self.f(torch.where(torch.isfinite(y), y, torch.zeros_like(y)))
        return torch.where(y == -math.inf, torch.full_like(y, self.limits[0]),
                           torch.where(y == math.inf, torch.full_like(y, self.limits[1]), out))


def _softplus(y: torch.Tensor) -> torch.Tensor:
    # torch's F.softplus returns y itself above 20 (off by e^-20 ≈ 2e-9), so the exact form in both tails
    return y.clamp(min=0) + torch.log1p(torch.exp(-y.abs()))


def _sigmoid_df(y: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(y) * torch.sigmoid(-y)


def _tanh_df(y: torch.Tensor) -> torch.Tensor:
    # 1 − tanh² = 4σ(2y)σ(−2y), accurate in both tails (1 − tanh² cancels to 0 there)
    return 4.0 * torch.sigmoid(2 * y) * torch.sigmoid(-2 * y)


def _symmetric(y0: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The roots −y0(a₀), y0(a₁) of f' = a on the two pieces of an S-shaped f with f' even (a: [2, ...], per piece)."""
    def inverse(a: torch.Tensor) -> torch.Tensor:
        r = y0(a).clamp(min=0)
        return torch.stack([-r[0], r[1]])
    return inverse


def _sigmoid_root(a: torch.Tensor) -> torch.Tensor:
    # σ(1 − σ) = a: σ = (1 − √(1 − 4a))/2 = 2a/(1 + √(1 − 4a)) (no cancellation for small a), y = logit σ ≤ 0
    s = (2 * a / (1 + (1 - 4 * a).clamp(min=0).sqrt())).clamp(max=0.5)
    return torch.log1p(-s) - torch.log(s)


def _tanh_root(a: torch.Tensor) -> torch.Tensor:
    # 1 − t² = a: atanh t = ½ log((1 + t)/(1 − t)) = log(1 + t) − ½ log a, since (1 − t)(1 + t) = a
    return torch.log1p((1 - a).clamp(min=0).sqrt()) - 0.5 * torch.log(a)


def _elu(alpha: float, gamma: float = 1.0) -> tuple[Callable, Callable]:
    def f(y: torch.Tensor) -> torch.Tensor:
        return gamma * torch.where(y > 0, y, alpha * torch.expm1(y.clamp(max=0)))

    def df(y: torch.Tensor) -> torch.Tensor:
        return gamma * torch.where(y > 0, torch.ones_like(y), alpha * torch.exp(y.clamp(max=0)))

    return f, df


def _function(name: str, alpha: float = 1.0, gamma: float = 1.0) -> Function:
    s_shape = ((0.0,), (True, False))
    if name == "sigmoid":
        return Function(name, torch.sigmoid, _sigmoid_df, *s_shape, (0.0, 1.0), _symmetric(_sigmoid_root))
    if name == "tanh":
        return Function(name, torch.tanh, _tanh_df, *s_shape, (-1.0, 1.0), _symmetric(_tanh_root))
    if name == "softsign":
        return Function(name, lambda y: y / (1 + y.abs()), lambda y: (1 + y.abs()) ** -2, *s_shape, (-1.0, 1.0),
                        _symmetric(lambda a: a.rsqrt() - 1))
    if name == "erf":
        return Function(name, torch.erf, lambda y: (2 / SQRT_PI) * torch.exp(-y * y), *s_shape, (-1.0, 1.0),
                        _symmetric(lambda a: torch.log(2 / (SQRT_PI * a)).clamp(min=0).sqrt()))
    if name == "softplus":
        return Function(name, _softplus, torch.sigmoid, (), (True,), (0.0, math.inf),
                        lambda a: torch.log(a) - torch.log1p(-a))
    if name in ("elu", "selu"):
        if not alpha >= 0 or not gamma > 0:
            raise UnsupportedModel(f"{name} with alpha {alpha} and gamma {gamma}: alpha ≥ 0 and gamma > 0 are read",
                                   what=f"{name} with alpha {alpha}, gamma {gamma}")
        return Function(name, *_elu(alpha, gamma), (0.0,), (True, True), (-gamma * alpha, math.inf))
    raise UnsupportedModel(f"unknown smooth activation {name!r}; known: {', '.join(KINDS)}")


KINDS = ("sigmoid", "tanh", "softplus", "elu", "selu", "softsign", "erf")
SELU_ALPHA = 1.6732632423543772848170429916717  # ONNX Selu's defaults
SELU_GAMMA = 1.0507009873554804934193349852946


@functools.lru_cache(maxsize=None)
def function(name: str, alpha: float = 1.0, gamma: float = 1.0) -> Function:
    """The `Function` of one activation (elu: alpha; selu: alpha, gamma), built once."""
    return _function(name, alpha, gamma)


# ---------------------------------------------------------------------------------------------
# exact extremes of f(y) − a·y over [L, U]


def _roots(fn: Function, L: torch.Tensor, U: torch.Tensor, a: torch.Tensor, steps: int):
    """Per piece (a leading axis): the root of f' = a in [L, U] ∩ piece, or NaN where there is none; the bracket's slack.
    A closed-form root (`Function.inverse`) is taken with a bracket of relative width `ROOT_BRACKET` around it where f'
    − a changes sign across that bracket; elsewhere (and for functions without one) one bisection over every piece."""
    edges = (-math.inf, *fn.breaks, math.inf)
    P = len(fn.rising)
    view = (P, *([1] * L.dim()))
    p0 = torch.tensor(edges[:-1], dtype=DTYPE, device=L.device).view(view)
    q0 = torch.tensor(edges[1:], dtype=DTYPE, device=L.device).view(view)
    rising = torch.tensor(fn.rising, device=L.device).view(view)
    p, q = torch.maximum(L, p0), torch.minimum(U, q0)
    a = a.expand_as(p)  # one slope for every piece, or one per piece
    fp, fq = fn.df(p) - a, fn.df(q) - a
    has = (p < q) & torch.where(rising, (fp <= 0) & (fq >= 0), (fp >= 0) & (fq <= 0))
    Lx = L.expand_as(p)
    lo, hi = torch.where(has, p, Lx), torch.where(has, q, Lx)

    def brackets(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """Where f' − a changes sign across [lo, hi] the way the piece's root needs."""
        flo, fhi = fn.df(lo) - a, fn.df(hi) - a
        return torch.where(rising, (flo <= 0) & (fhi >= 0), (flo >= 0) & (fhi <= 0))

    bisect = steps
    if fn.inverse is not None:
        r = torch.nan_to_num(fn.inverse(a), nan=0.0)
        r = torch.minimum(torch.maximum(r, lo), hi)
        d = ROOT_BRACKET * (1 + r.abs())
        rlo, rhi = torch.maximum(r - d, lo), torch.minimum(r + d, hi)
        ok = brackets(rlo, rhi)
        lo, hi = torch.where(ok, rlo, lo), torch.where(ok, rhi, hi)
        if not bool((has & ~ok).any()):  # one read: every root bracketed, nothing to bisect
            bisect = 0
    for _ in range(bisect):
        mid = 0.5 * (lo + hi)
        go_up = ((fn.df(mid) - a) < 0) == rising  # the root lies above mid on a rising piece where f' < a
        lo, hi = torch.where(go_up, mid, lo), torch.where(go_up, hi, mid)
    root = torch.where(has, 0.5 * (lo + hi), torch.full_like(lo, math.nan))
    slack = torch.where(has, (hi - lo) * torch.maximum((fn.df(lo) - a).abs(), (fn.df(hi) - a).abs()), torch.zeros_like(lo))
    return root, slack


def intercepts(fn: Function, L: torch.Tensor, U: torch.Tensor, a: torch.Tensor,
               steps: int = BISECT_STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of f(y) − a·y over y ∈ [L, U] (finite ends), widened by the bisection and rounding slack: the lines
    a·y + min and a·y + max hold on [L, U]. Differentiable in `a` (envelope theorem)."""
    L, U, a = torch.broadcast_tensors(L, U, a)
    with torch.no_grad():
        root, slack = _roots(fn, L, U, a.detach(), steps)
        cands = [L[None], U[None], torch.where(torch.isnan(root), L, root)]
        slacks = [torch.zeros_like(L)[None].expand(2, *L.shape), slack]
        if fn.breaks:  # a kink's value (elu's jump of f'), where no root of f' = a need be
            b = torch.tensor(fn.breaks, dtype=DTYPE, device=L.device).view(len(fn.breaks), *([1] * L.dim()))
            cands.append(torch.minimum(torch.maximum(b, L), U))
            slacks.append(torch.zeros_like(cands[-1]))
        P, S = torch.cat(cands), torch.cat(slacks)
    return extremes(fn.f, P, S, a)


def line_intercepts(fn: Function, L: torch.Tensor, U: torch.Tensor, a_lo: torch.Tensor, a_up: torch.Tensor,
                    steps: int = BISECT_STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    """(min of f − a_lo·y, max of f − a_up·y) over [L, U] (finite ends), widened as `intercepts`: the two lines'
    intercepts, each side from its own candidates only. Inside a piece f − a·y has its local minima where f' = a with
    f' rising and its maxima where f' falls, so one root per piece, for the slope of the side it can serve."""
    L, U, a_lo, a_up = torch.broadcast_tensors(L, U, a_lo, a_up)
    with torch.no_grad():
        rising = torch.tensor(fn.rising, device=L.device).view(len(fn.rising), *([1] * L.dim()))
        root, slack = _roots(fn, L, U, torch.where(rising, a_lo.detach(), a_up.detach()), steps)
        root = torch.where(torch.isnan(root), L, root)
        ends = [L[None], U[None]]
        if fn.breaks:
            b = torch.tensor(fn.breaks, dtype=DTYPE, device=L.device).view(len(fn.breaks), *([1] * L.dim()))
            ends.append(torch.minimum(torch.maximum(b, L), U))
        E = torch.cat(ends)
        zero = torch.zeros_like(E)

        def side(rises: bool) -> tuple[torch.Tensor, torch.Tensor]:  # the ends, breaks and the side's own roots
            own = [i for i, r in enumerate(fn.rising) if r == rises]
            return torch.cat([E, *(root[i:i + 1] for i in own)]), torch.cat([zero, *(slack[i:i + 1] for i in own)])

        lo_pts, up_pts = side(True), side(False)
    return extreme(fn.f, *lo_pts, a_lo, upper=False), extreme(fn.f, *up_pts, a_up, upper=True)


def interval(fn: Function, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The range of f over [l, u] (f increasing), each end widened by its rounding."""
    lo, hi = fn.at(l), fn.at(u)
    return lo - (G_REL_ERROR * lo.abs() + TINY), hi + (G_REL_ERROR * hi.abs() + TINY)


def slope_range(fn: Function, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of f' on [l, u] (finite ends): at the ends or at a break inside (f' monotone between breaks)."""
    dl, du = fn.df(l), fn.df(u)
    lo, hi = torch.minimum(dl, du), torch.maximum(dl, du)
    for b in fn.breaks:
        inside = (l <= b) & (b <= u)
        bt = torch.full_like(l, b)
        for side in (fn.df(bt), fn.df(torch.nextafter(bt, bt - 1)), fn.df(torch.nextafter(bt, bt + 1))):
            lo, hi = torch.where(inside, torch.minimum(lo, side), lo), torch.where(inside, torch.maximum(hi, side), hi)
    return lo, hi


def default_slopes(fn: Function, L: torch.Tensor, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) slopes of least area among the secant and the tangents at L, the middle and U (finite ends)."""
    return least_area_slopes(fn.f, fn.df, lambda l, u, a: intercepts(fn, l, u, a, OPT_BISECT_STEPS), L, U)


def lines(fn: Function, l: torch.Tensor, u: torch.Tensor, slopes: tuple[torch.Tensor, torch.Tensor] | None = None,
          steps: int = BISECT_STEPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(al, bl, au, bu) with al·y + bl ≤ f(y) ≤ au·y + bu on [l, u]: CROWN's slopes, or the given (lower, upper) slopes.
    A unit with an infinite end gets slope 0 through f's range."""
    if slopes is None:
        l, u = torch.broadcast_tensors(l, u)
    else:  # per row: [rows, n] slopes on [n] intervals
        a_lo, a_up, l, u = torch.broadcast_tensors(*slopes, l, u)
    finite = torch.isfinite(l) & torch.isfinite(u)
    L, U = torch.where(finite, l, torch.zeros_like(l)), torch.where(finite, u, torch.zeros_like(u))
    if slopes is None:
        a_lo, a_up = default_slopes(fn, L, U)
    bl, bu = line_intercepts(fn, L, U, a_lo, a_up, steps)
    if not bool(finite.all()):
        rlo, rhi = interval(fn, l, u)
        zero = torch.zeros_like(L)
        a_lo, a_up = torch.where(finite, a_lo, zero), torch.where(finite, a_up, zero)
        bl, bu = torch.where(finite, bl, rlo), torch.where(finite, bu, rhi)
    return a_lo, bl, a_up, bu


# ---------------------------------------------------------------------------------------------
# the op


@dataclass(eq=False)
class Smooth(Activation):
    """y = f(x) elementwise, f one of `KINDS` (elu: `alpha`; selu: `alpha`, `gamma`)."""

    size: int
    kind: str
    alpha: float = 1.0
    gamma: float = 1.0
    source: str = ""  # the ONNX node it came from (for messages)

    # branch and bound splits its units' input intervals at a point (`smooth_bab`), not at 0 with ReLU's rules
    splittable: ClassVar[bool] = True
    # every unit's lines tighten with its interval (none is ever stable), so α-CROWN optimizes the intervals too
    alpha_bounds: ClassVar[bool] = True
    # its slopes live in f''s range on the interval, a sigmoid's within [0, ¼]: a ReLU-sized Adam step (≈ lr) jumps across
    # it, and the optimized bounds end far looser; 1/20 of ReLU's did best of the rates tried on the public sigmoid MLP
    # (benchmarks/peers/eran-sigmoid-30s/README.md)
    alpha_lr: ClassVar[float] = 0.05
    skip_near_exact: ClassVar[bool] = True

    def __post_init__(self) -> None:
        function(self.kind, self.alpha, self.gamma)  # an unknown kind is refused when the graph is built

    @property
    def fn(self) -> Function:
        return function(self.kind, self.alpha, self.gamma)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fn.f(h)

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return interval(self.fn, l, u)

    def lines(self, l: torch.Tensor, u: torch.Tensor):
        return lines(self.fn, l, u)

    def crown_lines(self, l: torch.Tensor, u: torch.Tensor, slopes=None, exact: bool = True):
        """CROWN's lines, or α-CROWN's with `slopes` = (lower, upper) per unit or per row."""
        return lines(self.fn, l, u, slopes, BISECT_STEPS if exact else OPT_BISECT_STEPS)

    def optimizable(self) -> bool:
        return True

    def slope_range(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where α's slopes are worth having: f' on [l, u] (0 where an end is infinite)."""
        finite = torch.isfinite(l) & torch.isfinite(u)
        zero = torch.zeros_like(l)
        lo, hi = slope_range(self.fn, torch.where(finite, l, zero), torch.where(finite, u, zero))
        return torch.where(finite, lo, zero), torch.where(finite, hi, zero)

    def project(self, slopes, l: torch.Tensor, u: torch.Tensor) -> None:
        lo, hi = self.slope_range(l, u)
        for q in slopes:
            q.data.copy_(torch.maximum(torch.minimum(q.data, hi.to(q.dtype)), lo.to(q.dtype)))

    def unstable(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The units whose lines are not exact: a split of their interval tightens them."""
        return u > l

    def gap(self, l: torch.Tensor, u: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """A bound on |f(z') − f(z)| for z in [l, u] and |z' − z| ≤ d: the largest f' on [l − d, u + d] times d."""
        _, top = self.slope_range(l - d, u + d)
        top = torch.where(torch.isfinite(l - d) & torch.isfinite(u + d), top, torch.full_like(top, math.inf))
        return top * d * (1 + G_REL_ERROR) + TINY
