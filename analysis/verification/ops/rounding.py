"""The int8 graph's roundings: `Rounding` (y = x + e, |e| ≤ E, optionally on a grid) and `QuantizedInput` (the first
quantization of the graph input), each with its interval, CROWN lines and, for a grid, the staircase hull's lines
α-CROWN may choose among and the index ranges branch and bound splits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from pipeline.numerics import U

from .base import Activation, as_tensor


@dataclass(eq=False)
class Rounding(Activation):
    """y = x + e for some |e| ≤ E (per unit): what rounding to a quantization grid, and the float32 arithmetic around
    it, may add to an exact value (`quantized.requant_error` derives E; the clamp to the grid's range follows as ReLUs).

    Without a grid (`step` None: the output DequantizeLinear's float32 product) the relaxation is x − E ≤ y ≤ x + E on
    any interval. With one, y is a multiple of the grid step s (y = s·k, k = round(t/s), |t − x| ≤ E − s/2 the
    arithmetic before the rounding), so over an input interval [l, u] k lies in [⌈(l − E')/s − ½⌉, ⌊(u + E')/s + ½⌋]
    (E' = E − s/2; ties either way): a unit whose interval stays inside one grid cell has an exact, constant value,
    and the clamp's ReLUs after it see the snapped range (a unit just below a grid point's half step is dead, not
    unstable). CROWN's lines are, per side, x ± E or the snapped end, whichever is tighter at the interval's middle;
    α-CROWN may choose per row among every supporting line of the staircase's hull (`hull_lines`,
    `OPTIMIZE`, off by default).

    `forward` is the surrogate an attack searches on: the grid value s·round(x/s) (x itself without a grid), with
    the identity's gradient. A point it finds counts only once the int8 model itself misclassifies it."""

    E: torch.Tensor
    step: torch.Tensor | None = None  # per unit, the grid step s as a float64 (None: no grid)
    source: str = ""

    # slack on k's bounds, in grid steps: (l − E')/s in float64 is off by ~1e-16 of its size (≤ 1e-12 for the ranges
    # an int8 grid spans); a value right at a half step may round either way, so the bounds must never move inward
    SNAP_SLACK: ClassVar[float] = 1e-9

    # `loose`: a unit over more grid steps than this keeps x ± E; CROWN's query of it would change no line unless it
    # made the interval under two steps (on the int8 CNN's second conv CROWN's interval was 0.87–0.97 of interval
    # arithmetic's at the median), docs/EXPERIMENTS.md "int8 roundings queried only where an interval moves a line"
    LOOSE_STEPS: ClassVar[float] = 4.0

    # α-CROWN also chooses a grid's lines among the staircase hull's (`hull_lines`). Off: each step costs 45% more, and
    # within the int8 verify budget the margins it reached came out lower than without it on most open properties
    # (benchmarks/int8-results/hull-*.json)
    OPTIMIZE: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.E = as_tensor(self.E).reshape(-1)
        if not bool(torch.all(self.E >= 0)):
            raise ValueError("a rounding error bound must be >= 0")
        if self.step is not None:
            self.step = as_tensor(self.step).reshape(-1).expand_as(self.E).clone()
            if not bool(torch.all((self.step > 0) & (self.E >= self.step / 2))):
                raise ValueError("a grid's step must be > 0 and its rounding error bound at least half of it")

    @property
    def needs_bounds(self) -> bool:  # type: ignore[override]
        return self.step is not None

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.E.numel()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.step is None:
            return h
        s = self.step.to(h.dtype)
        return h + (torch.round(h / s) * s - h).detach()

    def k_range(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The grid indices k the output may take over the input interval [l, u] (floats holding integers)."""
        s, E = self.step.to(l.dtype), self.E.to(l.dtype)
        inner = E - s / 2
        return (torch.ceil((l - inner) / s - 0.5 - self.SNAP_SLACK),
                torch.floor((u + inner) / s + 0.5 + self.SNAP_SLACK))

    def _snapped(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s, E = self.step.to(l.dtype), self.E.to(l.dtype)
        klo, khi = self.k_range(l, u)
        return torch.maximum(klo * s, l - E), torch.minimum(khi * s, u + E)

    def crown_lines(self, l: torch.Tensor, u: torch.Tensor, slopes: Any = None, exact: bool = True):
        return self.lines(l, u) if slopes is None else self.hull_lines(l, u, slopes)

    def optimizable(self) -> bool:
        return self.OPTIMIZE and self.step is not None

    def project(self, slopes, l: torch.Tensor, u: torch.Tensor) -> None:
        for q, (low, top) in zip(slopes, self.slope_range(l, u)):
            q.data.copy_(torch.minimum(torch.maximum(q.data, low.to(q.dtype)), top.to(q.dtype)))

    def query(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        if self.step is None:
            return torch.arange(0, device=l.device)  # x ± E whatever the interval
        return torch.nonzero(~self.settled(l, u)).flatten()

    def settled(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Units whose interval already has one value on the grid: a tighter interval changes nothing of theirs, so
        CROWN does not bound them (`bounds.Bounder._query`)."""
        if self.step is None:
            return torch.ones_like(l, dtype=torch.bool)
        lo, hi = self._snapped(l, u)
        return hi <= lo

    def loose(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Units whose interval spans more than `LOOSE_STEPS` grid steps: their lines are x ± E on any interval wider
        than two steps (`lines`), and CROWN's interval of a grid rounding's input is seldom that much narrower than the
        interval arithmetic it is queried on."""
        if self.step is None:
            return torch.ones_like(l, dtype=torch.bool)
        return u - l > self.LOOSE_STEPS * self.step.to(l.dtype)

    def grid(self) -> tuple[torch.Tensor, float] | None:
        """(step, slack): every value is within slack of a multiple of step (the MILP's integer encoding)."""
        return None if self.step is None else (self.step, 0.0)

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        E = self.E.to(l.dtype)
        if self.step is None:
            return l - E, u + E
        return self._snapped(l, u)

    def lines(self, l: torch.Tensor, u: torch.Tensor, k: tuple[torch.Tensor, torch.Tensor] | None = None):
        """CROWN's lines: per side x ± E or the snapped end, whichever is tighter at the interval's middle (`hull_lines`
        has every other line the staircase allows, for α-CROWN to choose from).

        `k` = (k_lo, k_hi): a branch and bound domain's grid split (`bab`) allows only these indices. Then y lies in
        [s·k_lo, s·k_hi] and, as |y − x| ≤ E, x in [s·k_lo − E, s·k_hi + E]: the lines are those of that narrower
        interval (they need hold only where the domain's points lie), a single index a constant."""
        one, E = torch.ones_like(l), self.E.to(l.dtype).expand_as(l)
        if self.step is None:
            return one, -E, one, E
        if k is not None:
            s = self.step.to(l.dtype)
            l = torch.maximum(l, k[0] * s - E)
            u = torch.maximum(torch.minimum(u, k[1] * s + E), l)  # an empty domain: any line is sound there
        lo, hi = self._snapped(l, u)
        if k is not None:
            lo, hi = torch.maximum(lo, k[0] * s), torch.minimum(hi, k[1] * s)
            hi = torch.maximum(hi, lo)
        mid = (l + u) / 2
        flat_lo, flat_hi = lo >= mid - E, hi <= mid + E  # the constant line is the tighter one at the middle
        zero = torch.zeros_like(l)
        return (torch.where(flat_lo, zero, one), torch.where(flat_lo, lo, -E),
                torch.where(flat_hi, zero, one), torch.where(flat_hi, hi, E))

    def hull_lines(self, l: torch.Tensor, u: torch.Tensor, slopes: tuple[torch.Tensor, torch.Tensor]):
        """(al, bl, au, bu): per side the supporting line of the staircase's hull over [l, u] with the given slope
        (α-CROWN's parameters, one per row and unit; `slope_range` gives their range).

        The pairs (x, y) the runtime may give are exactly y = s·k with |y − x| ≤ E (k = round(t/s), |t − x| ≤ E',
        ties either way), so the largest value at x is the staircase s·⌊(x + E)/s⌋, whose steps start at the corners
        (s·k − E, s·k). Its upper hull over [l, u] is concave with vertices (l, s·k_l), the corners, and (u, s·k_max):
        facets of slope s/(c₁ − l) ≥ 1 (to the first corner c₁), 1 (y = x + E, through the corners) and 0 (after the
        last corner c_m). A line of slope a is a supporting line through c_m for a ≤ 1, through c₁ for 1 ≤ a ≤
        s/(c₁ − l), through (l, s·k_l) beyond (and through it for every a ≥ 0 when no corner lies in the interval).
        Slope 0 is the snapped end, slope 1 is x + E, the steepest facet beats both on an interval of under two cells
        (CROWN's midpoint choice of it lowered 27 of 30 margin bounds on a preact_resnet: a slope above 1 multiplies
        everything before the unit, so only an optimizer that sees the whole bound should choose it: α-CROWN with
        `OPTIMIZE`). The corners are
        moved left by `SNAP_SLACK` steps and the intercepts outward by their own float64 rounding. The lower side is
        the same staircase turned by half a turn."""
        if self.step is None:
            return self.lines(l, u)
        a_lo, a_up = slopes
        au, bu = self._hull_upper(l, u, a_up)
        al, nb = self._hull_upper(-u, -l, a_lo)  # y ≤ a·(−x) + b on the turned staircase: y ≥ a·x − b here
        return al, -nb, au, bu

    def _vertices(self, l: torch.Tensor, u: torch.Tensor):
        """The upper hull's vertices over [l, u]: (y0 = s·k_l at l, the first corner c1 with y1 = y0 + s, the last corner
        cm with ym, whether a corner lies in the interval), corners moved left by `SNAP_SLACK` steps."""
        s, E = self.step.to(l.dtype), self.E.to(l.dtype)
        k_l = torch.floor((l + E) / s + self.SNAP_SLACK)
        k_u = torch.floor((u + E) / s + self.SNAP_SLACK)
        k_l = torch.where((k_l + 1) * s - E - self.SNAP_SLACK * s <= l, k_l + 1, k_l)  # a corner at l itself: above it
        k_u = torch.maximum(k_u, k_l)
        y0 = k_l * s
        c1 = (k_l + 1) * s - E - self.SNAP_SLACK * s
        cm = k_u * s - E - self.SNAP_SLACK * s
        corner = k_u > k_l  # c1 > l, c1 ≤ cm
        return y0, c1, y0 + s, cm, k_u * s, corner

    def slope_range(self, l: torch.Tensor, u: torch.Tensor):
        """Per side ((low, high) lower side, (low, high) upper side), the slopes α-CROWN may choose: [0, the steep
        facet's] on an interval with at most `FREE_CORNERS` corners, 1 (x ± E) on a wider one and 0 on one with a
        single value. On a wide interval no other line is worth it (they part from the staircase by (1 − a) per unit
        of x), and an optimizer that moves every slope by its step size (Adam) would only spoil them."""
        def side(l_, u_):
            _, c1, _, _, _, corner = self._vertices(l_, u_)
            s, E = self.step.to(l_.dtype), self.E.to(l_.dtype)
            corners = torch.floor((u_ + E) / s + self.SNAP_SLACK) - torch.floor((l_ + E) / s + self.SNAP_SLACK)
            run = (c1 - l_).clamp(min=torch.finfo(l_.dtype).tiny)
            free = corner & (corners <= self.FREE_CORNERS)
            top = torch.where(free, (s / run).clamp(min=1.0, max=self.STEEP_MAX), torch.where(corner, torch.ones_like(l_), torch.zeros_like(l_)))
            low = torch.where(free | ~corner, torch.zeros_like(l_), torch.ones_like(l_))
            return low, top
        return side(-u, -l), side(l, u)

    FREE_CORNERS: ClassVar[int] = 2

    # slopes above this are not offered (an interval far narrower than a cell, right below a corner: a huge slope would
    # only magnify float64 rounding)
    STEEP_MAX: ClassVar[float] = 1e3

    def _hull_upper(self, l: torch.Tensor, u: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y0, c1, y1, cm, ym, corner = self._vertices(l, u)
        steep = torch.where(corner, self.step.to(l.dtype) / (c1 - l).clamp(min=torch.finfo(l.dtype).tiny), torch.zeros_like(l))
        a = a.clamp(min=0)
        px = torch.where(corner & (a <= 1), cm, torch.where(corner & (a <= steep), c1, l))
        py = torch.where(corner & (a <= 1), ym, torch.where(corner & (a <= steep), y1, y0))
        b = py - a * px
        return a, b + 1e-12 * (py.abs() + (a * px).abs())  # the intercept's own float64 rounding, outward


@dataclass(eq=False)
class QuantizedInput(Activation):
    """The first quantization of the graph input: y = fl32(s·(q(t) − z)), q(t) = saturate(round(t/s) + z) as the runtime
    computes it (`quantized.grid_index`, a monotone map), of t = x or, where the model normalizes its input with constants
    before quantizing it (a CNN's Mul/Add, `pre_*`), of t = a·x + b computed by `pre_ops` float32 operations: within
    δ = 2·γ_{ops+1}·(|a·x| + |b|) of the exact a·x + b, and monotone in x. Over an input interval [l, u] the values y takes
    are the grid points between those of the interval's ends (t − δ at the lower one, t + δ at the upper one), so that
    pair is its range and the constant lines y(l) ≤ y ≤ y(u) the tightest relaxation of a box; `forward` is the grid
    value of fl32(a·x + b), with the identity's gradient so that an attack can move x."""

    scale: torch.Tensor  # per unit, the float32 scale as a float64
    zero: torch.Tensor  # per unit, integer-valued

    flat_lines: ClassVar[bool] = True  # `lines`: the interval's ends
    qmin: int
    qmax: int
    source: str = ""
    pre_scale: torch.Tensor | None = None  # per unit a (None: t = x)
    pre_shift: torch.Tensor | None = None  # per unit b
    pre_ops: int = 0

    def __post_init__(self) -> None:
        self.scale, self.zero = as_tensor(self.scale).reshape(-1), as_tensor(self.zero).reshape(-1)
        if self.pre_ops == 0 and self.pre_scale is not None and bool(torch.all(as_tensor(self.pre_scale) == 1)) \
                and bool(torch.all(as_tensor(self.pre_shift) == 0)):
            self.pre_scale = self.pre_shift = None  # the raw input itself
        if self.pre_scale is not None:
            self.pre_scale = as_tensor(self.pre_scale).reshape(-1).expand_as(self.scale).clone()
            self.pre_shift = as_tensor(self.pre_shift).reshape(-1).expand_as(self.scale).clone()
            if not bool(torch.all(self.pre_scale != 0)):
                raise ValueError("a normalization before the first quantization must not multiply by 0")

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.scale.numel()

    def _pre(self, x: torch.Tensor, side: str) -> torch.Tensor:
        if self.pre_scale is None:
            return x
        from pipeline.numerics import gamma

        a, b = self.pre_scale.to(x.dtype), self.pre_shift.to(x.dtype)
        t = x * a + b
        if side == "nearest":
            return t
        delta = 2 * gamma(self.pre_ops + 1) * ((x * a).abs() + b.abs())
        return t - delta if side == "low" else t + delta

    def value(self, x: torch.Tensor, side: str = "nearest") -> torch.Tensor:
        from ..quantized import grid_index

        q = grid_index(self._pre(x.detach(), side), self.scale, self.zero, self.qmin, self.qmax, side)
        # DequantizeLinear in float32, as the runtime computes it: one rounding of the exact (q − z)·s
        y = (q - self.zero).to(torch.float32) * self.scale.to(torch.float32)
        return y.to(x.dtype)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + (self.value(h) - h).detach()

    def grid(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(step, slack): a value is fl32(s·k), k = q − z an integer: within 2⁻²⁴·|y| of s·k."""
        top = self.scale * torch.maximum((self.qmin - self.zero).abs(), (self.qmax - self.zero).abs())
        return self.scale, top * U

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lo = torch.minimum(self.value(l[None], "low")[0], self.value(u[None], "low")[0])  # a < 0 reverses the ends
        hi = torch.maximum(self.value(l[None], "high")[0], self.value(u[None], "high")[0])
        return lo, hi

    def k_range(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The grid indices k = q − z the input takes over [l, u] (floats holding integers; a < 0 reverses the ends)."""
        from ..quantized import grid_index

        def q(x: torch.Tensor, side: str) -> torch.Tensor:
            return grid_index(self._pre(x[None], side)[0], self.scale, self.zero, self.qmin, self.qmax, side).to(l.dtype)

        return (torch.minimum(q(l, "low"), q(u, "low")) - self.zero.to(l.dtype),
                torch.maximum(q(l, "high"), q(u, "high")) - self.zero.to(l.dtype))

    def at(self, k: torch.Tensor) -> torch.Tensor:
        """The dequantized value of grid index k, as the runtime's float32 DequantizeLinear computes it."""
        return (k.to(torch.float32) * self.scale.to(torch.float32)).to(k.dtype)

    @property
    def step(self) -> torch.Tensor:
        return self.scale

    def lines(self, l: torch.Tensor, u: torch.Tensor, k: tuple[torch.Tensor, torch.Tensor] | None = None):
        """Constant lines at the interval's ends; `k` = (k_lo, k_hi): a branch and bound domain's split of the input
        grid (`bab`), which narrows them to those indices' values."""
        lo, hi = self.interval(l, u)
        if k is not None:
            lo, hi = torch.maximum(lo, self.at(k[0])), torch.minimum(hi, self.at(k[1]))
            hi = torch.maximum(hi, lo)  # an empty domain: any line is sound there
        zero = torch.zeros_like(l)
        return zero, lo, zero, hi
