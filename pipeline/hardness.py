"""Algorithm 1's pieces: λ_target from a tolerance, the annealing schedule, the optimizer groups.

The closed forms here are what training uses; `analysis/symbolic.py` re-derives each with sympy at
run time and the tests assert that both agree.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from scipy import optimize, special
from torch import nn

from .activations import hardness_parameters


def _sup_gap_constant() -> float:
    """c = max_u u·Φ(−u): the sup of |ReLU(x) − xΦ(λx)| is c/λ."""
    res = optimize.minimize_scalar(lambda u: -u * special.ndtr(-u), bounds=(0.0, 3.0), method="bounded",
                                   options={"xatol": 1e-12})
    return float(-res.fun)


SUP_GAP_C = _sup_gap_constant()  # ≈ 0.169971

# criterion -> (bound(λ), λ needed for bound ≤ ε), for the gate Φ (λ-GELU).
BOUNDS: dict[str, tuple[Callable[[float], float], Callable[[float], float]]] = {
    # E∞(λ) = ∫|H(x) − Φ(λx)| dx = 2/(λ√(2π))   (the paper's criterion)
    "gate_l1": (lambda lam: 2.0 / (lam * math.sqrt(2 * math.pi)), lambda eps: 2.0 / (eps * math.sqrt(2 * math.pi))),
    # ∫|ReLU(x) − xΦ(λx)| dx = 1/(2λ²)
    "act_l1": (lambda lam: 1.0 / (2 * lam * lam), lambda eps: 1.0 / math.sqrt(2 * eps)),
    # sup_x |ReLU(x) − xΦ(λx)| = c/λ
    "sup": (lambda lam: SUP_GAP_C / lam, lambda eps: SUP_GAP_C / eps),
}


def lambda_target(epsilon: float, criterion: str = "gate_l1", override: float = 0.0) -> float:
    if override > 0:
        return float(override)
    return max(1.0, BOUNDS[criterion][1](epsilon))


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
