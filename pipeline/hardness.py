"""Algorithm 1's pieces: λ_target from a tolerance, the annealing schedule, the optimizer groups.

The closed forms here are what training uses; `analysis/symbolic.py` re-derives each with sympy at
run time and the tests assert that both agree.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from scipy import integrate, optimize, special
from torch import nn

from .activations import hardness_parameters


def _sup_gap_constant() -> float:
    """c = max_u u·Φ(−u): the sup of |ReLU(x) − xΦ(λx)| is c/λ."""
    res = optimize.minimize_scalar(lambda u: -u * special.ndtr(-u), bounds=(0.0, 3.0), method="bounded",
                                   options={"xatol": 1e-12})
    return float(-res.fun)


SUP_GAP_C = _sup_gap_constant()  # ≈ 0.169971
CRITERIA = ("gate_l1", "act_l1", "sup")
QUAD_RTOL = 1e-12  # scipy quad's relative tolerance for the gates without closed forms (SERF, Mish)


@dataclass(frozen=True)
class GateBounds:
    """How far f_λ(x) = x·g(λx) is from ReLU, for one gate g; every bound is a constant over a power of λ."""

    gate_l1: float  # a: E∞(λ) = ∫|H(x) − g(λx)| dx = a/λ   (the λ-GELU paper's criterion)
    act_l1: float  # b: ∫|ReLU(x) − f_λ(x)| dx = b/λ²
    sup: float  # c: sup_x |ReLU(x) − f_λ(x)| = c/λ

    def bound(self, criterion: str, lam: float) -> float:
        return {"gate_l1": self.gate_l1 / lam, "act_l1": self.act_l1 / lam**2, "sup": self.sup / lam}[criterion]

    def lambda_for(self, criterion: str, eps: float) -> float:
        """The smallest λ whose bound is ≤ eps (every bound decreases in λ)."""
        return {"gate_l1": self.gate_l1 / eps, "act_l1": math.sqrt(self.act_l1 / eps), "sup": self.sup / eps}[criterion]


def _softplus(u: float) -> float:
    return float(np.logaddexp(0.0, u))


def _numeric_bounds(upper_tail: Callable[[float], float], lower_tail: Callable[[float], float]) -> GateBounds:
    """Bounds of a gate from its two tails on u ≥ 0: 1 − g(u) (x > 0 side) and g(−u) (x < 0 side).

    With u = λ|x|: E∞ = (∫t₊ + ∫t₋)/λ, ∫|ReLU − f_λ| = (∫u·t₊ + ∫u·t₋)/λ², sup = max_u u·t±(u)/λ.
    """
    quad = lambda f: integrate.quad(f, 0.0, np.inf, epsabs=0.0, epsrel=QUAD_RTOL, limit=200)[0]  # noqa: E731
    a = quad(upper_tail) + quad(lower_tail)
    b = quad(lambda u: u * upper_tail(u)) + quad(lambda u: u * lower_tail(u))
    c = 0.0
    grid = np.linspace(0.0, 20.0, 2001)
    for tail in (upper_tail, lower_tail):
        h = lambda u, tail=tail: -u * tail(u)  # noqa: E731
        i = int(np.argmin([h(u) for u in grid]))  # refine the grid's best point (the gaps are unimodal)
        res = optimize.minimize_scalar(h, bounds=(grid[max(i - 1, 0)], grid[i + 1]), method="bounded", options={"xatol": 1e-12})
        c = max(c, -float(res.fun))
    return GateBounds(a, b, c)


# gate (as in analysis/symbolic.GATES) -> its bounds; closed forms where sympy finds them (the tests
# compare every entry with analysis/symbolic.py), scipy quadrature for SERF and Mish.
GATE_BOUNDS: dict[str, Callable[[], GateBounds]] = {
    # E∞ = 2/(λ√(2π)), 1/(2λ²), c/λ with c = max_u u·Φ(−u)
    "phi": lambda: GateBounds(2.0 / math.sqrt(2 * math.pi), 0.5, SUP_GAP_C),
    # E∞ = 2·ln2/λ, π²/(6λ²), W(1/e)/λ (u·σ(−u) is largest where u − 1 = e^{−u})
    "sigmoid": lambda: GateBounds(2 * math.log(2), math.pi**2 / 6, float(special.lambertw(1 / math.e).real)),
    # erf(softplus(y)): not symmetric (g(0) = erf(ln 2) ≈ 0.673), so the two sides differ
    "serf": lambda: _numeric_bounds(lambda u: float(special.erfc(_softplus(u))),
                                    lambda u: float(special.erf(math.log1p(math.exp(-u))))),
    # tanh(softplus(y)): 1 − tanh(s) = 2σ(−2s)
    "mish": lambda: _numeric_bounds(lambda u: 2.0 * float(special.expit(-2.0 * _softplus(u))),
                                    lambda u: math.tanh(math.log1p(math.exp(-u)))),
}


@functools.lru_cache(maxsize=None)
def gate_bounds(gate: str = "phi") -> GateBounds:
    if gate not in GATE_BOUNDS:
        raise ValueError(f"no bounds for gate {gate!r}; known gates: {', '.join(GATE_BOUNDS)}")
    return GATE_BOUNDS[gate]()


def lambda_target(epsilon: float, criterion: str = "gate_l1", override: float = 0.0, gate: str = "phi") -> float:
    """λ_target for the gate g of x·g(λx): the smallest λ whose bound `criterion` is ≤ ε (at least 1)."""
    if override > 0:
        return float(override)
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; choose one of {', '.join(CRITERIA)}")
    return max(1.0, gate_bounds(gate).lambda_for(criterion, epsilon))


def switch_epoch(epochs: int, fraction: float) -> int:
    """e_s = floor(fraction·T): λ is learned in epochs 1..e_s and annealed in e_s+1..T."""
    return int(math.floor(fraction * epochs))


def annealed_lambda(lam_switch: torch.Tensor, epoch: int, e_s: int, epochs: int, target: float) -> torch.Tensor:
    """λ(e) = λ(e_s) + (e − e_s)/(T − e_s)·(λ_target − λ(e_s)); equals λ_target exactly at e = T."""
    if epoch >= epochs:
        return torch.full_like(lam_switch, float(target))
    frac = (epoch - e_s) / (epochs - e_s)
    return lam_switch + frac * (target - lam_switch)


def param_groups(model: nn.Module, lr: float, weight_decay: float, lr_mult: float) -> list[dict]:
    """Weights with weight decay; every hardness parameter s at c·lr with no weight decay."""
    hard = {id(p) for p in hardness_parameters(model)}
    weights = [p for p in model.parameters() if id(p) not in hard]
    groups = [{"params": weights, "lr": lr, "weight_decay": weight_decay, "name": "weights", "lr_mult": 1.0}]
    if hard:
        groups.append({"params": hardness_parameters(model), "lr": lr_mult * lr, "weight_decay": 0.0,
                       "name": "hardness", "lr_mult": lr_mult})
    return groups


def lr_at(epoch: int, epochs: int, base: float, schedule: str) -> float:
    """Per-epoch learning rate (epoch is 1-based); a pure function so a resumed run matches."""
    if schedule == "constant":
        return base
    return base * 0.5 * (1.0 + math.cos(math.pi * (epoch - 1) / epochs))
