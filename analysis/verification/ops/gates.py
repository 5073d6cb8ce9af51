"""The λ-gates `Gate`, y = x·g(λx) with one λ > 0 per unit, and their linear relaxations: every family of
`pipeline.gates` with relaxation data ("phi": λ-GELU, GELU at λ = 1; "sigmoid": λ-Swish, SiLU; "serf": SERF), and the
closed-form gap sup|ReLU − f| that carries a ReLU certificate over to the smooth network.

With y = λx, f(x) = F(y)/λ where F(y) = y·g(y) and f'(x) = F'(y). Each gate's F has exactly two inflection
points y₁ < y₂ (F'' < 0, > 0, < 0 on the three pieces; checked by a dense scan in the tests), so F' is monotone
on each piece. For ANY slope a, the tightest sound lines of that slope over [L, U] are

    F(y) ≤ a·y + max_[L,U](F(y) − a·y),      F(y) ≥ a·y + min_[L,U](F(y) − a·y),

and the max/min of e(y) = F(y) − a·y is attained at L, U or where F'(y) = a, at most one point per monotone
piece of F', found by bisection. The bisection bracket [p, q] around a root bounds what it can miss:
e(root) ≤ e(p) + (q − p)·max(|F'(p) − a|, |F'(q) − a|) (e' is monotone on the bracket), and that, plus the
floating-point slack below, is added to the intercept. So every line is sound by construction, whatever the
slope; a slope is only a choice of tightness. CROWN picks, per unit, the slope among {secant, F'(L), F'(mid),
F'(U)} with the least area between line and curve (DeepPoly's rule); α-CROWN optimizes the slopes within
[min F', max F'] over the interval, with the intercept's gradient −y* (the envelope theorem: y* the extremum,
held fixed).

Floating-point slack: F is evaluated in float64 through torch's erfc / sigmoid / erf, whose relative error
is not one ulp: torch's erfc is measured up to ~820 ulps (9e-14) off below y = −30. `G_REL_ERROR` bounds the
relative error of each computed F (measured against mpmath on a dense grid over both tails in
tests/test_verify_relaxations.py, with a factor-of-8 margin), and `TINY` covers F's underflow to 0 in the far left tail
(|y·g(y)| < 1e-300 there). The slack of a candidate point is G_REL_ERROR·(|F| + |a·y|) + TINY.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from pipeline import gates
from pipeline.gates import GateFamily

from .base import DTYPE, Activation, UnsupportedModel, as_tensor

BISECT_STEPS = 64  # brackets shrink 2^-64: below one float64 ulp for |y| ≤ 1e4
OPT_BISECT_STEPS = 32  # during α optimization (a gradient needs the extremum roughly; the last pass is exact)
G_REL_ERROR = 2.0 ** -36  # relative error bound of a computed F(y) − a·y (≈ 1.5e-11; measured max ~9e-14, see above)
TINY = 1e-300  # absolute slack: F underflows to 0 where |y·g(y)| < 1e-300

# ---------------------------------------------------------------------------------------------
# the smooth gates: F(y) = y·g(y), F', inflection points, the tails that give sup|ReLU − f|, all from the gate's
# family (`pipeline.gates.GateFamily`: g, its complement, `relaxation`, `inflections`, `tail_peaks`)


@dataclass(frozen=True)
class SmoothGate:
    """F(y) = y·g(y) for one gate g, with what the relaxations and the swap gap need."""

    name: str
    g: Callable[[torch.Tensor], torch.Tensor]  # pipeline.gates' g, accurate in both tails
    dF: Callable[[torch.Tensor], torch.Tensor]  # F'(y) = g(y) + y·g'(y)
    d2F_sign: Callable[[torch.Tensor], torch.Tensor]  # a function with the sign of F'' (for the tests)
    upper_tail: Callable[[torch.Tensor], torch.Tensor]  # 1 − g(u), u ≥ 0: ReLU − f on the x > 0 side is u·(1 − g(u))/λ
    lower_tail: Callable[[torch.Tensor], torch.Tensor]  # g(−u), u ≥ 0: on the x < 0 side, u·g(−u)/λ
    inflections: tuple[float, float] = (0.0, 0.0)
    peaks: tuple[float, float] = (0.0, 0.0)  # argmax_u u·upper_tail(u), argmax_u u·lower_tail(u)
    peak_values: tuple[float, float] = (0.0, 0.0)  # the maxima, nudged up (`pipeline.gates.tail_peaks`)

    def F(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.g(y)

    def f(self, x: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
        """f(x) = x·g(λx)."""
        return x * self.g(lam * x)


def _smooth_gate(fam: GateFamily) -> SmoothGate:
    rel = fam.relaxation
    p_up, p_lo = gates.tail_peaks(fam.name)  # the family's one computation of c (pipeline/gates.py)
    return SmoothGate(fam.name, fam.g, rel.dF, rel.d2F_sign, fam.one_minus_g, lambda u: fam.g(-u),
                      gates.inflections(fam.name), (p_up[0], p_lo[0]), (p_up[1], p_lo[1]))


class _SmoothGates(Mapping[str, SmoothGate]):
    """The gate families that have relaxation data (`GateFamily.relaxation`), each built once on first use and again
    when its family is registered anew: a family registered later is here too."""

    def __init__(self) -> None:
        self._built: dict[str, tuple[GateFamily, SmoothGate]] = {}

    def __getitem__(self, name: str) -> SmoothGate:
        fam = gates.GATES.get(name)
        if fam is None or fam.relaxation is None:
            raise KeyError(name)
        built = self._built.get(name)
        if built is None or built[0] is not fam:
            built = self._built[name] = (fam, _smooth_gate(fam))
        return built[1]

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, fam in gates.GATES.items() if fam.relaxation is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)


SMOOTH_GATES: Mapping[str, SmoothGate] = _SmoothGates()


# ---------------------------------------------------------------------------------------------
# exact extremes of F(y) − a·y over [L, U]


def _roots(gate: SmoothGate, L: torch.Tensor, U: torch.Tensor, a: torch.Tensor, steps: int):
    """Per monotone piece of F' (stacked on a leading axis of 3): (root of F' = a, or NaN where there is none in
    [L, U] ∩ piece; bracket slack). One bisection over the three pieces at once: the tensors are small, so the
    cost is the number of calls."""
    y1, y2 = gate.inflections
    p0 = torch.tensor([-math.inf, y1, y2], dtype=DTYPE, device=L.device).view(3, *([1] * L.dim()))
    q0 = torch.tensor([y1, y2, math.inf], dtype=DTYPE, device=L.device).view_as(p0)
    increasing = torch.tensor([False, True, False], device=L.device).view_as(p0)
    p, q = torch.maximum(L, p0), torch.minimum(U, q0)  # [3, ...]
    fp, fq = gate.dF(p) - a, gate.dF(q) - a
    has = (p < q) & torch.where(increasing, (fp <= 0) & (fq >= 0), (fp >= 0) & (fq <= 0))
    Lx = L.expand_as(p)
    lo, hi = torch.where(has, p, Lx), torch.where(has, q, Lx)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        below = (gate.dF(mid) - a) < 0  # the root lies above mid on an increasing piece, below it otherwise
        go_up = below == increasing
        lo, hi = torch.where(go_up, mid, lo), torch.where(go_up, hi, mid)
    root = torch.where(has, 0.5 * (lo + hi), torch.full_like(lo, math.nan))
    slack = torch.where(has, (hi - lo) * torch.maximum((gate.dF(lo) - a).abs(), (gate.dF(hi) - a).abs()),
                        torch.zeros_like(lo))
    return root, slack


def intercepts(gate: SmoothGate, L: torch.Tensor, U: torch.Tensor, a: torch.Tensor,
               steps: int = BISECT_STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of F(y) − a·y over y ∈ [L, U], widened by the bisection and rounding slack: the lower line
    a·y + min and the upper line a·y + max are sound on [L, U]. Differentiable in `a` (envelope theorem)."""
    L, U, a = torch.broadcast_tensors(L, U, a)
    with torch.no_grad():
        root, slack = _roots(gate, L, U, a.detach(), steps)
        P = torch.cat([L[None], U[None], torch.where(torch.isnan(root), L, root)])  # [5 candidates, ...]
        S = torch.cat([torch.zeros_like(L)[None].expand(2, *L.shape), slack])
    return extremes(gate.F, P, S, a)


def extremes(f: Callable[[torch.Tensor], torch.Tensor], P: torch.Tensor, S: torch.Tensor,
             a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of f(y) − a·y over the candidate points P (stacked on dim 0, every point where the extremes may
    lie), each widened by f's rounding and the candidate's own slack S. Differentiable in `a` (envelope theorem)."""
    with torch.no_grad():
        E, tol = _values(f, P, S, a)
        y_lo, t_lo = _first_largest(P, tol, tol - E)
        y_hi, t_hi = _first_largest(P, tol, E + tol)
    # recomputed with `a` attached: d/da (f(y*) − a·y*) = −y*
    return f(y_lo) - a * y_lo - t_lo, f(y_hi) - a * y_hi + t_hi


def extreme(f: Callable[[torch.Tensor], torch.Tensor], P: torch.Tensor, S: torch.Tensor, a: torch.Tensor,
            upper: bool) -> torch.Tensor:
    """One side of `extremes`: the max (`upper`) or the min of f(y) − a·y over the candidates P, widened outward."""
    sign = 1.0 if upper else -1.0
    with torch.no_grad():
        E, tol = _values(f, P, S, a)
        y, t = _first_largest(P, tol, sign * E + tol)
    return f(y) - a * y + sign * t


def _values(f: Callable[[torch.Tensor], torch.Tensor], P: torch.Tensor, S: torch.Tensor,
            a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f(y) − a·y at the candidates, and how far each may be off (f's rounding, the candidate's slack)."""
    ad = a.detach()
    FP = f(P)
    return FP - ad * P, G_REL_ERROR * (FP.abs() + (ad * P).abs()) + TINY + S


def _first_largest(P: torch.Tensor, tol: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidate with the first largest V along dim 0 (argmax's, NaN winning) and its tolerance, in one elementwise
    pass per candidate: torch's argmax over a short leading axis reads it strided, several times slower on a CPU."""
    y, t, best = P[0], tol[0], V[0]
    for i in range(1, P.shape[0]):
        more = (V[i] > best) | (torch.isnan(V[i]) & ~torch.isnan(best))
        y, t, best = torch.where(more, P[i], y), torch.where(more, tol[i], t), torch.where(more, V[i], best)
    return y, t


def slope_range(gate: SmoothGate, L: torch.Tensor, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of F' on [L, U]: at the ends or at the inflection points (F' has its local min at y₁, max at y₂)."""
    y1, y2 = gate.inflections
    dL, dU = gate.dF(L), gate.dF(U)
    lo, hi = torch.minimum(dL, dU), torch.maximum(dL, dU)
    t1, t2 = torch.full_like(L, y1), torch.full_like(L, y2)
    lo = torch.where((L <= y1) & (y1 <= U), torch.minimum(lo, gate.dF(t1)), lo)
    hi = torch.where((L <= y2) & (y2 <= U), torch.maximum(hi, gate.dF(t2)), hi)
    return lo, hi


def default_slopes(gate: SmoothGate, L: torch.Tensor, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) slopes of least area among secant, F'(L), F'(mid), F'(U)."""
    return least_area_slopes(gate.F, gate.dF, lambda l, u, a: intercepts(gate, l, u, a, OPT_BISECT_STEPS), L, U)


def least_area_slopes(f: Callable[[torch.Tensor], torch.Tensor], df: Callable[[torch.Tensor], torch.Tensor],
                      bounds: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                      L: torch.Tensor, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) slopes of least area among the secant and the tangents at L, the middle and U (CROWN's choice);
    `bounds(L, U, a)` gives (min, max) of f − a·y on [L, U] (a coarse one is enough to choose: the chosen lines get
    exact intercepts where they are used)."""
    width = U - L
    mid = 0.5 * (L + U)
    secant = torch.where(width > 1e-12 * (1 + L.abs()), (f(U) - f(L)) / width.clamp(min=1e-300), df(mid))
    cands = torch.stack([secant, df(L), df(mid), df(U)])
    lo, hi = bounds(L.expand_as(cands), U.expand_as(cands), cands)
    # the area between a line and the curve is width·line(mid) − ∫f: compare the lines at the middle
    up = torch.argmin(cands * mid + hi, dim=0, keepdim=True)
    dn = torch.argmax(cands * mid + lo, dim=0, keepdim=True)
    return cands.gather(0, dn)[0], cands.gather(0, up)[0]


def gate_range(gate: SmoothGate, lam: torch.Tensor, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """IBP through the gate: (min, max) of f over [l, u] (slope 0 in `intercepts`)."""
    lo, hi = intercepts(gate, lam * l, lam * u, torch.zeros_like(l))
    return lo / lam, hi / lam


def swap_gap_unit(gate: SmoothGate, lam: torch.Tensor, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """sup over z ∈ [l, u] of |ReLU(z) − z·g(λz)|, per unit.

    With t = λ|z|: ReLU(z) − f(z) = t·(1 − g(t))/λ for z ≥ 0 and t·g(−t)/λ for z < 0, both ≥ 0 and unimodal in
    t, peaking at `gate.peaks` (λ-GELU: t* = 0.7518 on both sides, where u·Φ(−u) = 0.16997 peaks). On each side the
    sup over a t-interval [p, q] is the peak value if p ≤ t* ≤ q, else the value at the end nearer t*."""
    def side(p: torch.Tensor, q: torch.Tensor, tail, peak: float, top: float) -> torch.Tensor:
        t = torch.where(q < peak, q, torch.where(p > peak, p, torch.full_like(p, peak)))
        val = torch.where((p <= peak) & (peak <= q), torch.full_like(p, top), t * tail(t) * (1 + G_REL_ERROR) + TINY)
        return torch.where(q > p, val, torch.where(q == p, q * tail(q) * (1 + G_REL_ERROR) + TINY, torch.zeros_like(p)))

    pos = side(lam * l.clamp(min=0), lam * u.clamp(min=0), gate.upper_tail, gate.peaks[0], gate.peak_values[0])
    neg = side(lam * (-u).clamp(min=0), lam * (-l).clamp(min=0), gate.lower_tail, gate.peaks[1], gate.peak_values[1])
    return torch.maximum(pos, neg) / lam


# ---------------------------------------------------------------------------------------------
# the op


@dataclass(eq=False)
class Gate(Activation):
    """y = x·g(λx), g = `pipeline.gates.family(kind).g`; lam: one λ > 0 per unit (a per-layer λ repeated, a per-channel λ
    broadcast over its channel's positions). Its lines have exact intercepts for any slope (`intercepts`); α-CROWN
    optimizes both slopes within F′'s range on the interval."""

    kind: str
    lam: torch.Tensor
    source: str = ""

    float32_rows: ClassVar[str | None] = "gate"
    skip_near_exact: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.kind not in gates.GATES:
            raise UnsupportedModel(f"unknown gate family {self.kind!r}; known: {', '.join(gates.GATES)}")
        self.lam = as_tensor(self.lam).reshape(-1)
        if not bool(torch.all(self.lam > 0)):
            raise ValueError("every λ of a gate must be > 0")

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.lam.numel()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return gates.family(self.kind).f(h, self.lam)

    def check_bounded(self) -> None:
        if self.kind not in SMOOTH_GATES:
            raise UnsupportedModel(f"gate {self.kind!r} has no linear relaxation here; supported: {', '.join(SMOOTH_GATES)}")

    def interval(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return gate_range(SMOOTH_GATES[self.kind], self.lam, l, u)

    def crown_lines(self, l: torch.Tensor, u: torch.Tensor, slopes: Any = None, exact: bool = True):
        gate, lam = SMOOTH_GATES[self.kind], self.lam
        L, U = lam * l, lam * u
        a_lo, a_up = default_slopes(gate, L, U) if slopes is None else slopes
        a_lo, a_up = torch.broadcast_tensors(a_lo, a_up)
        lo, hi = intercepts(gate, L, U, torch.stack([a_lo, a_up]), BISECT_STEPS if exact else OPT_BISECT_STEPS)
        return a_lo, lo[0] / lam, a_up, hi[1] / lam

    def optimizable(self) -> bool:
        return True

    def project(self, slopes, l: torch.Tensor, u: torch.Tensor) -> None:
        lo, hi = slope_range(SMOOTH_GATES[self.kind], self.lam * l, self.lam * u)
        for q in slopes:
            q.data.copy_(torch.maximum(torch.minimum(q.data, hi), lo))

    def unstable(self, l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return (l < 0) & (u > 0)

    def gap(self, l: torch.Tensor, u: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """|f(z') − ReLU(z)| two ways, the smaller per unit: through ReLU (1-Lipschitz) and sup|f − ReLU| on the widened
        interval, or through f (its largest |f'| on the widened interval times d) and sup|f − ReLU| on [l, u]. A unit
        whose interval stays a distance r from 0 adds at most r·tail(λr), exponentially small in λr."""
        gate, lam = SMOOTH_GATES[self.kind], self.lam
        relu_moves = torch.where(u + d <= 0, torch.zeros_like(d), d)
        via_relu = swap_gap_unit(gate, lam, l - d, u + d) + relu_moves
        lo, hi = slope_range(gate, lam * (l - d), lam * (u + d))
        via_gate = torch.maximum(lo.abs(), hi.abs()) * d + swap_gap_unit(gate, lam, l, u)
        return torch.minimum(via_relu, via_gate)
