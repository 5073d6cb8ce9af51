"""Gate families: the one place that knows a gate's identity and its constants.

A self-gated activation is f_λ(x) = x·g(λx) with a smooth step g (g(−∞) = 0, g(+∞) = 1), so f_λ → ReLU
as λ → ∞. A family is named by its gate g ("phi" for λ-GELU, "sigmoid" for λ-Swish, ...); activation
modules declare it in their `GATE` class attribute, and everything else (λ_target, the per-layer check,
the swap certificate, the sympy derivations in `analysis/theory/symbolic.py`) looks it up here.

Per family, three constants, each a bound over a power of λ:
  a: E∞(λ) = ∫|H(x) − g(λx)| dx = a/λ                (the λ-GELU paper's criterion, `gate_l1`)
  b: ∫|ReLU(x) − f_λ(x)| dx = b/λ²                     (`act_l1`)
  c: sup_x |ReLU(x) − f_λ(x)| = c/λ                    (`sup`: what a swap changes per unit)
Closed forms where they exist, scipy quadrature otherwise; the sympy derivations are tested against them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from scipy import integrate, optimize, special

CRITERIA = ("gate_l1", "act_l1", "sup")
QUAD_RTOL = 1e-12  # scipy quad's relative tolerance for the gates without closed forms (SERF, Mish)


@dataclass(frozen=True)
class GateBounds:
    """How far f_λ(x) = x·g(λx) is from ReLU, for one gate g; every bound is a constant over a power of λ."""

    gate_l1: float  # a: E∞(λ) = a/λ
    act_l1: float  # b: ∫|ReLU − f_λ| = b/λ²
    sup: float  # c: sup|ReLU − f_λ| = c/λ

    def bound(self, criterion: str, lam: float) -> float:
        return {"gate_l1": self.gate_l1 / lam, "act_l1": self.act_l1 / lam**2, "sup": self.sup / lam}[criterion]

    def lambda_for(self, criterion: str, eps: float) -> float:
        """The smallest λ whose bound is ≤ eps (every bound decreases in λ)."""
        return {"gate_l1": self.gate_l1 / eps, "act_l1": math.sqrt(self.act_l1 / eps), "sup": self.sup / eps}[criterion]


@dataclass(frozen=True)
class GateFamily:
    """One gate g of the family x·g(λx)."""

    name: str
    label: str
    g: Callable[[torch.Tensor], torch.Tensor]  # g(y) on tensors, accurate in both tails (the float64 reference)
    sym: Callable[[Any], Any]  # g(y) as a sympy expression (sympy is imported by the caller's first use)
    bounds: Callable[[], GateBounds]  # the constants a, b, c
    # The tail 1 − g(u), u > 0, as Σ_{k≥1} a(k)·e^{−b(k)u}: lets sympy integrate moments it cannot do directly.
    tail_series: Callable[[Any], tuple[Any, Any]] | None = None
    # No closed forms (and g(−y) ≠ 1 − g(y)): sympy builds the expressions, mpmath does the integrals.
    numeric: bool = False

    def f(self, x: torch.Tensor, lam: torch.Tensor | float = 1.0) -> torch.Tensor:
        """f_λ(x) = x·g(λx)."""
        return x * self.g(lam * x)


# ---------------------------------------------------------------------------------------------
# The families


def _max_u_tail(tail: Callable[[float], float]) -> float:
    """max_{u ≥ 0} u·tail(u) (unimodal): a grid, then a bounded search around its best point."""
    grid = np.linspace(0.0, 20.0, 2001)
    i = int(np.argmax([u * tail(u) for u in grid]))
    res = optimize.minimize_scalar(lambda u: -u * tail(u), bounds=(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]),
                                   method="bounded", options={"xatol": 1e-12})
    return -float(res.fun)


def _numeric_bounds(upper_tail: Callable[[float], float], lower_tail: Callable[[float], float]) -> GateBounds:
    """Bounds of a gate from its two tails on u ≥ 0: 1 − g(u) (x > 0 side) and g(−u) (x < 0 side).

    With u = λ|x|: E∞ = (∫t₊ + ∫t₋)/λ, ∫|ReLU − f_λ| = (∫u·t₊ + ∫u·t₋)/λ², sup = max_u u·t±(u)/λ.
    """
    quad = lambda f: integrate.quad(f, 0.0, np.inf, epsabs=0.0, epsrel=QUAD_RTOL, limit=200)[0]  # noqa: E731
    a = quad(upper_tail) + quad(lower_tail)
    b = quad(lambda u: u * upper_tail(u)) + quad(lambda u: u * lower_tail(u))
    return GateBounds(a, b, max(_max_u_tail(upper_tail), _max_u_tail(lower_tail)))


def _softplus(u: float) -> float:
    return float(np.logaddexp(0.0, u))


def _phi(y: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.erfc(-y / math.sqrt(2.0))  # erfc keeps the left tail accurate


def _sym_phi(y):
    import sympy as sp

    return (1 + sp.erf(y / sp.sqrt(2))) / 2


def _sym_sigmoid(y):
    import sympy as sp

    return 1 / (1 + sp.exp(-y))


def _sym_serf(y):
    """SERF's gate erf(ln(1 + e^y))."""
    import sympy as sp

    return sp.erf(sp.log(1 + sp.exp(y)))


def _sym_mish(y):
    """Mish's gate tanh(ln(1 + e^y))."""
    import sympy as sp

    return sp.tanh(sp.log(1 + sp.exp(y)))


GATES: dict[str, GateFamily] = {
    # E∞ = 2/(λ√(2π)), 1/(2λ²), c/λ with c = max_u u·Φ(−u) ≈ 0.169971
    "phi": GateFamily("phi", "λ-GELU  x·Φ(λx)", _phi, _sym_phi,
                      lambda: GateBounds(2.0 / math.sqrt(2 * math.pi), 0.5, _max_u_tail(lambda u: float(special.ndtr(-u))))),
    # E∞ = 2·ln2/λ, π²/(6λ²), W(1/e)/λ (u·σ(−u) is largest where u − 1 = e^{−u}); 1/(1 + e^u) = Σ (−1)^{k+1} e^{−ku}
    "sigmoid": GateFamily("sigmoid", "λ-Swish  x·σ(λx)", torch.sigmoid, _sym_sigmoid,
                          lambda: GateBounds(2 * math.log(2), math.pi**2 / 6, float(special.lambertw(1 / math.e).real)),
                          tail_series=lambda k: ((-1) ** (k + 1), k)),
    # erf(softplus(y)): not symmetric (g(0) = erf(ln 2) ≈ 0.673), so the two sides differ
    "serf": GateFamily("serf", "λ-SERF  x·erf(softplus(λx))", lambda y: torch.erf(torch.nn.functional.softplus(y)), _sym_serf,
                       lambda: _numeric_bounds(lambda u: float(special.erfc(_softplus(u))),
                                               lambda u: float(special.erf(math.log1p(math.exp(-u))))),
                       numeric=True),
    # tanh(softplus(y)): 1 − tanh(s) = 2σ(−2s)
    "mish": GateFamily("mish", "λ-Mish  x·tanh(softplus(λx))", lambda y: torch.tanh(torch.nn.functional.softplus(y)), _sym_mish,
                       lambda: _numeric_bounds(lambda u: 2.0 * float(special.expit(-2.0 * _softplus(u))),
                                               lambda u: math.tanh(math.log1p(math.exp(-u)))),
                       numeric=True),
}


def family(name: str) -> GateFamily:
    try:
        return GATES[name]
    except KeyError:
        raise ValueError(f"unknown gate {name!r}; registered gates: {', '.join(GATES)}") from None


def register(fam: GateFamily) -> None:
    """Add (or replace) a gate family; cached constants of a replaced one are dropped."""
    GATES[fam.name] = fam
    gate_bounds.cache_clear()


@functools.lru_cache(maxsize=None)
def gate_bounds(gate: str = "phi") -> GateBounds:
    return family(gate).bounds()


def sup_constant(gate: str = "phi") -> float:
    """c of sup|ReLU − f_λ| = c/λ, nudged up so that a bound built on it stays sound: the bounded search
    returns the function's value at its best point, which is at most the true maximum."""
    return gate_bounds(gate).sup * (1 + 1e-12)


def lambda_target(epsilon: float, criterion: str = "gate_l1", override: float = 0.0, gate: str = "phi") -> float:
    """λ_target for the gate g of x·g(λx): the smallest λ whose bound `criterion` is ≤ ε (at least 1)."""
    if override > 0:
        return float(override)
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; choose one of {', '.join(CRITERIA)}")
    return max(1.0, gate_bounds(gate).lambda_for(criterion, epsilon))
