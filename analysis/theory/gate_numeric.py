"""Bounds of f_λ(x) = x·g(λx) for gates with no closed-form integrals: SERF's erf(softplus(y)) and
Mish's tanh(softplus(y)). sympy builds and differentiates each expression (no derivative is typed in);
mpmath integrates and finds roots at WORK_DPS digits, and every integral carries its error estimate.

Neither gate is symmetric (g(0) = erf(ln 2) ≈ 0.6725 for SERF, tanh(ln 2) = 0.6 for Mish, not 1/2), so
the half-lines are treated separately. With u = λ|x| and the tails t₊(u) = 1 − g(u), t₋(u) = g(−u):

    E∞(λ) = ∫|H(x) − g(λx)| dx        = (A₊ + A₋)/λ,    A± = ∫₀^∞ t±(u) du
    ∫|ReLU(x) − x·g(λx)| dx           = (B₊ + B₋)/λ²,   B± = ∫₀^∞ u·t±(u) du
    sup_x |ReLU(x) − x·g(λx)|         = c/λ,            c = max(max_u u·t₊(u), max_u u·t₋(u))

Both gates are steps as λ → ∞ (g(−∞) = 0, g(+∞) = 1, checked at ±U_MAX), so x·g(λx) → ReLU and every
bound above → 0 like a power of 1/λ: λ_target follows from ε exactly as for Φ and σ. For SERF, c is the
negative bound of SERF itself (≈ 0.3484, the paper's value), attained on the x < 0 side.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable

import mpmath
import sympy as sp

WORK_DPS = 45  # working digits; the results are good to far fewer (see QUAD_REL, ROOT_TOL)
QUAD_REL = 1e-25  # each integral's error estimate must be below this fraction of its value
ROOT_TOL = 1e-30  # findroot tolerance on stationary points
U_MAX = 60.0  # stationary points are sought on (0, U_MAX]; the tails are < 1e-40 beyond
SCAN_POINTS = 801
SCAN_NOISE = 1e-40  # sign changes of a derivative smaller than this (relative) are rounding noise in a tail
LIMIT_TOL = 1e-20  # |g(−U_MAX)| and |1 − g(U_MAX)| must be below this: g is a step

_U = sp.Symbol("u", real=True)


@dataclass(frozen=True)
class NumericGate:
    """Everything the symbolic module needs for one gate, as mpmath numbers (see the module docstring)."""

    name: str
    a_pos: mpmath.mpf
    a_neg: mpmath.mpf
    b_pos: mpmath.mpf
    b_neg: mpmath.mpf
    quad_error: float  # the largest error estimate of the four integrals, relative to its value
    c: mpmath.mpf
    u_c: mpmath.mpf  # the sup is attained at x = side·u_c/λ
    side: int  # +1: on x > 0, −1: on x < 0
    n_critical: int  # stationary points of u·t(u) on that side
    second_derivative: float  # of u·t(u) at u_c (< 0: a maximum)
    min_u: mpmath.mpf  # min_x x·g(λx) = min_value/λ at x = min_u/λ
    min_value: mpmath.mpf
    lipschitz: mpmath.mpf  # sup |f_λ'| for every λ, at x = u_star/λ
    u_star: mpmath.mpf
    min_slope: mpmath.mpf
    seconds: float

    @property
    def gate_l1(self) -> mpmath.mpf:
        return self.a_pos + self.a_neg

    @property
    def act_l1(self) -> mpmath.mpf:
        return self.b_pos + self.b_neg


def _quad(f: Callable, errors: list[float]) -> mpmath.mpf:
    """∫₀^∞ f with its error estimate checked. The piece beyond U_MAX is left out where f(U_MAX) is below the working
    precision: a tail that decays like e^{−e^u} (a gate h(e^y)) cannot be evaluated at the far nodes of [U_MAX, ∞)
    (mpmath would build numbers of e^u bits), and what it adds there is far below QUAD_REL."""
    cut = abs(f(mpmath.mpf(U_MAX))) < mpmath.mpf(10) ** -WORK_DPS
    val, err = mpmath.quad(f, [0, 1, 4, 16, U_MAX] if cut else [0, 1, 4, 16, mpmath.inf], error=True)
    rel = float(err / abs(val))
    if not rel <= QUAD_REL:
        raise ArithmeticError(f"mpmath.quad error estimate {rel:.2e} exceeds QUAD_REL={QUAD_REL:g}")
    errors.append(rel)
    return val


def _stationary(dfn: Callable, lo: float, hi: float) -> list[mpmath.mpf]:
    """Roots of dfn on [lo, hi]: sign changes on a grid (noise in the tails skipped), refined by findroot."""
    grid = [mpmath.mpf(lo) + (mpmath.mpf(hi) - lo) * i / (SCAN_POINTS - 1) for i in range(SCAN_POINTS)]
    vals = [dfn(x) for x in grid]
    floor = SCAN_NOISE * max(abs(v) for v in vals)
    roots = []
    for i in range(SCAN_POINTS - 1):
        if vals[i] * vals[i + 1] < 0 and max(abs(vals[i]), abs(vals[i + 1])) > floor:
            roots.append(mpmath.findroot(dfn, (grid[i], grid[i + 1]), solver="anderson", tol=ROOT_TOL))
    return roots


@functools.lru_cache(maxsize=None)
def derive(name: str, sym: Callable[[sp.Expr], sp.Expr]) -> NumericGate:
    """All constants of the gate g = sym(y) (a sympy builder, as in `pipeline.gates.GateFamily.sym`)."""
    t0 = time.perf_counter()
    u = _U
    g = sym(u)
    tails = {+1: (1 - g).rewrite(sp.erfc), -1: sym(-u)}  # erfc: 1 − erf cancels in the upper tail
    with mpmath.workdps(WORK_DPS):
        lam = lambda e: sp.lambdify(u, e, modules="mpmath")  # noqa: E731
        for side, lim in ((-1, 0), (+1, 1)):
            gap = abs(lam(g)(side * mpmath.mpf(U_MAX)) - lim)
            if not gap < LIMIT_TOL:
                raise ArithmeticError(f"gate {name!r} is not a step: |g({side * U_MAX:+g}) − {lim}| = {float(gap):.2e}")
        errors: list[float] = []
        ints = {s: (_quad(lam(t), errors), _quad(lam(u * t), errors)) for s, t in tails.items()}
        best = None  # (h(u_c), u_c, side, n_critical, h''(u_c))
        side_max: dict[int, tuple] = {}
        for s, t in tails.items():
            h = u * t
            dh, d2h, hf = lam(sp.diff(h, u)), lam(sp.diff(h, u, 2)), lam(h)
            crit = _stationary(dh, 1e-12, U_MAX)
            if not crit:
                raise ArithmeticError(f"gate {name!r}: no stationary point of u·t(u) on side {s:+d}")
            top = max(crit, key=hf)
            side_max[s] = (hf(top), top)
            if best is None or hf(top) > best[0]:
                best = (hf(top), top, s, len(crit), float(d2h(top)))
        # min of x·g(λx) is on x < 0: u·g(u) = −h₋(−u), so it is −max h₋ at u = −argmax h₋
        min_value, min_u = -side_max[-1][0], -side_max[-1][1]
        # f_λ'(x) = D(u) = g(u) + u·g'(u) at u = λx; its extremes solve D'(u) = 0; D(−∞) = 0, D(+∞) = 1
        D = g + u * sp.diff(g, u)
        Df, dD = lam(D), lam(sp.diff(D, u))
        crit = _stationary(dD, -U_MAX, U_MAX)
        cands = [(Df(r), r) for r in crit] + [(mpmath.mpf(0), mpmath.mpf(-mpmath.inf)), (mpmath.mpf(1), mpmath.mpf(mpmath.inf))]
        lip, u_star = max(cands, key=lambda vr: abs(vr[0]))
        return NumericGate(
            name=name, a_pos=ints[+1][0], a_neg=ints[-1][0], b_pos=ints[+1][1], b_neg=ints[-1][1],
            quad_error=max(errors), c=best[0], u_c=best[1], side=best[2], n_critical=best[3], second_derivative=best[4],
            min_u=min_u, min_value=min_value, lipschitz=lip, u_star=u_star, min_slope=min(v for v, _ in cands),
            seconds=time.perf_counter() - t0,
        )
