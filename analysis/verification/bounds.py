"""Sound bounds over an input box: IBP, CROWN (linear relaxations with back-substitution, DeepPoly's
idea) and α-CROWN (the relaxations' slopes optimized by projected gradient), for ReLU and for the
smooth gates f(x) = x·g(λx) of `pipeline.gates` ("phi": λ-GELU, GELU at λ = 1; "sigmoid": λ-Swish,
SiLU; "serf": SERF), with λ per unit; plus the closed-form gap sup|ReLU − f| that carries a ReLU
certificate over to the smooth network (`swap_gap`).

One small engine in torch float64 over `network.Network`; why not a library: `bound-propagation`
0.4.7 has no Conv and no SERF, and its gates must be rebuilt from its own modules; auto_LiRPA ≥ 0.7
is not installable here (see DESIGN.md).

Smooth-gate relaxations. With y = λx, f(x) = F(y)/λ where F(y) = y·g(y) and f'(x) = F'(y). Each gate's
F has exactly two inflection points y₁ < y₂ (F'' < 0, > 0, < 0 on the three pieces; checked by a
dense scan in the tests), so F' is monotone on each piece. For ANY slope a, the tightest sound lines
of that slope over [L, U] are

    F(y) ≤ a·y + max_[L,U](F(y) − a·y),      F(y) ≥ a·y + min_[L,U](F(y) − a·y),

and the max/min of e(y) = F(y) − a·y is attained at L, U or where F'(y) = a, at most one point per
monotone piece of F', found by bisection. The bisection bracket [p, q] around a root bounds what it
can miss: e(root) ≤ e(p) + (q − p)·max(|F'(p) − a|, |F'(q) − a|) (e' is monotone on the bracket), and
that, plus a few float64 ulps of |F| + |a·y|, is added to the intercept. So every line is sound by
construction, whatever the slope; a slope is only a choice of tightness. CROWN picks, per unit, the
slope among {secant, F'(L), F'((L+U)/2), F'(U)} with the least area between line and curve
(DeepPoly's rule); α-CROWN optimizes the slopes within [min F', max F'] over the interval, with the
intercept's gradient −y* (the envelope theorem: y* the extremum, held fixed).

ReLU: upper chord, lower y ≥ αx with α ∈ [0, 1] (CROWN: α = 1 when u > −l, else 0).

Bounds are computed in float64 without directed rounding (as auto_LiRPA does); what they miss by
rounding is ~1e-12 relative, far below the margins a decision rests on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.gates import family

from .network import DTYPE, Conv, Gate, Linear, Network, ReLU, Scale, UnsupportedModel, _t

BISECT_STEPS = 64  # brackets shrink 2^-64: below one float64 ulp for |y| ≤ 1e4
OPT_BISECT_STEPS = 32  # during α optimization (a gradient needs the extremum roughly; the last pass is exact)
ROUNDING = 2.0 ** -46  # relative slack for float64 rounding in F(y) − a·y (≈ 64 ulps)
CHUNK_ELEMENTS = 2 ** 25  # coefficient rows × width per back-substitution batch (256 MB of float64)

# ---------------------------------------------------------------------------------------------
# the smooth gates: F(y) = y·g(y), F', inflection points, the tails that give sup|ReLU − f|

SQRT2 = math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _Phi(y: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.erfc(-y / SQRT2)  # erfc, not ndtr: accurate in the left tail


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
    peak_values: tuple[float, float] = (0.0, 0.0)  # the maxima, nudged up (see _peak)

    def F(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.g(y)

    def f(self, x: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
        """f(x) = x·g(λx)."""
        return x * self.g(lam * x)


def _brentq(fn: Callable[[float], float], a: float, b: float) -> float:
    from scipy.optimize import brentq

    return float(brentq(fn, a, b, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=200))


def _peak(tail: Callable[[torch.Tensor], torch.Tensor]) -> tuple[float, float]:
    """(argmax, max) of the unimodal u·tail(u) on u ≥ 0; the max nudged up by 1e-9 (relative): the value at
    a point found to ~1e-8 is below the true max by ~1e-16 relative, so the nudge keeps it an upper bound."""
    from scipy.optimize import minimize_scalar

    def T(u: float) -> float:
        return float(u * tail(torch.tensor(u, dtype=DTYPE)))

    grid = np.linspace(0.0, 10.0, 1001)
    i = int(np.argmax([T(u) for u in grid]))
    res = minimize_scalar(lambda u: -T(u), bounds=(grid[max(i - 1, 0)], grid[min(i + 1, 1000)]), method="bounded",
                          options={"xatol": 1e-12})
    return float(res.x), -float(res.fun) * (1 + 1e-9)


def _make(name: str, g, dF, d2F_sign, upper_tail, lower_tail, inflection_brackets) -> SmoothGate:
    def sign_at(v: float) -> float:
        return float(d2F_sign(torch.tensor(v, dtype=DTYPE)))

    infl = tuple(_brentq(sign_at, a, b) for a, b in inflection_brackets)
    p_up, p_lo = _peak(upper_tail), _peak(lower_tail)
    return SmoothGate(name, g, dF, d2F_sign, upper_tail, lower_tail, infl, (p_up[0], p_lo[0]), (p_up[1], p_lo[1]))


def _serf_dF(y: torch.Tensor) -> torch.Tensor:
    s = F.softplus(y)
    return torch.erf(s) + y * TWO_OVER_SQRT_PI * torch.exp(-s * s) * torch.sigmoid(y)


SMOOTH_GATES: dict[str, SmoothGate] = {
    # F'' = φ(y)(2 − y²): inflections ±√2
    "phi": _make("phi", family("phi").g, lambda y: _Phi(y) + y * INV_SQRT_2PI * torch.exp(-0.5 * y * y),
                 lambda y: 2.0 - y * y, lambda u: _Phi(-u), lambda u: _Phi(-u), [(-3.0, -1.0), (1.0, 3.0)]),
    # F'' = σ'(y)(2 − y·tanh(y/2)): inflections ±2.3994
    "sigmoid": _make("sigmoid", family("sigmoid").g, lambda y: torch.sigmoid(y) * (1.0 + y * torch.sigmoid(-y)),
                     lambda y: 2.0 - y * torch.tanh(y / 2), lambda u: torch.sigmoid(-u), lambda u: torch.sigmoid(-u),
                     [(-4.0, -1.0), (1.0, 4.0)]),
    # g = erf(s), s = softplus(y): F'' = (2/√π)·e^{−s²}·σ(y)·(2 + y(1 − σ(y) − 2sσ(y))): inflections ≈ −2.2565, 1.0960
    "serf": _make("serf", family("serf").g, _serf_dF,
                  lambda y: 2.0 + y * (1.0 - torch.sigmoid(y) - 2.0 * F.softplus(y) * torch.sigmoid(y)),
                  lambda u: torch.erfc(F.softplus(u)), lambda u: torch.erf(F.softplus(-u)), [(-4.0, -1.0), (0.5, 2.0)]),
}


# ---------------------------------------------------------------------------------------------
# exact extremes of F(y) − a·y over [L, U]


def _roots(gate: SmoothGate, L: torch.Tensor, U: torch.Tensor, a: torch.Tensor, steps: int):
    """Per monotone piece of F' (stacked on a leading axis of 3): (root of F' = a, or NaN where there is none in
    [L, U] ∩ piece; bracket slack). One bisection over the three pieces at once: the tensors are small, so the
    cost is the number of calls."""
    y1, y2 = gate.inflections
    p0 = torch.tensor([-math.inf, y1, y2], dtype=DTYPE).view(3, *([1] * L.dim()))
    q0 = torch.tensor([y1, y2, math.inf], dtype=DTYPE).view_as(p0)
    increasing = torch.tensor([False, True, False]).view_as(p0)
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
        ad = a.detach()
        root, slack = _roots(gate, L, U, ad, steps)
        P = torch.cat([L[None], U[None], torch.where(torch.isnan(root), L, root)])  # [5 candidates, ...]
        S = torch.cat([torch.zeros_like(L)[None].expand(2, *L.shape), slack])
        FP = gate.F(P)
        E = FP - ad * P
        tol = ROUNDING * (FP.abs() + (ad * P).abs()) + S
        i_max = torch.argmax(E + tol, dim=0, keepdim=True)
        i_min = torch.argmin(E - tol, dim=0, keepdim=True)
        y_max, y_min = P.gather(0, i_max)[0], P.gather(0, i_min)[0]
        t_max, t_min = tol.gather(0, i_max)[0], tol.gather(0, i_min)[0]
    # recomputed with `a` attached: d/da (F(y*) − a·y*) = −y*
    hi = gate.F(y_max) - a * y_max + t_max
    lo = gate.F(y_min) - a * y_min - t_min
    return lo, hi


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
    width = U - L
    mid = 0.5 * (L + U)
    secant = torch.where(width > 1e-12 * (1 + L.abs()), (gate.F(U) - gate.F(L)) / width.clamp(min=1e-300), gate.dF(mid))
    cands = torch.stack([secant, gate.dF(L), gate.dF(mid), gate.dF(U)])
    # a coarse bisection is enough to choose (the chosen lines get exact intercepts where they are used)
    lo, hi = intercepts(gate, L.expand_as(cands), U.expand_as(cands), cands, OPT_BISECT_STEPS)
    # the area between line and curve is width·(line(mid)) − ∫F: compare the lines at the midpoint
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
        val = torch.where((p <= peak) & (peak <= q), torch.full_like(p, top), t * tail(t) * (1 + 1e-12))
        return torch.where(q > p, val, torch.where(q == p, q * tail(q) * (1 + 1e-12), torch.zeros_like(p)))

    pos = side(lam * l.clamp(min=0), lam * u.clamp(min=0), gate.upper_tail, gate.peaks[0], gate.peak_values[0])
    neg = side(lam * (-u).clamp(min=0), lam * (-l).clamp(min=0), gate.lower_tail, gate.peaks[1], gate.peak_values[1])
    return torch.maximum(pos, neg) / lam


# ---------------------------------------------------------------------------------------------
# the engine


@dataclass
class Spec:
    """Rows of a linear function of the outputs, C y + d, whose LOWER bounds we want (rows, outputs)."""

    C: torch.Tensor
    d: torch.Tensor

    def __post_init__(self) -> None:
        self.C = torch.as_tensor(self.C).to(DTYPE)
        self.d = torch.as_tensor(self.d).to(DTYPE).reshape(-1)

    @classmethod
    def from_disjuncts(cls, disjuncts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple["Spec", list[int]]:
        """A disjunct {A y ≤ b} is empty when some row has lower bound of A_r y − b_r > 0: all rows stacked,
        with the disjunct index of each row."""
        C = np.concatenate([A for A, _ in disjuncts])
        d = -np.concatenate([b for _, b in disjuncts])
        owner = [k for k, (A, _) in enumerate(disjuncts) for _ in range(A.shape[0])]
        return cls(torch.as_tensor(C, dtype=DTYPE), torch.as_tensor(d, dtype=DTYPE)), owner


@dataclass
class BoxBounds:
    """Everything known about one network on one box. `pre[s]` = (l, u) of the input of activation site s
    (the tightest found: IBP ∩ CROWN ∩ α-CROWN)."""

    net: Network
    lb: torch.Tensor
    ub: torch.Tensor
    ibp_pre: list[tuple[torch.Tensor, torch.Tensor]]
    ibp_out: tuple[torch.Tensor, torch.Tensor]
    pre: list[tuple[torch.Tensor, torch.Tensor]]
    method: str = "ibp"
    seconds: dict[str, float] = field(default_factory=dict)

    def unstable(self, which: str = "tight") -> list[int]:
        """Per ReLU/gate site, the units whose input interval has l < 0 < u."""
        pre = self.pre if which == "tight" else self.ibp_pre
        return [int(((l < 0) & (u > 0)).sum()) for l, u in pre]

    def stable(self, which: str = "tight") -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per site, (dead mask u ≤ 0, active mask l ≥ 0)."""
        pre = self.pre if which == "tight" else self.ibp_pre
        return [(u <= 0, l >= 0) for l, u in pre]


class Bounder:
    """Bounds of one network over one input box [lb, ub] (flat, in the network's input units)."""

    def __init__(self, net: Network, lb: Any, ub: Any, expired: Callable[[], bool] | None = None):
        self.net = net.merged()
        for layer in self.net.layers:
            if isinstance(layer, Gate) and layer.kind not in SMOOTH_GATES:
                raise UnsupportedModel(f"gate {layer.kind!r} has no linear relaxation here; supported: {', '.join(SMOOTH_GATES)}")
        self.lb = _t(lb).reshape(-1).clone()  # copies: the caller's arrays may be views
        self.ub = _t(ub).reshape(-1).clone()
        if self.lb.numel() != self.net.num_inputs or self.lb.shape != self.ub.shape:
            raise ValueError(f"the box has {self.lb.numel()} inputs, the network {self.net.num_inputs}")
        if bool(torch.any(self.lb > self.ub)):
            raise ValueError("empty box: some lb > ub")
        self.expired = expired or (lambda: False)
        self.sites = self.net.activations  # layer index of each activation site
        self.site_of = {k: s for s, k in enumerate(self.sites)}
        self.ibp_pre, self.ibp_out = self._ibp()
        self.pre = list(self.ibp_pre)
        self.method = "ibp"
        self._relax_cache: dict[int, tuple[torch.Tensor, ...]] = {}  # CROWN's relaxation per site, until its bounds change

    # -- IBP -------------------------------------------------------------------------------------
    def _ibp(self):
        lo, hi = self.lb[None], self.ub[None]
        pre = []
        for layer in self.net.layers:
            if isinstance(layer, ReLU):
                pre.append((lo[0], hi[0]))
                lo, hi = lo.clamp(min=0), hi.clamp(min=0)
            elif isinstance(layer, Gate):
                pre.append((lo[0], hi[0]))
                lo, hi = gate_range(SMOOTH_GATES[layer.kind], layer.lam, lo[0], hi[0])
                lo, hi = lo[None], hi[None]
            else:
                lo, hi = layer.ibp(lo, hi)
        return pre, (lo[0], hi[0])

    # -- relaxations -------------------------------------------------------------------------------
    def relaxation(self, s: int, slopes: Any = None, exact: bool = True):
        """(al, bl, au, bu) with al·x + bl ≤ act(x) ≤ au·x + bu on site s's interval; shapes [n] or [rows, n]
        when `slopes` is per row. ReLU slopes: the lower slope α; gates: (lower slope, upper slope)."""
        if slopes is None and s in self._relax_cache:
            return self._relax_cache[s]
        out = self._relaxation(s, slopes, exact, self.pre[s])
        if slopes is None:
            self._relax_cache[s] = out
        return out

    def _relaxation(self, s: int, slopes: Any, exact: bool, bounds: tuple[torch.Tensor, torch.Tensor]):
        layer = self.net.layers[self.sites[s]]
        l, u = bounds
        if isinstance(layer, ReLU):
            cross = (l < 0) & (u > 0)
            active = (l >= 0).to(DTYPE)
            au = torch.where(cross, u / (u - l).clamp(min=1e-300), active)
            bu = torch.where(cross, -l * au, torch.zeros_like(l))
            if slopes is None:
                al = torch.where(cross, (u > -l).to(DTYPE), active)
            else:
                al = torch.where(cross, slopes, active)
            return al, torch.zeros_like(al), au, bu
        gate = SMOOTH_GATES[layer.kind]
        lam = layer.lam
        L, U = lam * l, lam * u
        if slopes is None:
            a_lo, a_up = default_slopes(gate, L, U)
        else:
            a_lo, a_up = slopes
        steps = BISECT_STEPS if exact else OPT_BISECT_STEPS
        a_lo, a_up = torch.broadcast_tensors(a_lo, a_up)
        lo, hi = intercepts(gate, L, U, torch.stack([a_lo, a_up]), steps)  # one call for both lines
        return a_lo, lo[0] / lam, a_up, hi[1] / lam

    def initial_slopes(self, s: int, rows: int):
        """Starting point of α-CROWN for site s with `rows` query rows: CROWN's own choice, one copy per row."""
        al, _, au, _ = self.relaxation(s)
        layer = self.net.layers[self.sites[s]]
        if isinstance(layer, ReLU):
            return al.expand(rows, -1).clone()
        return al.expand(rows, -1).clone(), au.expand(rows, -1).clone()

    def _project(self, s: int, p):
        layer = self.net.layers[self.sites[s]]
        if isinstance(layer, ReLU):
            p.data.clamp_(0.0, 1.0)
            return
        gate = SMOOTH_GATES[layer.kind]
        l, u = self.pre[s]
        lo, hi = slope_range(gate, layer.lam * l, layer.lam * u)
        for q in p:
            q.data.copy_(torch.maximum(torch.minimum(q.data, hi), lo))

    # -- back-substitution -----------------------------------------------------------------------
    def backward(self, A: torch.Tensor, upto: int, slopes: dict[int, Any] | None = None,
                 exact: bool = True, bounds: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
                 extra: dict[int, torch.Tensor] | None = None, record: dict[int, torch.Tensor] | None = None,
                 inputs: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Lower bounds of A·h over the box, h the output of layers[:upto]; A (rows, size).

        For branch and bound: `bounds[s]` replaces site s's interval (per row: [rows, n]); `extra[s]` is added to
        the coefficients of site s's input after its relaxation (β·split terms); `record[s]` receives the
        coefficients of site s's output; `inputs` receives the final coefficients on the input (rows, n_in)."""
        const = torch.zeros(A.shape[0], dtype=DTYPE)
        for k in range(upto - 1, -1, -1):
            layer = self.net.layers[k]
            if isinstance(layer, (Linear, Conv, Scale)):
                A, c = layer.back(A)
                const = const + c
            else:
                s = self.site_of[k]
                if record is not None:
                    record[s] = A.detach()
                sl = None if slopes is None else slopes.get(s)
                if bounds is not None and s in bounds:
                    al, bl, au, bu = self._relaxation(s, sl, exact, bounds[s])
                else:
                    al, bl, au, bu = self.relaxation(s, sl, exact)
                Ap, An = A.clamp(min=0), A.clamp(max=0)
                const = const + (Ap * bl).sum(-1) + (An * bu).sum(-1)
                A = Ap * al + An * au
                if extra is not None and s in extra:
                    A = A + extra[s]
        if inputs is not None:
            inputs.append(A.detach())
        return A.clamp(min=0) @ self.lb + A.clamp(max=0) @ self.ub + const

    def _chunks(self, rows: int, upto: int) -> int:
        width = max([self.net.num_inputs] + [layer.in_size for layer in self.net.layers[:upto]])
        return max(1, CHUNK_ELEMENTS // max(1, width))

    def _query(self, s: int) -> torch.Tensor:
        """Units of site s whose bounds are worth tightening: IBP-unstable ReLUs, every gate unit."""
        l, u = self.pre[s]
        if isinstance(self.net.layers[self.sites[s]], ReLU):
            return torch.nonzero((l < 0) & (u > 0)).flatten()
        return torch.arange(l.numel())

    def _tighten(self, s: int, idx: torch.Tensor, lo: torch.Tensor, up: torch.Tensor) -> None:
        l, u = self.pre[s]
        l, u = l.clone(), u.clone()
        l[idx] = torch.maximum(l[idx], lo)
        u[idx] = torch.minimum(u[idx], up)
        self.pre[s] = (l, u)
        self._relax_cache.pop(s, None)

    def crown(self) -> None:
        """CROWN bounds of every site's input, site by site (each uses the ones before it)."""
        for s, k in enumerate(self.sites):
            if self.expired():
                return
            if k == 1:  # one affine layer from the box: its interval bounds are already the exact range
                continue
            idx = self._query(s)
            if idx.numel() == 0:
                continue
            n = self.pre[s][0].numel()
            step = self._chunks(2 * idx.numel(), k)
            los, ups = [], []
            for i in range(0, idx.numel(), max(1, step // 2)):
                part = idx[i:i + max(1, step // 2)]
                E = torch.zeros(2 * part.numel(), n, dtype=DTYPE)
                r = torch.arange(part.numel())
                E[r, part] = 1.0
                E[part.numel() + r, part] = -1.0
                b = self.backward(E, k)
                los.append(b[:part.numel()])
                ups.append(-b[part.numel():])
            self._tighten(s, idx, torch.cat(los), torch.cat(ups))
        self.method = "crown"

    def spec_bounds(self, spec: Spec, slopes: dict[int, Any] | None = None, exact: bool = True) -> torch.Tensor:
        """Lower bounds of each row of C y + d."""
        return self.backward(spec.C, len(self.net.layers), slopes, exact) + spec.d

    # -- α-CROWN ---------------------------------------------------------------------------------
    def _optimize(self, A: torch.Tensor, upto: int, steps: int, lr: float,
                  objective: Callable[[torch.Tensor], torch.Tensor], done: Callable[[torch.Tensor], bool]) -> torch.Tensor:
        """Maximize objective(lower bounds of A·h) over the slopes of the sites before layer `upto`; returns
        the elementwise best lower bounds seen (each iterate is sound, so their max is)."""
        sites = [s for s, k in enumerate(self.sites) if k < upto]
        rows = A.shape[0]
        slopes = {s: self.initial_slopes(s, rows) for s in sites}
        params = []
        for s in sites:
            for p in (slopes[s] if isinstance(slopes[s], tuple) else (slopes[s],)):
                p.requires_grad_(True)
                params.append(p)
        with torch.no_grad():
            best = self.backward(A, upto, None, exact=True)
        if not params or done(best):
            return best
        opt = torch.optim.Adam(params, lr=lr)
        for i in range(steps):
            if self.expired():
                break
            # every iterate is sound (a coarser bisection only widens the slack), so the running max is too
            bound = self.backward(A, upto, slopes, exact=False)
            best = torch.maximum(best, bound.detach())
            if done(best):
                break
            opt.zero_grad()
            (-objective(bound)).backward()
            opt.step()
            with torch.no_grad():
                for s in sites:
                    self._project(s, slopes[s])
        with torch.no_grad():  # the final slopes, with the exact (sound) intercepts
            best = torch.maximum(best, self.backward(A, upto, {s: _detach(v) for s, v in slopes.items()}, exact=True))
        return best

    def alpha_intermediate(self, steps: int = 20, lr: float = 0.1) -> None:
        """α-CROWN for the inputs of ReLU sites (after the first), one site at a time: the unstable units'
        bounds both ways, slopes of the sites before optimized for their sum. Gate sites keep CROWN's."""
        for s, k in enumerate(self.sites):
            if s == 0 or not isinstance(self.net.layers[k], ReLU) or self.expired():
                continue
            idx = self._query(s)
            if idx.numel() == 0:
                continue
            n = self.pre[s][0].numel()
            if 2 * idx.numel() * self._width(k) > CHUNK_ELEMENTS:
                continue  # too wide to optimize at once: keep CROWN's bounds
            E = torch.zeros(2 * idx.numel(), n, dtype=DTYPE)
            r = torch.arange(idx.numel())
            E[r, idx] = 1.0
            E[idx.numel() + r, idx] = -1.0
            m = idx.numel()
            # stop once every unit is stable: sign is what the MILP's binaries need
            best = self._optimize(E, k, steps, lr, objective=lambda b: b.sum(),
                                  done=lambda b: bool(torch.all((b[:m] >= 0) | (b[m:] >= 0))))
            self._tighten(s, idx, best[:m], -best[m:])
        self.method = "alpha-crown"

    def _width(self, upto: int) -> int:
        return max([self.net.num_inputs] + [layer.in_size for layer in self.net.layers[:upto]])

    def alpha_spec(self, spec: Spec, owner: Sequence[int], steps: int = 30, lr: float = 0.1) -> torch.Tensor:
        """α-CROWN lower bounds of the spec rows (slopes per row), stopping once every disjunct is excluded."""
        own = torch.as_tensor(list(owner))
        n_disj = int(own.max()) + 1 if own.numel() else 0

        def per_disjunct(b: torch.Tensor) -> torch.Tensor:
            out = torch.full((n_disj,), -math.inf, dtype=DTYPE)
            return out.scatter_reduce(0, own, b, reduce="amax")

        def objective(b: torch.Tensor) -> torch.Tensor:
            # each disjunct is excluded by its best row: push that row up, no further than 0 (then it is done)
            return torch.stack([b[own == j].max() for j in range(n_disj)]).clamp(max=0).sum() + 1e-3 * b.clamp(max=0).sum()

        A = spec.C
        best = self._optimize(A, len(self.net.layers), steps, lr, objective=lambda b: objective(b + spec.d),
                              done=lambda b: bool(torch.all(per_disjunct(b + spec.d) > 0)))
        return best + spec.d

    def result(self) -> BoxBounds:
        return BoxBounds(self.net, self.lb, self.ub, self.ibp_pre, self.ibp_out, list(self.pre), self.method)


def _detach(v):
    return tuple(t.detach() for t in v) if isinstance(v, tuple) else v.detach()


def excluded(lower: torch.Tensor, owner: Sequence[int], n_disjuncts: int) -> list[bool]:
    """Per disjunct: does some row's lower bound (of A_r y − b_r) exceed 0?"""
    out = [False] * n_disjuncts
    for v, j in zip(lower.tolist(), owner):
        out[j] = out[j] or v > 0
    return out


# ---------------------------------------------------------------------------------------------
# the swap gap: |smooth(x) − ReLU(x)| over a box


def swap_gap(smooth: Network, relu_pre: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """A sound bound, per output, on |smooth(x) − relu(x)| for every x in the box on which `relu_pre` bounds
    the ReLU network's activation inputs (site by site; relu = `smooth.relu_version()`, same weights).

    δ bounds |z' − z| elementwise (z' the smooth network's hidden values, z the ReLU network's); δ = 0 on the
    input. Affine maps carry it as |W|·δ. At a gate site with ReLU-network input z ∈ [l, u], z' ∈ [l − δ, u + δ]:

        |f(z') − ReLU(z)| ≤ sup_{[l−δ, u+δ]} |f − ReLU| + (0 if u + δ ≤ 0 else δ)      (ReLU is 1-Lipschitz)
        |f(z') − ReLU(z)| ≤ |f(z') − f(z)| + |f(z) − ReLU(z)| ≤ L·δ + sup_{[l, u]} |f − ReLU|,

    L the largest |f'| on [l − δ, u + δ]; the smaller of the two per unit. A unit whose interval stays a
    distance r from 0 adds at most r·tail(λr), exponentially small in λr."""
    net = smooth.merged()
    sites = net.activations
    if len(relu_pre) != len(sites):
        raise ValueError(f"{len(relu_pre)} pre-activation bounds for {len(sites)} activation sites")
    d = torch.zeros(net.num_inputs, dtype=DTYPE)
    s = 0
    for layer in net.layers:
        if isinstance(layer, Linear):
            d = layer.W.abs() @ d
        elif isinstance(layer, Conv):
            d = layer._conv(d[None], layer.weight.abs(), None)[0]
        elif isinstance(layer, Scale):
            d = layer.scale.abs() * d
        else:
            l, u = relu_pre[s]
            s += 1
            relu_moves = torch.where(u + d <= 0, torch.zeros_like(d), d)
            if isinstance(layer, ReLU):
                d = relu_moves
                continue
            gate = SMOOTH_GATES[layer.kind]
            lam = layer.lam
            via_relu = swap_gap_unit(gate, lam, l - d, u + d) + relu_moves
            lo, hi = slope_range(gate, lam * (l - d), lam * (u + d))
            via_gate = torch.maximum(lo.abs(), hi.abs()) * d + swap_gap_unit(gate, lam, l, u)
            d = torch.minimum(via_relu, via_gate)
    return d


def bound_network(net: Network, lb: Any, ub: Any, method: str = "crown", steps: int = 20,
                  expired: Callable[[], bool] | None = None) -> BoxBounds:
    """Bounds of every activation site's input over the box: "ibp", "crown" or "alpha-crown"."""
    b = Bounder(net, lb, ub, expired)
    if method in ("crown", "alpha-crown"):
        b.crown()
    if method == "alpha-crown":
        b.alpha_intermediate(steps)
    return b.result()
