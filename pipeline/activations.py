"""Activation registry: every gate a model can use, built through one constructor signature.

A *gate* is an activation module that the swap stage may replace (`Gate.to_relu`). A *hardenable*
gate has the form x·g(λx) with λ = 1 + softplus(s/t) ≥ 1, and anneals toward ReLU as λ → ∞.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import GateConfig

INV_SQRT2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
# Beyond |z| = 40 the float32 normal pdf is exactly 0; clamping keeps z·φ(z) finite (no inf·0).
_PDF_CLAMP = 40.0


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce a broadcast gradient back to `shape` (the λ tensor's shape)."""
    if t.shape == shape:
        return t
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead > 0 else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


class _LambdaGELUFunction(torch.autograd.Function):
    """x·Φ(λx) computed as GELU(λx)/λ with the native kernel; saves only x and λ for backward.

    ∂f/∂x = Φ(z) + z·φ(z) and ∂f/∂λ = x²·φ(z) = x·(z·φ(z))/λ, with z = λx. The second form never
    multiplies an overflowing x² by an underflowing φ.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:  # lam broadcasts to x
        ctx.save_for_backward(x, lam)
        return F.gelu(x * lam) / lam

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, lam = ctx.saved_tensors
        z = x * lam
        zc = z.clamp(-_PDF_CLAMP, _PDF_CLAMP)
        zpdf = zc * torch.exp(-0.5 * zc * zc) * INV_SQRT_2PI
        grad_x = grad * (0.5 * (1.0 + torch.erf(z * INV_SQRT2)) + zpdf) if ctx.needs_input_grad[0] else None
        grad_lam = _sum_to(grad * x * zpdf / lam, lam.shape) if ctx.needs_input_grad[1] else None
        return grad_x, grad_lam


def lambda_gelu(x: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
    """λ-GELU(x) = x·Φ(λx). Exports to ONNX as Mul → Gelu/Erf → Div (plain expression path)."""
    lam = torch.as_tensor(lam, dtype=x.dtype, device=x.device)
    if torch.onnx.is_in_onnx_export() or not torch.is_grad_enabled():
        return F.gelu(x * lam) / lam
    return _LambdaGELUFunction.apply(x, lam)


def lambda_gelu_reference(x: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
    """Plain erf-based autograd form; the float64 reference in tests."""
    return x * 0.5 * (1.0 + torch.erf(lam * x * INV_SQRT2))


def lambda_from_s(s: torch.Tensor, t: float) -> torch.Tensor:
    # F.softplus switches to the identity above s/t = 20: no overflow for any s.
    return 1.0 + F.softplus(s / t)


def s_from_lambda(lam: float, t: float) -> float:
    """Inverse of λ = 1 + softplus(s/t); λ must be > 1."""
    y = lam - 1.0
    if y <= 0:
        raise ValueError(f"λ must be > 1, got {lam}")
    # log(expm1(y)) = y + log(1 - e^{-y}) is the stable form for large y.
    return t * (y + math.log(-math.expm1(-y)))


# ---------------------------------------------------------------------------------------------
# Modules


class Gate(nn.Module):
    """An activation the swap stage replaces by ReLU."""

    def to_relu(self) -> nn.Module:
        return nn.ReLU()


class GELU(Gate):
    GATE = "phi"  # x·Φ(x): λ-GELU at λ = 1, for the bound checks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


class HardenableGate(Gate):
    """x·g(λx) with learnable λ = 1 + softplus(s/t), and a frozen mode for annealing.

    `s` has shape [1] (layer/global) or [C] (channel). In frozen mode λ comes from the
    `lam_fixed` buffer instead of s, so s drops out of the graph and receives no gradient.
    Buffers travel in the state dict, so a checkpoint taken mid-annealing restores exactly.
    """

    def __init__(self, s: nn.Parameter, temperature: float):
        super().__init__()
        self.s = s
        self.temperature = float(temperature)
        self.register_buffer("lam_fixed", torch.ones_like(s.detach()))
        self.register_buffer("frozen", torch.tensor(False))

    @property
    def lam(self) -> torch.Tensor:
        """Current λ, shape like s."""
        if bool(self.frozen):
            return self.lam_fixed
        return lambda_from_s(self.s, self.temperature)

    def freeze(self, lam: torch.Tensor) -> None:
        """Stop learning s and use the given λ (annealing step of Algorithm 1)."""
        self.lam_fixed.copy_(torch.as_tensor(lam, dtype=self.lam_fixed.dtype).expand_as(self.lam_fixed))
        self.frozen.fill_(True)

    def _lam_for(self, x: torch.Tensor) -> torch.Tensor:
        lam = self.lam
        if lam.numel() == 1:
            return lam.reshape(())
        return lam.view(1, -1, *([1] * (x.dim() - 2)))  # per channel: dim 1 of [N, C, ...]

    def extra_repr(self) -> str:
        return f"shape={tuple(self.s.shape)}, t={self.temperature}"


class LambdaGELU(HardenableGate):
    GATE = "phi"  # x·Φ(λx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lambda_gelu(x, self._lam_for(x))


# ---------------------------------------------------------------------------------------------
# Registry


@dataclass
class GateContext:
    """What a model tells the registry about one activation site."""

    channels: int  # features (Linear) or channels (Conv) at this site
    index: int  # 0-based position among the model's activation sites
    count: int  # number of activation sites
    cfg: GateConfig
    shared: dict  # per-model scratch space (the global λ parameter lives here)


@dataclass(frozen=True)
class ActivationSpec:
    build: Callable[[GateContext], nn.Module]
    hardenable: bool = False  # has a λ that Algorithm 1 anneals
    gate: str | None = None  # the gate g in x·g(λx), for the bound registry in analysis/
    expansion: int = 1  # outputs per input unit (2 for a linked pair (g(z), g(−z)))


def _init_lambda(ctx: GateContext) -> float:
    cfg = ctx.cfg
    if cfg.init == "uniform" or ctx.count == 1:
        return cfg.init_lambda
    frac = ctx.index / (ctx.count - 1)
    if cfg.init == "decreasing":
        frac = 1.0 - frac
    return cfg.init_lambda + frac * (cfg.init_lambda_max - cfg.init_lambda)


def _hardness_param(ctx: GateContext) -> nn.Parameter:
    s0 = s_from_lambda(_init_lambda(ctx), ctx.cfg.temperature)
    if ctx.cfg.granularity == "global":
        if "global_s" not in ctx.shared:
            ctx.shared["global_s"] = nn.Parameter(torch.full((1,), s_from_lambda(ctx.cfg.init_lambda, ctx.cfg.temperature)))
        return ctx.shared["global_s"]
    n = ctx.channels if ctx.cfg.granularity == "channel" else 1
    return nn.Parameter(torch.full((n,), s0))


ACTIVATIONS: dict[str, ActivationSpec] = {
    "relu": ActivationSpec(build=lambda ctx: nn.ReLU()),
    "gelu": ActivationSpec(build=lambda ctx: GELU()),
    "lambda_gelu": ActivationSpec(
        build=lambda ctx: LambdaGELU(_hardness_param(ctx), ctx.cfg.temperature), hardenable=True, gate="phi"
    ),
}


def build_activation(name: str, ctx: GateContext) -> nn.Module:
    return ACTIVATIONS[name].build(ctx)


def hardenable_gates(model: nn.Module) -> list[HardenableGate]:
    return [m for m in model.modules() if isinstance(m, HardenableGate)]


def hardness_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The distinct s parameters (a global s is shared by every gate, listed once)."""
    seen: dict[int, nn.Parameter] = {}
    for g in hardenable_gates(model):
        seen.setdefault(id(g.s), g.s)
    return list(seen.values())


def layer_lambdas(model: nn.Module) -> list[float]:
    """One λ per activation site (the channel mean for per-channel gates), for logs and reports."""
    return [float(g.lam.detach().mean()) for g in hardenable_gates(model)]
