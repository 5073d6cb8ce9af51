"""Elementwise curves convex or concave on their domain (`Curve`): `Exp`, `Reciprocal` (x > 0), `Sqrt` (x ≥ 0), `Rsqrt`
(1/√x, x > 0) and `Square`. Over an input interval [l, u] the chord through (l, f(l)) and (u, f(u)) is on one side of
f and the tangent at the middle m = (l + u)/2 on the other (auto_LiRPA's `BoundExp`, `BoundReciprocal`, `BoundSqrt`
choose the same lines; the middle is the tangent point of least area between line and curve, since the area's
derivative in m is f''(m)·((l + u)/2 − m)).

Floating point: the lines are computed in float64 from torch's exp/sqrt/reciprocal (within a few ulps); each intercept
is moved outward by `REL_SLACK` times the magnitudes involved plus `TINY`, far more than the rounding of the line's
coefficients (relative 1e-16) and of the functions (tests/test_verify_nonlinear.py samples each relaxation densely in
float64, each side apart, and checks exp against mpmath).

An input interval outside an op's domain (a divisor whose lower bound is ≤ 0 on the box, an exp argument above
`EXP_MAX`) has no sound finite relaxation: `OutOfDomain`, one line naming the node and the interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Activation, OutOfDomain

REL_SLACK = 2.0 ** -40  # relative widening of every intercept (~9e-13; the rounding it covers is ~1e-15)
TINY = 1e-300
EXP_MAX = 700.0  # exp overflows float64 just above 709.78


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



def curve(name: str, size: int, source: str = "") -> Curve:
    return CURVES[name](size, source)

