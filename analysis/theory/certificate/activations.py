"""Rules for modules: every gate (the swap's deviation c/λ globally, the exact ReLU image per sample, the smooth
gate's Lipschitz constant and float32 evaluation) and the registry's other activations, which both networks keep
(`ACTIVATION_RULES`: Lipschitz constants, monotonicity, jumps, ulp errors). `_intercept` installs them as instance
forwards on the walking copy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.activations import Gate, LogSigmoid, PReLU, gate_of

from .core import EXACT, SAFETY, ULP_ELEMENTWISE, U32, Refused, _Dev, _gate_lipschitz, _per_unit, gate_constant, gate_rounding
from .signed import finite, monotone_image, signed_of


def _signed(x: _Dev, h: Callable, y: torch.Tensor, ops: int):
    """The exact channel's signed change after a monotone h (`signed.monotone_image`), or None when the walk carries none."""
    if not x.walk.signed:
        return None
    c, r = signed_of(x, EXACT)
    return finite(*monotone_image(h, x.value.to(torch.float64), y.to(torch.float64), c, r, ops))

def _gate_forward(fam: str, lam: torch.Tensor, orig: Callable, x: Any) -> Any:
    if not isinstance(x, _Dev):
        return orig(x)
    walk, z = x.walk, x.value
    y = orig(z)
    boxes = []
    for ci, ch in enumerate(walk.channels):
        d = x.boxes[ci]
        if ch.gate == "swap" and ch.sample:  # R's ReLU on [z − d, z + d] against S's value: monotone, exact image
            b = torch.maximum((F.relu(z - d) - y).abs(), (F.relu(z + d) - y).abs())
        elif ch.gate == "swap":
            b = d + _per_unit(gate_constant(fam) / lam, d)
        elif ch.gate == "smooth":  # S̃'s gate at ṽ vs S's at z: Lipschitz, plus its float32 evaluation
            b = _gate_lipschitz(fam) * d + SAFETY * gate_rounding(z.abs() + d)
        else:  # R̃ vs R: ReLU on both sides, 1-Lipschitz and exact in float
            b = d
        boxes.append(b)
    return walk.wrap(y, boxes, _signed(x, F.relu, y, 0))  # ReLU against the gate's value


@dataclass(frozen=True)
class ActivationRule:
    """What the certificate knows of an activation h that both networks keep (not a gate)."""

    lipschitz: Callable[[nn.Module], float | torch.Tensor]  # sup |h'| (per channel for PReLU)
    monotone: Callable[[nn.Module], bool]  # non-decreasing: the per-sample rule uses the interval image
    ulps: int = 0  # float32 evaluation error ≤ ulps·u·(|h| + |x| + const); 0 for exact ones (max, clamp)
    const: Callable[[nn.Module], float] = lambda m: 0.0
    jumps: Callable[[nn.Module], list[tuple[float, float]]] = lambda m: []


def _slope(m: nn.Module) -> float:
    return (m.lower + m.upper) / 2  # RReLU in eval


SELU_SCALE_ALPHA = 1.0507009873554804934193349852946 * 1.6732632423543772848170429916717
ACTIVATION_RULES: dict[type[nn.Module], ActivationRule] = {
    nn.ReLU: ActivationRule(lambda m: 1.0, lambda m: True),
    nn.ReLU6: ActivationRule(lambda m: 1.0, lambda m: True),
    nn.Hardtanh: ActivationRule(lambda m: 1.0, lambda m: True),
    nn.LeakyReLU: ActivationRule(lambda m: max(1.0, abs(m.negative_slope)), lambda m: m.negative_slope >= 0, ulps=1),
    nn.PReLU: ActivationRule(lambda m: torch.clamp(m.weight.detach().abs().to(torch.float64), min=1.0),
                             lambda m: bool((m.weight >= 0).all()), ulps=1),
    PReLU: ActivationRule(lambda m: torch.clamp(m.weight.detach().abs().to(torch.float64), min=1.0),
                          lambda m: bool((m.weight >= 0).all()), ulps=1),  # slopes on the channel axis of tokens
    nn.RReLU: ActivationRule(lambda m: max(1.0, abs(_slope(m))), lambda m: _slope(m) >= 0, ulps=1),
    nn.ELU: ActivationRule(lambda m: max(1.0, abs(m.alpha)), lambda m: m.alpha >= 0, ULP_ELEMENTWISE + 2, lambda m: abs(m.alpha)),
    nn.CELU: ActivationRule(lambda m: 1.0, lambda m: True, ULP_ELEMENTWISE + 3, lambda m: abs(m.alpha)),  # e^{x/α} ≤ 1 for x < 0
    nn.SELU: ActivationRule(lambda m: SELU_SCALE_ALPHA, lambda m: True, ULP_ELEMENTWISE + 3, lambda m: SELU_SCALE_ALPHA),
    # x·1{|x| > λ}: 1-Lipschitz between its jumps of size λ at ±λ
    nn.Hardshrink: ActivationRule(lambda m: 1.0, lambda m: False, 0, jumps=lambda m: [(-m.lambd, m.lambd), (m.lambd, m.lambd)]),
    nn.Softshrink: ActivationRule(lambda m: 1.0, lambda m: True, 1, lambda m: m.lambd),
    # torch switches to x where βx > threshold: a jump of log1p(e^{−threshold})/β there (≈ 2e-9 at the defaults)
    nn.Softplus: ActivationRule(lambda m: 1.0, lambda m: False, ULP_ELEMENTWISE + 2, lambda m: 1.0 / m.beta,
                                jumps=lambda m: [(m.threshold / m.beta, math.log1p(math.exp(-m.threshold)) / m.beta)]),
    nn.Hardsigmoid: ActivationRule(lambda m: 1 / 6, lambda m: True, 2, lambda m: 0.5),
    nn.Sigmoid: ActivationRule(lambda m: 0.25, lambda m: True, ULP_ELEMENTWISE + 2, lambda m: 1.0),
    nn.Tanh: ActivationRule(lambda m: 1.0, lambda m: True, ULP_ELEMENTWISE + 2, lambda m: 1.0),
    nn.Tanhshrink: ActivationRule(lambda m: 1.0, lambda m: True, ULP_ELEMENTWISE + 3, lambda m: 1.0),  # h' = tanh² ≤ 1
    nn.Softsign: ActivationRule(lambda m: 1.0, lambda m: True, 4),
    nn.LogSigmoid: ActivationRule(lambda m: 1.0, lambda m: True, ULP_ELEMENTWISE + 3, lambda m: 1.0),
    LogSigmoid: ActivationRule(lambda m: 1.0, lambda m: True, ULP_ELEMENTWISE + 3, lambda m: 1.0),
}


def _activation_forward(rule: ActivationRule, m: nn.Module, orig: Callable, x: Any) -> Any:
    if not isinstance(x, _Dev):
        return orig(x)
    walk, z = x.walk, x.value
    y = orig(z)
    lip = rule.lipschitz(m)
    lip = _per_unit(lip, z) if isinstance(lip, torch.Tensor) else lip
    boxes = []
    for ci, ch in enumerate(walk.channels):
        d = x.boxes[ci]
        if ch.sample and rule.monotone(m):
            b = torch.maximum((orig(z + d) - y).abs(), (orig(z - d) - y).abs())
        else:
            b = lip * d
        for at, size in rule.jumps(m):
            crosses = (z - d <= at) & (at <= z + d) if ch.sample else d > 0
            b = b + size * (crosses & (d > 0)).to(torch.float64)
        if ch.rounding and rule.ulps:
            b = b + SAFETY * rule.ulps * U32 * (y.abs() + b + z.abs() + d + rule.const(m))
        boxes.append(b)
    signed = _signed(x, orig, y, rule.ulps + 1) if rule.monotone(m) and not rule.jumps(m) else None
    return walk.wrap(y, boxes, signed)


def _intercept(net: nn.Module) -> None:
    """Gates and the registry's other activations compute their boxes as modules (instance forwards)."""
    for name, m in net.named_modules():
        g = gate_of(m)
        if g is not None:
            if isinstance(m, Gate) and type(m.to_relu()) is not nn.ReLU:
                raise Refused(f"the swap turns {name or 'the root'} ({type(m).__name__}) into {type(m.to_relu()).__name__}, not ReLU")
            m.forward = functools.partial(_gate_forward, g[0], g[1], m.forward)
        elif type(m) in ACTIVATION_RULES:
            if isinstance(m, nn.RReLU) and m.training:
                raise Refused(f"{name}: RReLU in training mode is random")
            m.forward = functools.partial(_activation_forward, ACTIVATION_RULES[type(m)], m, m.forward)
        elif isinstance(m, nn.GELU):  # approximate="tanh": gate_of does not count it, so the swap keeps it
            pass  # both networks keep it; its torch function has no rule, so it refuses once it sees a box
