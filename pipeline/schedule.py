"""Algorithm 1's schedule: the switch epoch, the linear annealing of λ, the learning rate per epoch, and
the optimizer groups (s at c·lr with no weight decay). λ_target comes from `pipeline.gates`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .activations import hardness_parameters


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
