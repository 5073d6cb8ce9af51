"""Closed forms for the gate family f_λ(x) = x·g(λx), derived with sympy when first asked for.

Nothing here is a typed-in answer: every bound is an integral, a limit or a root that sympy
computes at run time (then cached, since sympy is slow). Tests compare the results with the
closed forms quoted in docs/architecture.md ("The math") and check every bound on dense float64 samples.

A gate g is a smooth step: 0 < g < 1, g(−y) = 1 − g(y) (checked symbolically), g → H as its
argument is scaled up. With u = λx every quantity below reduces to a λ-free function of u,
which is why the bounds scale as powers of 1/λ and the Lipschitz constant does not depend on λ.

Criteria for λ_target (the smallest λ whose bound is ≤ ε):
- ``gate_l1``: E∞(λ) = ∫|H(x) − g(λx)| dx            (the λ-GELU paper's criterion)
- ``act_l1``:         ∫|ReLU(x) − x·g(λx)| dx          (what a swap changes, in L1)
- ``sup``:      sup_x |ReLU(x) − x·g(λx)| = c/λ         (what a swap changes, per unit; c = max_u u·g(−u))
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import sympy as sp
import torch

from pipeline import gates

from . import gate_numeric

X = sp.Symbol("x", real=True)
LAM = sp.Symbol("lambda", positive=True)
U = sp.Symbol("u", real=True)  # scaled input u = λx
UP = sp.Symbol("u", positive=True)  # u on the half-line u > 0
EPS = sp.Symbol("epsilon", positive=True)
K = sp.Symbol("k", integer=True, positive=True)

CRITERIA = ("gate_l1", "act_l1", "sup")
# Digits for nsolve; the tests compare against 1e-9, so 30 digits leave a wide margin.
NSOLVE_PREC = 30
# Root scans: sign changes of a λ-free function of u on a grid over [-U_SCAN, U_SCAN].
U_SCAN = 40.0
SCAN_POINTS = 8001
SCAN_NOISE = 1e-10

# Wall-clock seconds of each derivation, filled on first (uncached) call.
TIMINGS: dict[str, float] = {}


def _timed(key: str):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            TIMINGS[f"{key}[{','.join(map(str, args))}]"] = time.perf_counter() - t0
            return out

        return wrapper

    return deco


# ---------------------------------------------------------------------------------------------
# Gates: the families of `pipeline.gates` (name, sympy form g(y), torch g, tail series, numeric flag).
# `tail_series`, if given, expands the tail 1 − g(u) for u > 0 as Σ_{k≥1} a(k)·e^{−b(k)u}: it is used
# when sympy cannot integrate a moment of the tail directly (termwise integration is justified by
# dominated convergence; the partial sums are bounded by the first term). A `numeric` family has no
# closed forms: every constant comes from `gate_numeric.derive` (mpmath, error estimates stated there).

GATES = gates.GATES


def _numeric(gate: str) -> gate_numeric.NumericGate | None:
    spec = _gate(gate)
    return gate_numeric.derive(spec.name, spec.sym) if spec.numeric else None


def _float(v) -> sp.Float:
    return sp.Float(v, NSOLVE_PREC) if abs(v) != float("inf") else (sp.oo if v > 0 else -sp.oo)


def register_gate(fam: gates.GateFamily) -> None:
    """Add a gate family (`pipeline.gates.register`); the derivation caches follow every change (`_family_changed`)."""
    gates.register(fam)


def _gate(name: str) -> gates.GateFamily:
    return gates.family(name)


def smooth_activation(x: torch.Tensor, lam: float | torch.Tensor, gate: str = "phi") -> torch.Tensor:
    """x·g(λx) evaluated with the registry's torch gate (the numeric reference for checks)."""
    return _gate(gate).f(x, lam)


# ---------------------------------------------------------------------------------------------
# Derivations


@functools.lru_cache(maxsize=None)
def _check_symmetric(gate: str) -> None:
    """g(−y) = 1 − g(y); this is what lets every integral be split at 0 into two equal halves."""
    g = _gate(gate).sym
    if sp.simplify(g(-U) + g(U) - 1) != 0:
        raise ValueError(f"gate {gate!r} is not symmetric (g(-y) != 1 - g(y)); the half-line derivations do not apply")


def _tail_moment(gate: str, p: int) -> sp.Expr:
    """∫_0^∞ u^p (1 − g(u)) du, exactly."""
    spec = _gate(gate)
    res = sp.integrate(UP**p * (1 - spec.sym(UP)), (UP, 0, sp.oo))
    if not res.has(sp.Integral):
        return sp.simplify(res)
    if spec.tail_series is None:
        raise NotImplementedError(f"sympy cannot integrate the tail moment p={p} of gate {gate!r} and it has no tail_series")
    a, b = spec.tail_series(K)
    term = sp.integrate(UP**p * sp.exp(-b * UP), (UP, 0, sp.oo), conds="none")
    return sp.simplify(sp.summation(a * term, (K, 1, sp.oo)))


def _half_line_integral(gate: str, p: int) -> sp.Expr:
    """∫_0^∞ x^p (1 − g(λx)) dx with λ a positive symbol.

    Integrated directly in x; if sympy leaves it unevaluated, the substitution u = λx
    (dx = du/λ) turns it into λ^{−(p+1)}·∫_0^∞ u^p (1 − g(u)) du.
    """
    spec = _gate(gate)
    if spec.tail_series is None:  # a gate with a series is one sympy could not do in x (saves ~2 s)
        res = sp.integrate(X**p * (1 - spec.sym(LAM * X)), (X, 0, sp.oo))
        if not res.has(sp.Integral):
            return sp.simplify(res)
    return LAM ** (-(p + 1)) * _tail_moment(gate, p)


@functools.lru_cache(maxsize=None)
@_timed("gate_l1_bound")
def gate_l1_bound(gate: str = "phi") -> sp.Expr:
    """E∞(λ) = ∫_R |H(x) − g(λx)| dx as a sympy expression in `LAM`.

    For x > 0 the integrand is 1 − g(λx) ≥ 0; for x < 0 it is g(λx) = 1 − g(λ|x|) by symmetry,
    so the integral is twice the half-line integral. For "phi": sqrt(2)/(sqrt(pi)·λ).
    """
    if (num := _numeric(gate)) is not None:  # both half-lines, numerically
        return _float(num.gate_l1) / LAM
    _check_symmetric(gate)
    return sp.simplify(2 * _half_line_integral(gate, 0))


@functools.lru_cache(maxsize=None)
@_timed("act_l1_bound")
def act_l1_bound(gate: str = "phi") -> sp.Expr:
    """∫_R |ReLU(x) − x·g(λx)| dx in `LAM`.

    x > 0: x − x·g(λx) = x(1 − g(λx)) ≥ 0; x < 0: |x·g(λx)| = |x|(1 − g(λ|x|)) by symmetry.
    For "phi": 1/(2λ²); for "sigmoid": π²/(6λ²).
    """
    if (num := _numeric(gate)) is not None:
        return _float(num.act_l1) / LAM**2
    _check_symmetric(gate)
    return sp.simplify(2 * _half_line_integral(gate, 1))


def _lambdify(expr: sp.Expr, sym: sp.Symbol) -> Callable[[np.ndarray], np.ndarray]:
    return sp.lambdify(sym, expr, modules=["scipy", "numpy"])


def _bracketed_roots(expr: sp.Expr, sym: sp.Symbol, lo: float, hi: float) -> list[sp.Float]:
    """Every sign change of `expr` on a grid over [lo, hi], refined by sympy's nsolve (bisection).

    The scan runs in float64 on the erfc form (1 − erf cancels to noise in the tails); sign
    changes where both neighbours are below SCAN_NOISE × the largest value are rounding noise in
    a tail that tends to 0, not roots, and are skipped. A root that falls on a grid point (an exact 0 between
    neighbours of opposite signs: a piecewise-linear expression crosses at a round number) is one too. A sign change
    across a jump of a piecewise expression is no root (nsolve finds no zero there) and is skipped.
    """
    f = _lambdify(sp.simplify(expr.rewrite(sp.erfc)), sym)
    grid = np.linspace(lo, hi, SCAN_POINTS)
    with np.errstate(all="ignore"):
        vals = np.asarray(f(grid), dtype=float) * np.ones_like(grid)
    floor = SCAN_NOISE * np.nanmax(np.abs(vals))
    big = np.abs(vals) > floor
    sign = np.sign(vals)
    brackets = [(grid[i], grid[i + 1]) for i in np.nonzero((sign[:-1] * sign[1:] < 0) & (big[:-1] | big[1:]))[0]]
    brackets += [(grid[i - 1], grid[i + 1]) for i in np.nonzero((vals[1:-1] == 0) & (sign[:-2] * sign[2:] < 0))[0] + 1]
    roots = []
    for a, b in brackets:
        try:
            r = sp.nsolve(expr, sym, (a, b), solver="bisect", prec=NSOLVE_PREC)
        except ValueError:  # no zero in the bracket: a jump of a piecewise expression across 0
            continue
        if abs(float(expr.subs(sym, r).evalf(NSOLVE_PREC))) <= SCAN_NOISE * max(1.0, float(np.nanmax(np.abs(vals)))):
            roots.append(r)
    return sorted(roots)


def _pieces(expr: sp.Expr, sym: sp.Symbol) -> list[tuple[sp.Expr, sp.Set]]:
    """(expression, the set of `sym` where it applies) of each piece of a piecewise expression (a clipped gate),
    in order, each set without the earlier pieces' (a Piecewise takes its first true condition); one piece on the
    reals for any other expression."""
    pw = sp.piecewise_fold(expr)
    if not isinstance(pw, sp.Piecewise):
        return [(expr, sp.S.Reals)]
    out, taken = [], sp.S.EmptySet
    for e, cond in pw.args:
        where = sp.Intersection(cond.as_set() if cond is not sp.true else sp.S.Reals, sp.S.Reals) - taken
        taken = sp.Union(taken, where)
        if where is not sp.S.EmptySet:
            out.append((e, where))
    return out


def _edges(expr: sp.Expr, sym: sp.Symbol) -> list[tuple[sp.Expr, sp.Expr]]:
    """(point, value) for each finite end of each piece of a piecewise expression: the piece's one-sided limit there,
    so that a supremum approached at a breakpoint and not attained (hardswish' → 3/2 as u → 3⁻) is a candidate; []
    for an expression that is not piecewise."""
    out = []
    for e, where in _pieces(expr, sym):
        if where is sp.S.Reals:
            continue
        for part in (where.args if isinstance(where, sp.Union) else (where,)):
            for p, side in ((part.inf, "+"), (part.sup, "-")):
                if p.is_finite:
                    out.append((p, sp.limit(e, sym, p, side)))
    return out


def _limit(expr: sp.Expr, sym: sp.Symbol, point: sp.Expr, side: str = "+") -> sp.Expr:
    """sp.limit, taken on the piece of a piecewise expression that applies next to `point` on `side` (sympy's limit
    of a Piecewise at ∞ compares its conditions with zoo and fails)."""
    for e, where in _pieces(expr, sym):
        if where is sp.S.Reals:
            break
        if point is sp.oo:
            near = where.sup is sp.oo
        elif point is -sp.oo:
            near = where.inf is -sp.oo
        else:  # the piece holds an interval starting (side "+") or ending ("−") at the point
            near = any(part.inf <= point < part.sup if side == "+" else part.inf < point <= part.sup
                       for part in (where.args if isinstance(where, sp.Union) else (where,)))
        if near:
            return sp.limit(e, sym, point, side if point.is_finite else "+" if point is -sp.oo else "-")
    return sp.limit(expr, sym, point, side) if point.is_finite else sp.limit(expr, sym, point)


@dataclass(frozen=True)
class SupConstant:
    """sup_x |ReLU(x) − x·g(λx)| = c/λ, attained at x = ±u/λ (both sides, by symmetry)."""

    c: sp.Float
    u: sp.Float
    n_critical: int  # stationary points of u·(1 − g(u)) on u > 0 (1: the max is unique)
    second_derivative: float  # h''(u) at the max (< 0)
    side: int = 0  # 0: both sides (symmetric gate); ±1: attained only at x = ±u/λ (numeric gates)


@functools.lru_cache(maxsize=None)
@_timed("sup_constant")
def sup_constant(gate: str = "phi") -> SupConstant:
    """c = max_{u>0} u·g(−u), from nsolve on the derivative condition h'(u) = 0, h(u) = u(1 − g(u)).

    With u = λx, |ReLU(x) − x·g(λx)| = h(λ|x|)/λ on both half-lines (symmetry). h(0) = 0 and
    h(∞) = 0 (checked by sympy limits), so the largest stationary value is the supremum.
    For "phi": c ≈ 0.169971 at u ≈ 0.751792.
    """
    if (num := _numeric(gate)) is not None:
        return SupConstant(c=_float(num.c), u=_float(num.u_c), n_critical=num.n_critical,
                           second_derivative=num.second_derivative, side=num.side)
    _check_symmetric(gate)
    g = _gate(gate).sym
    # λ-freeness of the scaled gap is derived, not assumed: λ·gap(u/λ) must simplify to h(u).
    gap = X * (1 - g(LAM * X))
    h = sp.simplify(LAM * gap.subs(X, UP / LAM))
    if LAM in h.free_symbols:
        raise AssertionError(f"scaled gap of gate {gate!r} still depends on λ: {h}")
    if _limit(h, UP, sp.Integer(0), "+") != 0 or _limit(h, UP, sp.oo) != 0:
        raise AssertionError(f"gap of gate {gate!r} does not vanish at 0 and ∞")
    dh = sp.diff(h, UP)
    crit = _bracketed_roots(dh, UP, 1e-9, U_SCAN)
    if not crit:
        raise AssertionError(f"no stationary point of the gap of gate {gate!r} on (0, {U_SCAN}]")
    # a piecewise gap's one-sided values at its breakpoints are candidates too (a maximum at a kink of h)
    points = crit + [p for p, _ in _edges(h, UP) if 0 < p <= U_SCAN]
    vals = [h.subs(UP, r).evalf(NSOLVE_PREC) for r in crit] + [v.evalf(NSOLVE_PREC) for p, v in _edges(h, UP)
                                                               if 0 < p <= U_SCAN]
    i = int(np.argmax([float(v) for v in vals]))
    d2 = float(sp.diff(h, UP, 2).subs(UP, points[i]).evalf()) if i < len(crit) else float("nan")
    return SupConstant(c=sp.Float(vals[i], NSOLVE_PREC), u=sp.Float(points[i], NSOLVE_PREC), n_critical=len(crit),
                       second_derivative=d2)


def act_sup_bound(gate: str = "phi") -> sp.Expr:
    """sup_x |ReLU(x) − x·g(λx)| = c/λ as a sympy expression in `LAM` (c a 30-digit Float)."""
    return sup_constant(gate).c / LAM


def bound(criterion: str, gate: str = "phi") -> sp.Expr:
    """The bound named by `criterion` (one of CRITERIA) as a decreasing function of `LAM`."""
    table = {"gate_l1": gate_l1_bound, "act_l1": act_l1_bound, "sup": act_sup_bound}
    if criterion not in table:
        raise ValueError(f"unknown criterion {criterion!r}; choose one of {CRITERIA}")
    return table[criterion](gate)


@functools.lru_cache(maxsize=None)
@_timed("lambda_target_expr")
def lambda_target_expr(criterion: str, gate: str = "phi") -> sp.Expr:
    """λ*(ε) solving bound(λ) = ε; the bound decreases in λ, so bound(λ) ≤ ε ⟺ λ ≥ λ*(ε)."""
    b = bound(criterion, gate)
    if sp.diff(b, LAM).subs(LAM, 1).evalf() >= 0:  # cheap sanity check of monotonicity
        raise AssertionError(f"bound {criterion} of gate {gate!r} is not decreasing: {b}")
    sols = [s for s in sp.solve(sp.Eq(b, EPS), LAM) if s.is_positive is not False]
    if len(sols) != 1:
        raise AssertionError(f"expected one positive root for λ*, got {sols}")
    return sp.simplify(sols[0])


def lambda_target(eps: float, criterion: str = "gate_l1", gate: str = "phi") -> float:
    """Smallest λ with bound(λ) ≤ eps. gate_l1 at eps = 5e-3 gives 159.577 (the paper's ≈ 160)."""
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    return float(lambda_target_expr(criterion, gate).subs(EPS, sp.Float(eps, NSOLVE_PREC)).evalf(NSOLVE_PREC))


@dataclass(frozen=True)
class ActivationMinimum:
    """min_x x·g(λx) = value_scaled/λ at x = u/λ."""

    u: sp.Float
    value_scaled: sp.Float

    def at(self, lam: float) -> tuple[float, float]:
        """(argmin, min) for a given λ."""
        return float(self.u) / lam, float(self.value_scaled) / lam


@functools.lru_cache(maxsize=None)
@_timed("activation_minimum")
def activation_minimum(gate: str = "phi") -> ActivationMinimum:
    """Solve f'(x) = 0 for f = x·g(λx): with x = u/λ, f' = g(u) + u·g'(u) (λ-free, derived), root u < 0.

    For "phi": u ≈ −0.751792 and λ·min ≈ −0.169971, i.e. min = −c/λ with c from `sup_constant`.
    """
    if (num := _numeric(gate)) is not None:
        return ActivationMinimum(u=_float(num.min_u), value_scaled=_float(num.min_value))
    g = _gate(gate).sym
    f = X * g(LAM * X)
    d1 = sp.simplify(sp.diff(f, X).subs(X, U / LAM))
    if LAM in d1.free_symbols:
        raise AssertionError(f"f' of gate {gate!r} depends on λ after scaling: {d1}")
    roots = [r for r in _bracketed_roots(d1, U, -U_SCAN, U_SCAN) if r < 0]
    scaled = sp.simplify(LAM * f.subs(X, U / LAM))  # λ·f(u/λ) = u·g(u)
    # and a piecewise f's one-sided values at its breakpoints (an infimum at a kink)
    edges = [(p, v) for p, v in _edges(scaled, U) if p < 0]
    points = roots + [p for p, _ in edges]
    vals = [scaled.subs(U, r).evalf(NSOLVE_PREC) for r in roots] + [v.evalf(NSOLVE_PREC) for _, v in edges]
    i = int(np.argmin([float(v) for v in vals]))
    return ActivationMinimum(u=sp.Float(points[i], NSOLVE_PREC), value_scaled=sp.Float(vals[i], NSOLVE_PREC))


@dataclass(frozen=True)
class LipschitzConstant:
    """sup_x |f_λ'(x)|, the same for every λ > 0; attained at x = u_star/λ."""

    value: sp.Float
    closed_form: sp.Expr | None  # exact when sympy's solveset finds the critical points exactly
    u_star: sp.Expr
    min_slope: sp.Float  # inf_x f'(x) (negative: the activation is not monotone)
    limits: tuple[sp.Expr, sp.Expr]  # f'(−∞), f'(+∞)


@functools.lru_cache(maxsize=None)
@_timed("lipschitz_constant")
def lipschitz_constant(gate: str = "phi") -> LipschitzConstant:
    """Maximise f'(x) by solving f''(x) = 0 (f = x·g(λx)).

    With x = u/λ: f'(x) = D(u) and f''(x) = λ·D'(u), both λ-free in u. The critical points come
    from solveset when it can (exact: ±√2 for "phi"), otherwise from nsolve on a sign-change scan.
    For "phi": L = Φ(√2) + √2·φ(√2) = 1/2 + erf(1)/2 + 1/(e·√π) ≈ 1.128904 at x = √2/λ.
    """
    if (num := _numeric(gate)) is not None:
        return LipschitzConstant(value=_float(num.lipschitz), closed_form=None, u_star=_float(num.u_star),
                                 min_slope=_float(num.min_slope), limits=(sp.Integer(0), sp.Integer(1)))
    g = _gate(gate).sym
    f = X * g(LAM * X)
    d1 = sp.simplify(sp.diff(f, X).subs(X, U / LAM))
    d2 = sp.simplify(sp.diff(f, X, 2).subs(X, U / LAM) / LAM)
    if LAM in d1.free_symbols or LAM in d2.free_symbols:
        raise AssertionError(f"derivatives of gate {gate!r} depend on λ after scaling")
    # a piecewise f' (a clipped gate): each piece's zeros of f'' on its own set, and f''s one-sided values at the
    # breakpoints, where |f'| may be largest without being attained
    edges = _edges(d1, U)
    if edges:
        sols = [sp.solveset(e2, U, where) for (e2, where) in _pieces(d2, U)]
        # a piece where f'' ≡ 0 has f' constant: its values are its edges'
        exact = all(isinstance(sol, sp.FiniteSet) or sol in (where, sp.S.EmptySet) for sol, (_, where) in zip(sols, _pieces(d2, U)))
        crit = sorted((r for sol in sols if isinstance(sol, sp.FiniteSet) for r in sol), key=lambda r: float(r))
        if not exact:
            crit = _bracketed_roots(d2, U, -U_SCAN, U_SCAN)
    else:
        sol = sp.solveset(d2, U, sp.S.Reals)
        exact = isinstance(sol, sp.FiniteSet)
        crit = sorted(sol, key=lambda r: float(r)) if exact else _bracketed_roots(d2, U, -U_SCAN, U_SCAN)
    lim = (_limit(d1, U, -sp.oo), _limit(d1, U, sp.oo))
    slopes = [sp.simplify(d1.subs(U, r)) for r in crit] + [v for _, v in edges]
    crit = crit + [p for p, _ in edges]
    nums = [float(s.evalf(NSOLVE_PREC)) for s in slopes]
    i = int(np.argmax(np.abs(nums)))
    if max(abs(float(v)) for v in lim) > abs(nums[i]):
        raise AssertionError(f"sup |f'| of gate {gate!r} is a limit at infinity; not handled")
    return LipschitzConstant(
        value=sp.Float(slopes[i].evalf(NSOLVE_PREC), NSOLVE_PREC),
        closed_form=slopes[i] if exact else None,
        u_star=crit[i],
        min_slope=sp.Float(min(s.evalf(NSOLVE_PREC) for s in slopes + list(lim)), NSOLVE_PREC),
        limits=lim,
    )


_CACHED = [_check_symmetric, gate_l1_bound, act_l1_bound, sup_constant, lambda_target_expr, activation_minimum, lipschitz_constant]


_KNOWN: set[str] = set()  # the family names seen: a new name needs no clearing, a replaced or removed one does


def _family_changed(name: str, fam: gates.GateFamily | None) -> None:
    """A family replaced or removed: its derivations (cached by name) are derived again on first use."""
    if name in _KNOWN:
        for fn in _CACHED:
            fn.cache_clear()
    if fam is None:
        _KNOWN.discard(name)
    else:
        _KNOWN.add(name)


gates.on_change(_family_changed)


# ---------------------------------------------------------------------------------------------
# Report


def _coeff(expr: sp.Expr, power: int) -> float:
    """The constant a in expr = a/λ^power."""
    a = sp.simplify(expr * LAM**power)
    if LAM in a.free_symbols:
        raise AssertionError(f"{expr} is not a constant over λ^{power}")
    return float(a.evalf(NSOLVE_PREC))


def gate_summary(gate: str = "phi", eps: float = 5e-3) -> dict[str, Any]:
    """Everything derived for one gate, JSON-serialisable (floats plus sympy expressions as strings)."""
    gl1, al1, sup = gate_l1_bound(gate), act_l1_bound(gate), sup_constant(gate)
    mn, lip = activation_minimum(gate), lipschitz_constant(gate)
    return {
        "gate": gate,
        "label": _gate(gate).label,
        "gate_l1": {"expr": sp.sstr(gl1), "latex": sp.latex(gl1), "coeff": _coeff(gl1, 1), "form": "coeff/lambda"},
        "act_l1": {"expr": sp.sstr(al1), "latex": sp.latex(al1), "coeff": _coeff(al1, 2), "form": "coeff/lambda**2"},
        "sup": {
            "expr": f"{float(sup.c):.12g}/lambda",
            "c": float(sup.c),
            "u": float(sup.u),
            "n_critical": sup.n_critical,
            "side": sup.side,  # 0: at x = ±u/λ; −1 / +1: only at x = −u/λ / x = u/λ (asymmetric gates)
            "form": "c/lambda at x = ±u/lambda",
        },
        "minimum": {"u": float(mn.u), "value_times_lambda": float(mn.value_scaled), "form": "min = value_times_lambda/lambda at x = u/lambda"},
        "lipschitz": {
            "value": float(lip.value),
            "expr": sp.sstr(lip.closed_form) if lip.closed_form is not None else None,
            "u_star": float(lip.u_star),
            "u_star_expr": sp.sstr(lip.u_star),
            "min_slope": float(lip.min_slope),
            "form": "sup|f'| for every lambda, at x = u_star/lambda",
        },
        "lambda_target": {c: lambda_target(eps, c, gate) for c in CRITERIA},
        "lambda_target_expr": {c: sp.sstr(lambda_target_expr(c, gate)) for c in CRITERIA},
    }


def summary(eps: float = 5e-3, gates: tuple[str, ...] | None = None) -> dict[str, Any]:
    """All gates' derivations for a report (`bounds.json`), with the sympy timings in seconds."""
    names = tuple(GATES) if gates is None else gates
    t0 = time.perf_counter()
    out = {"eps": eps, "gates": {g: gate_summary(g, eps) for g in names}}
    out["seconds"] = time.perf_counter() - t0
    out["timings_s"] = dict(TIMINGS)
    return out
