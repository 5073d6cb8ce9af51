"""ReLU and the piecewise-linear activations: each with its forward, its interval, its CROWN lines (the upper chord and
an α-optimized lower line through the kink, as CROWN and auto_LiRPA's `BoundRelu` choose), and, for ReLU, the fixed
lines branch and bound reuses over its optimization steps (`ReluLines`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .base import Activation


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

    def gap(self, l: torch.Tensor, u: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return torch.where(u + d <= 0, torch.zeros_like(d), d)  # 1-Lipschitz, and 0 where dead on the widened interval
