"""ReLU and the piecewise-linear activations: each with its forward, its interval, its CROWN lines (the upper chord and
an α-optimized lower line through the kink, as CROWN and auto_LiRPA's `BoundRelu` choose), and, for ReLU, the fixed
lines branch and bound reuses over its optimization steps (`ReluLines`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .base import Activation
from .curves import REL_SLACK, TINY


@dataclass
class ReluLines:
    """A ReLU site's relaxation on fixed intervals l < 0 < u (crossing) or stable, all but the lower slope: computed
    once for the many passes of an optimization over the same intervals (branch and bound's Adam steps)."""

    cross: torch.Tensor
    active: torch.Tensor  # 1 where l ≥ 0
    au: torch.Tensor  # upper line u/(u − l)·(x − l) on crossing units, the identity or 0 elsewhere
    bu: torch.Tensor
    al0: torch.Tensor  # CROWN's lower slope (1 where u > −l) when no slopes are given

    @classmethod
    def of(cls, l: torch.Tensor, u: torch.Tensor) -> "ReluLines":
        cross = (l < 0) & (u > 0)
        active = (l >= 0).to(l.dtype)
        au = torch.where(cross, u / (u - l).clamp(min=torch.finfo(l.dtype).tiny), active)
        bu = torch.where(cross, -l * au, torch.zeros_like(l))
        return cls(cross, active, au, bu, torch.where(cross, (u > -l).to(l.dtype), active))

    def lines(self, slopes: torch.Tensor | None = None):
        """(al, bl, au, bu): bl is None, the lower line passing through 0."""
        return (self.al0 if slopes is None else torch.where(self.cross, slopes, self.active)), None, self.au, self.bu


@dataclass(eq=False)
class ReLU(Activation):
    size: int
    source: str = ""  # the ONNX tensor feeding it, when read from ONNX (Marabou's name for those variables)

    branchable: ClassVar[bool] = True
    alpha_bounds: ClassVar[bool] = True
    exact_interval: ClassVar[bool] = True
    float32_rows: ClassVar[str | None] = "sign"

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.clamp(min=0)

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return l.clamp(min=0), u.clamp(min=0)

    def crown_lines(self, l: torch.Tensor, u: torch.Tensor, slopes: Any = None, exact: bool = True):
        return ReluLines.of(l, u).lines(slopes)  # bl None: the lower line passes through 0

    def optimizable(self) -> bool:
        return True

    def initial_slopes(self, lines: tuple, rows: int):
        return lines[0].expand(rows, -1).clone()  # the lower slope only: the upper chord is optimal

    def project(self, slopes, l: torch.Tensor, u: torch.Tensor) -> None:
        slopes.data.clamp_(0.0, 1.0)

    def query(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return torch.nonzero((l < 0) & (u > 0)).flatten()  # a stable unit's lines are exact whatever its interval

    def unstable(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return (l < 0) & (u > 0)

    def constant(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return u <= 0  # dead: both lines 0 (`ReluLines`), whatever α chooses

    def fixed(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return (u <= 0) | (l >= 0)

    def gap(self, l: torch.Tensor, u: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return torch.where(u + d <= 0, torch.zeros_like(d), d)  # 1-Lipschitz, and 0 where dead on the widened interval


@dataclass(eq=False)
class HardSwish(Activation):
    """y = x·clip(x/6 + ½, 0, 1) (ONNX HardSwish, MobileNetV3): 0 below −3, x(x + 3)/6 on [−3, 3], x above 3; not
    piecewise linear, and neither convex nor concave (f' drops at both kinks). Its lines take any slope a with exact
    intercepts: f(x) − a·x is linear, convex-quadratic, linear on the three pieces, so its max over [l, u] is at l, u or
    a kink, and its min there or at the quadratic's stationary point x = 3a − 3/2 (clipped to that piece within [l, u]);
    each intercept is widened by its own float64 rounding. CROWN's slopes are the least-area ones among the chord and
    f' at l, the middle and u (as for the gates); α-CROWN moves them within f''s range [−½, 3/2]."""

    size: int
    source: str = ""

    SLOPES: ClassVar[tuple[float, float]] = (-0.5, 1.5)  # the range of f'

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * (h / 6 + 0.5).clamp(0, 1)

    @staticmethod
    def _df(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x <= -3, torch.zeros_like(x), torch.where(x >= 3, torch.ones_like(x), (2 * x + 3) / 6))

    def _intercepts(self, l: torch.Tensor, u: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(min, max) over [l, u] of f(x) − a·x, widened outward by their rounding; a broadcasts against l."""
        l, u = l.expand_as(a), u.expand_as(a)
        inner = torch.minimum(torch.maximum(3 * a - 1.5, l.clamp(min=-3)), u.clamp(max=3))
        pts = torch.stack([l, u, (-3.0 + 0 * l).clamp(l, u), (3.0 + 0 * l).clamp(l, u),
                           torch.minimum(torch.maximum(inner, l), u)])
        e = self.forward(pts) - a * pts
        slack = REL_SLACK * (self.forward(pts).abs() + (a * pts).abs()).amax(0) + TINY
        return e.amin(0) - slack, e[:4].amax(0) + slack

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._intercepts(l, u, torch.zeros_like(l))

    def lines(self, l: torch.Tensor, u: torch.Tensor):
        return self.crown_lines(l, u)

    def crown_lines(self, l: torch.Tensor, u: torch.Tensor, slopes: Any = None, exact: bool = True):
        if slopes is None:
            width, mid = u - l, (l + u) / 2
            chord = torch.where(width > 0, (self.forward(u) - self.forward(l)) / width.clamp(min=1e-300), self._df(mid))
            cands = torch.stack([chord, self._df(l), self._df(mid), self._df(u)])
            lo, hi = self._intercepts(l, u, cands)
            # the area between line and curve over [l, u] is ordered as the lines' values at the middle
            a_lo = cands.gather(0, torch.argmax(cands * mid + lo, 0, keepdim=True))[0]
            a_up = cands.gather(0, torch.argmin(cands * mid + hi, 0, keepdim=True))[0]
        else:
            a_lo, a_up = torch.broadcast_tensors(*slopes)
        lo, hi = self._intercepts(l, u, torch.stack([a_lo, a_up]))
        return a_lo, lo[0], a_up, hi[1]

    def optimizable(self) -> bool:
        return True

    def project(self, slopes, l: torch.Tensor, u: torch.Tensor) -> None:
        for q in slopes:
            q.data.clamp_(*self.SLOPES)

    def gap(self, l: torch.Tensor, u: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return max(abs(v) for v in self.SLOPES) * d  # |f'| ≤ 3/2
