"""Property checks for activation functions: infimum and argmin, Lipschitz constant, monotonicity,
limits at ±∞ and differentiability class.

Activations are torch callables on float64 tensors (any dict name → callable works, e.g. one built
from the pipeline's registry). Where a sympy closed form is supplied, it decides limits and the
differentiability class exactly and polishes roots with nsolve; otherwise everything is numeric:
a dense float64 grid, autograd derivatives, and scipy's bounded scalar minimiser for refinement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import mpmath
import numpy as np
import sympy as sp
import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar

from pipeline import gates, render

ActivationFn = Callable[[torch.Tensor], torch.Tensor]
SympyForm = Callable[[sp.Symbol], sp.Expr]

X = sp.Symbol("x", real=True)

# Grid: a coarse span for tails plus a fine core for steep gates (λ = 160 has structure at 1/160).
SPAN, SPAN_POINTS = 60.0, 120_001
CORE, CORE_POINTS = 1.0, 40_001
# Numeric limits read f at |x| = 10^k, k in LIMIT_POWERS: algebraic tails (softsign's 1 − 1/x) converge
# only like 1/x, so the sequence goes far out and its last step is extrapolated (geometric tail).
LIMIT_POWERS = tuple(range(2, 13))
# |f| beyond this at the farthest point counts as a divergent limit (so does 10× growth over the last 100×).
DIVERGE = 1e5
# Tolerances (named at the call sites).
LIMIT_TOL = 1e-8  # relative size of the last step of the sequence for a finite limit
MONO_TOL = 1e-12  # f' ≥ −MONO_TOL everywhere counts as non-decreasing
FLAT_TOL = 1e-12  # a limit below the grid minimum by more than this is the infimum
FLAT_CORE = 10.0  # a flat minimum must reach |x| < FLAT_CORE to count as attained on a half-line
JUMP_TOL = 1e-6  # a derivative jump smaller than this is not a discontinuity
SYMPY_MATCH_TOL = 1e-12  # the sympy form and the callable must agree to this (abs + rel)
K_MAX = 3  # highest derivative order examined for jumps


# ---------------------------------------------------------------------------------------------
# Default activations and their closed forms

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
LAMBDA_GRID = (1, 2, 10, 160)


def _lambda_gelu(lam: float) -> ActivationFn:
    return lambda x: gates.family("phi").f(x, lam)  # x·Φ(λx), Φ from erfc (`pipeline.gates.Phi`)


def default_activations() -> dict[str, ActivationFn]:
    acts: dict[str, ActivationFn] = {
        "relu": F.relu,
        "leaky_relu": F.leaky_relu,  # slope 0.01
        "elu": F.elu,
        "selu": F.selu,
        "softplus": F.softplus,
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "silu": F.silu,
        "mish": F.mish,
        "serf": lambda x: x * torch.erf(F.softplus(x)),
        "hardswish": F.hardswish,
    }
    for lam in LAMBDA_GRID:
        acts[f"lambda_gelu_{lam}"] = _lambda_gelu(float(lam))
    return acts


def _sp_phi(y: sp.Expr) -> sp.Expr:
    return gates.family("phi").sym(y)  # Φ as λ-GELU's family writes it


def _sp_softplus(x: sp.Expr) -> sp.Expr:
    return sp.log(1 + sp.exp(x))


def default_sympy_forms() -> dict[str, SympyForm]:
    forms: dict[str, SympyForm] = {
        "relu": lambda x: sp.Piecewise((0, x < 0), (x, True)),
        "leaky_relu": lambda x: sp.Piecewise((sp.Rational(1, 100) * x, x < 0), (x, True)),
        "elu": lambda x: sp.Piecewise((sp.exp(x) - 1, x < 0), (x, True)),
        "selu": lambda x: sp.Float(SELU_SCALE, 30) * sp.Piecewise((sp.Float(SELU_ALPHA, 30) * (sp.exp(x) - 1), x < 0), (x, True)),
        "softplus": _sp_softplus,
        "gelu": lambda x: x * _sp_phi(x),
        "gelu_tanh": lambda x: x / 2 * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (x + sp.Rational(44715, 10**6) * x**3))),
        "silu": lambda x: x / (1 + sp.exp(-x)),
        "mish": lambda x: x * sp.tanh(_sp_softplus(x)),
        "serf": lambda x: x * sp.erf(_sp_softplus(x)),
        "hardswish": lambda x: sp.Piecewise((0, x <= -3), (x * (x + 3) / 6, x < 3), (x, True)),
    }
    for lam in LAMBDA_GRID:
        forms[f"lambda_gelu_{lam}"] = lambda x, lam=lam: x * _sp_phi(lam * x)
    return forms


# ---------------------------------------------------------------------------------------------
# Numeric helpers


def _sym_grid(half: float, points: int) -> torch.Tensor:
    """Symmetric grid that contains 0 exactly (kinks of ReLU-like functions sit at 0)."""
    n = points // 2
    pos = torch.arange(1, n + 1, dtype=torch.float64) * (half / n)
    return torch.cat([-pos.flip(0), torch.zeros(1, dtype=torch.float64), pos])


def _grid() -> torch.Tensor:
    return torch.unique(torch.cat([_sym_grid(SPAN, SPAN_POINTS), _sym_grid(CORE, CORE_POINTS)]))  # sorted


def _derivatives(fn: ActivationFn, x: torch.Tensor, order: int) -> list[torch.Tensor]:
    """[f, f', ..., f^(order)] by autograd in float64; a derivative with no graph is constant → 0 after."""
    x = x.detach().clone().requires_grad_(True)
    out = [fn(x)]
    for _ in range(order):
        prev = out[-1]
        if not prev.requires_grad:
            out.append(torch.zeros_like(x))
            continue
        (d,) = torch.autograd.grad(prev.sum(), x, create_graph=True)
        out.append(d)
    return [t.detach() for t in out]


def _scalar(fn: ActivationFn, k: int) -> Callable[[float], float]:
    def g(v: float) -> float:
        return float(_derivatives(fn, torch.tensor([v], dtype=torch.float64), k)[k][0])

    return g


def _numeric_limit(fn: ActivationFn, sign: int) -> float:
    """lim f(x) for x → sign·∞ from f(sign·10^k): ±∞ for a divergent tail, the extrapolated limit when the
    steps shrink, NaN when neither (no limit found). The remaining tail after the last step d, with step
    ratio r = d/d_prev < 1, is d·r/(1 − r) (exact for a geometric tail such as 1/x sampled at powers of 10)."""
    xs = torch.tensor([sign * 10.0**k for k in LIMIT_POWERS], dtype=torch.float64)
    v = _derivatives(fn, xs, 0)[0].tolist()
    near, far = v[-3], v[-1]
    # Divergent: huge, or grown ~100× over the 100× step (linear growth such as leaky ReLU's tail).
    if abs(far) > DIVERGE or (abs(far) > 1 and abs(far) >= 10 * abs(near)):
        return math.copysign(math.inf, far)
    d_prev, d = v[-2] - v[-3], v[-1] - v[-2]
    if abs(d) > LIMIT_TOL * (1 + abs(far)) or (d != 0 and abs(d) >= abs(d_prev)):
        return math.nan
    r = d / d_prev if d_prev != 0 else 0.0
    lim = far + d * r / (1 - r)
    # below float64 resolution of the values sampled (softsign' → 0 extrapolates to ±1e-28): zero, not noise
    return 0.0 if abs(lim) <= 1e-15 * max(1.0, *(abs(t) for t in v)) else lim + 0.0  # no −0.0 in tables


def _refine(fun: Callable[[float], float], grid: np.ndarray, i: int) -> tuple[float, float]:
    """Minimise `fun` on the grid cell pair around index i (bounded Brent)."""
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    if lo == hi:
        return float(lo), fun(float(lo))
    res = minimize_scalar(fun, bounds=(float(lo), float(hi)), method="bounded", options={"xatol": 1e-13})
    best = min([(float(res.x), float(res.fun)), (float(grid[i]), fun(float(grid[i])))], key=lambda t: t[1])
    return best


def _jumps(fn: ActivationFn, k: int, lo: float = -10.0, hi: float = 10.0, n: int = 20_001, top: int = 6) -> list[float]:
    """Points where f^(k) jumps: bisect the cells with the largest increments down to width ~1e-12.

    A jump keeps its size as the cell shrinks; a steep but continuous derivative shrinks with it.
    """
    g = _scalar(fn, k)
    xs = torch.linspace(lo, hi, n, dtype=torch.float64)
    vals = _derivatives(fn, xs, k)[k]
    inc = (vals[1:] - vals[:-1]).abs()
    found: list[float] = []
    for i in torch.argsort(inc, descending=True)[:top].tolist():
        a, b = float(xs[i]), float(xs[i + 1])
        ga, gb = g(a), g(b)
        wide = None
        while b - a > 1e-12 * max(1.0, abs(a)):
            m = 0.5 * (a + b)
            gm = g(m)
            if abs(gm - ga) >= abs(gb - gm):
                b, gb = m, gm
            else:
                a, ga = m, gm
            if wide is None and b - a < 1e-9 * max(1.0, abs(a)):
                wide = abs(gb - ga)
        jump = abs(gb - ga)
        if jump > JUMP_TOL and wide is not None and jump > 0.5 * wide:
            p = round(0.5 * (a + b), 9) + 0.0  # bisection stops ~1e-12 from the kink
            if all(abs(p - q) > 1e-6 for q in found):
                found.append(p)
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# Symbolic helpers


def _has_kinks(expr: sp.Expr) -> bool:
    return bool(expr.atoms(sp.Piecewise, sp.Max, sp.Min, sp.Abs, sp.Heaviside, sp.sign))


def _piecewise(expr: sp.Expr) -> sp.Expr:
    return sp.piecewise_fold(expr.rewrite(sp.Piecewise))


def _breakpoints(pw: sp.Expr) -> list[sp.Expr]:
    pts: set[sp.Expr] = set()
    for rel in pw.atoms(sp.core.relational.Relational):
        pts.update(r for r in sp.solve(rel.lhs - rel.rhs, X) if r.is_real)
    return sorted(pts, key=float)


def _sympy_limit(expr: sp.Expr, sign: int) -> sp.Expr:
    if _has_kinks(expr):
        # The piece active far out on this side (all pieces here are valid on half-lines).
        return sp.limit(_piece_at(_piecewise(expr), sign * sp.Integer(10) ** 9), X, sign * sp.oo)
    return sp.limit(expr, X, sign * sp.oo)


def _piece_at(pw: sp.Expr, x: sp.Expr) -> sp.Expr:
    for piece, cond in pw.args:
        if cond == sp.true or bool(cond.subs(X, x)):
            return piece
    raise ValueError(f"no piece of {pw} covers x = {x}")


def _one_sided(pw: sp.Expr, p: sp.Expr, k: int, side: int) -> sp.Expr:
    """lim_{x→p±} f^(k)(x): the k-th derivative of the piece that is active just beside p.

    (sympy's own `limit` of a Piecewise ignores the direction, so the piece is picked here.)
    """
    piece = _piece_at(pw, p + side * sp.Rational(1, 10**20))
    return sp.limit(sp.diff(piece, X, k), X, p, "+" if side > 0 else "-")


def _sympy_class(expr: sp.Expr) -> tuple[str, list[float]]:
    """Differentiability class from a closed form: C∞ for compositions of analytic functions; for a
    Piecewise, the first derivative order whose one-sided limits differ at a breakpoint."""
    if not _has_kinks(expr):
        return "C∞", []
    pw = _piecewise(expr)
    pts = _breakpoints(pw)
    for k in range(K_MAX + 1):
        bad = [p for p in pts if sp.simplify(_one_sided(pw, p, k, -1) - _one_sided(pw, p, k, +1)) != 0]
        if bad:
            return ("discontinuous" if k == 0 else f"C{k - 1}"), [float(p) for p in bad]
    return f"C≥{K_MAX}", []


def _polish(expr: sp.Expr, x0: float) -> float | None:
    """nsolve expr = 0 from x0 (smooth closed forms only); None if it does not converge nearby."""
    try:
        r = float(sp.nsolve(expr, X, x0, prec=30))
    except (ValueError, ZeroDivisionError, TypeError):
        return None
    return r if abs(r - x0) < 1e-3 * max(1.0, abs(x0)) else None


def _fmt_float(v: float | None) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and math.isinf(v):
        return "+∞" if v > 0 else "−∞"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return f"{v:.6g}"


# ---------------------------------------------------------------------------------------------
# The checks


def activation_properties(name: str, fn: ActivationFn, form: SympyForm | None = None) -> dict[str, Any]:
    """One row: infimum/argmin, Lipschitz constant, monotonicity, limits, differentiability class."""
    xs = _grid()
    f, d1 = _derivatives(fn, xs, 1)
    grid = xs.numpy()
    fv, dv = f.numpy(), d1.numpy()
    expr = form(X) if form is not None else None
    row: dict[str, Any] = {"name": name, "method": "sympy+numeric" if expr is not None else "numeric"}

    if expr is not None:  # guard against a closed form that is not the callable's function
        probe = np.linspace(-8.0, 8.0, 161)
        mp_fn = sp.lambdify(X, expr, modules="mpmath")
        with mpmath.workdps(30):
            ref = np.array([float(mp_fn(mpmath.mpf(float(v)))) for v in probe])
        got = fn(torch.tensor(probe, dtype=torch.float64)).numpy()
        err = float(np.max(np.abs(got - ref) / (1 + np.abs(ref))))
        if err > SYMPY_MATCH_TOL:
            raise ValueError(f"sympy form of {name!r} disagrees with the callable (max rel err {err:.3g})")

    # Limits at ±∞.
    lim_num = (_numeric_limit(fn, -1), _numeric_limit(fn, +1))
    if expr is not None:
        lims = tuple(float(_sympy_limit(expr, s)) for s in (-1, 1))
        for a, b in zip(lims, lim_num):
            if not (a == b or abs(a - b) <= 1e-6 * (1 + abs(a))):
                raise AssertionError(f"{name}: sympy limit {a} vs numeric {b}")
    else:
        lims = lim_num
    row["limit_neg"], row["limit_pos"] = lims

    # Infimum and argmin.
    i = int(np.argmin(fv))
    fmin = float(fv[i])
    if -math.inf in lims:
        row.update(inf=-math.inf, argmin=None, min_attained=False, argmin_set=None)
    else:
        exact = np.nonzero(fv == fmin)[0]
        at_edge = i in (0, len(grid) - 1)
        tail_inf = min(lims)
        if at_edge and np.any(np.abs(grid[exact]) < FLAT_CORE):
            # Exactly constant at its infimum on a half-line reaching into the core, e.g. ReLU = 0
            # on x ≤ 0 (ELU or softplus only round to their limit far out, and are excluded).
            lo, hi = grid[exact[0]], grid[exact[-1]]
            desc = f"x ≤ {hi:.6g}" if exact[0] == 0 else f"x ≥ {lo:.6g}"
            row.update(inf=fmin, argmin=None, min_attained=True, argmin_set=desc)
        elif at_edge or tail_inf < fmin - FLAT_TOL:
            row.update(inf=float(tail_inf), argmin=None, min_attained=False, argmin_set=None)
        else:
            xm, vm = _refine(_scalar(fn, 0), grid, i)
            if expr is not None and not _has_kinks(expr):
                p = _polish(sp.diff(expr, X), xm)
                if p is not None:
                    xm, vm = p, float(expr.subs(X, p).evalf(20))
            row.update(inf=vm, argmin=xm, min_attained=True, argmin_set=None)

    # Differentiability class first: where f' jumps, its one-sided limits are slope candidates
    # that a grid only approaches (hardswish' → 1.5 at 3⁻).
    if expr is not None:
        cls, kinks = _sympy_class(expr)
    else:
        cls, kinks = f"C≥{K_MAX} (numeric)", []
        for order in range(K_MAX + 1):
            pts = _jumps(fn, order)
            if pts:
                cls, kinks = ("discontinuous" if order == 0 else f"C{order - 1}"), pts
                break
    kink_slopes: list[tuple[float, float]] = []  # (x, one-sided f') at the kinks of f'
    if cls == "C0":
        for p in kinks:
            if expr is not None:
                pw = _piecewise(expr)
                kink_slopes += [(p, float(_one_sided(pw, sp.nsimplify(p), 1, side))) for side in (-1, 1)]
            else:
                h = 1e-12 * max(1.0, abs(p))
                kink_slopes += [(p, _scalar(fn, 1)(v)) for v in (p - h, p, p + h)]

    # Lipschitz constant sup|f'| and the smallest slope.
    slope_lims = [v for v in (_numeric_limit(_scalar_derivative_fn(fn), s) for s in (-1, 1)) if not math.isnan(v)]
    j = int(np.argmax(np.abs(dv)))
    xl, neg_abs = _refine(lambda v: -abs(_scalar(fn, 1)(v)), grid, j)
    lip, lip_at = -neg_abs, xl
    if expr is not None and not _has_kinks(expr):
        p = _polish(sp.diff(expr, X, 2), xl)
        if p is not None:
            lip, lip_at = abs(float(sp.diff(expr, X).subs(X, p).evalf(20))), p
    for p, v in kink_slopes:
        if abs(v) > lip:
            lip, lip_at = abs(v), p
    tail = max(abs(v) for v in slope_lims)
    if tail >= lip - 1e-12:  # the sup is approached far out (or is flat, e.g. ReLU' = 1 on x > 0)
        lip, lip_at = max(lip, tail), None
    if lip_at is not None and abs(lip_at) < 1e-9:
        lip_at = 0.0  # Brent stops within its tolerance of a maximum at 0 (sigmoid, tanh, softsign)
    if cls == "discontinuous":  # |f(a) − f(b)| stays at the jump as b → a: no finite constant, whatever f' is
        lip, lip_at = math.inf, None
        row["lipschitz_note"] = "not Lipschitz: discontinuous at " + ", ".join(f"{p:g}" for p in kinks)
    row["lipschitz"], row["lipschitz_at"] = lip, lip_at

    k = int(np.argmin(dv))
    _, smin = _refine(_scalar(fn, 1), grid, k)
    row["min_slope"] = min(smin, *slope_lims, *(v for _, v in kink_slopes))
    row["monotone"] = bool(row["min_slope"] >= -MONO_TOL)
    row["smoothness"], row["kinks"] = cls, kinks
    return row


def _scalar_derivative_fn(fn: ActivationFn) -> ActivationFn:
    return lambda x: _derivatives(fn, x, 1)[1]


def property_table(
    activations: Mapping[str, ActivationFn] | None = None,
    sympy_forms: Mapping[str, SympyForm] | None = None,
) -> list[dict[str, Any]]:
    """Rows for every activation; closed forms are used for the names that have one.

    Defaults: `default_activations()` with `default_sympy_forms()`. Pass `sympy_forms={}` to force
    the purely numeric path.
    """
    acts = default_activations() if activations is None else activations
    forms = default_sympy_forms() if sympy_forms is None else sympy_forms
    return [activation_properties(name, fn, forms.get(name)) for name, fn in acts.items()]


COLUMNS = (
    ("name", "activation"),
    ("inf", "inf f"),
    ("argmin", "argmin"),
    ("lipschitz", "Lipschitz"),
    ("lipschitz_at", "at x"),
    ("min_slope", "min f'"),
    ("monotone", "monotone"),
    ("limit_neg", "f(−∞)"),
    ("limit_pos", "f(+∞)"),
    ("smoothness", "class"),
    ("method", "method"),
)


def render_markdown(rows: list[dict[str, Any]]) -> str:
    cells = []
    for r in rows:
        line = []
        for key, _ in COLUMNS:
            v = r.get(key)
            if key == "argmin" and v is None:
                line.append(str(r.get("argmin_set") or "not attained"))
            elif key == "monotone":
                line.append("yes" if v else "no")
            elif key == "lipschitz" and r.get("lipschitz_note"):
                line.append(str(r["lipschitz_note"]))
            elif isinstance(v, float) or v is None:
                line.append(_fmt_float(v))
            else:
                line.append(str(v))
        cells.append(line)
    return render.table([t for _, t in COLUMNS], cells) + "\n"


def jsonable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with ±inf/nan as strings, for json.dump."""

    def conv(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        if isinstance(v, list):
            return [conv(t) for t in v]
        return v

    return [{k: conv(v) for k, v in r.items()} for r in rows]
