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
from torch.autograd.function import once_differentiable

from . import fastgate
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
    """x·Φ(λx) with the fused kernels of `pipeline.fastgate` (our CPU kernel, torch.compile, or native ops,
    one pass each way); saves only x and λ for backward, as GELU saves x.

    ∂f/∂x = Φ(z) + z·φ(z) and ∂f/∂λ = x²·φ(z) = x·(z·φ(z))/λ, with z = λx. The second form never
    multiplies an overflowing x² by an underflowing φ.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:  # lam broadcasts to x
        ctx.backend = fastgate.backend_for(x, lam)
        ctx.save_for_backward(x, lam)
        return fastgate.forward(x, lam, ctx.backend)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, lam = ctx.saved_tensors
        return fastgate.backward(grad, x, lam, ctx.backend, *ctx.needs_input_grad[:2])


def lambda_gelu(x: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
    """λ-GELU(x) = x·Φ(λx). Exports to ONNX as Mul → Gelu/Erf → Div (plain expression path)."""
    lam = torch.as_tensor(lam, dtype=x.dtype, device=x.device)
    # The TorchScript ONNX exporter traces (is_tracing); the dynamo one compiles (is_compiling).
    if not torch.is_grad_enabled() or torch.jit.is_tracing():
        return F.gelu(x * lam) / lam
    if torch.compiler.is_compiling():  # a compiled graph fuses and differentiates the product form itself
        return F.gelu(x * lam) / lam if torch.onnx.is_in_onnx_export() else lambda_gelu_reference(x, lam)
    y = fastgate.fused(x, lam)  # the fused CPU kernel, autograd in C++
    return y if y is not None else _LambdaGELUFunction.apply(x, lam)


def lambda_gelu_s(x: torch.Tensor, s: torch.Tensor, t: float) -> torch.Tensor:
    """λ-GELU with λ = 1 + softplus(s/t) from the hardness parameter s ([1] per layer, [C] per channel on
    dim 1 of x). Training on CPU computes λ inside the fused kernel; otherwise `lambda_gelu(x, λ(s))`."""
    s = s.reshape(()) if s.numel() == 1 else s.view(1, -1, *([1] * (x.dim() - 2)))
    if torch.is_grad_enabled() and not torch.jit.is_tracing() and not torch.compiler.is_compiling():
        y = fastgate.fused_s(x, s.to(x.dtype), t)
        if y is not None:
            return y
    return lambda_gelu(x, lambda_from_s(s, t))


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
# The other self-gated activations x·g(λx): σ (Swish/SiLU), erf∘softplus (SERF), tanh∘softplus (Mish).
# Each is a step as λ → ∞ (g(−∞) = 0, g(+∞) = 1), so the same hardening and swap apply.


def lambda_swish(x: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
    """x·σ(λx) (= SiLU(λx)/λ). Kept as a product: autograd's ∂/∂λ of SiLU(λx)/λ is a difference of two
    terms ≈ x/λ that cancel for λx ≫ 1, while the product gives x²·σ'(λx) directly. ONNX: Mul → Sigmoid → Mul."""
    lam = torch.as_tensor(lam, dtype=x.dtype, device=x.device)
    return x * torch.sigmoid(lam * x)


def lambda_serf(x: torch.Tensor, lam: torch.Tensor | float = 1.0) -> torch.Tensor:
    """x·erf(softplus(λx)); SERF at λ = 1. Stable for any |x|: softplus is the identity above 20 and
    log1p(eˣ) below, and every factor of the autograd derivative is bounded (erf' = 2/√π·e^{−s²} ≤ 2/√π,
    σ ≤ 1), so no inf·0 at |x| = 1e4. ONNX: Mul → Softplus → Erf → Mul."""
    lam = torch.as_tensor(lam, dtype=x.dtype, device=x.device)
    return x * torch.erf(F.softplus(lam * x))


def serf(x: torch.Tensor) -> torch.Tensor:
    """SERF(x) = x·erf(ln(1 + eˣ)) (Nag & Bhattacharyya)."""
    return x * torch.erf(F.softplus(x))


class SiLU(Gate):
    GATE = "sigmoid"  # x·σ(x): λ-Swish at λ = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


class SERF(Gate):
    GATE = "serf"  # x·erf(softplus(x)): λ-SERF at λ = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return serf(x)


class Mish(Gate):
    GATE = "mish"  # x·tanh(softplus(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.mish(x)


class LambdaSwish(HardenableGate):
    GATE = "sigmoid"  # x·σ(λx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lambda_swish(x, self._lam_for(x))


class LambdaSERF(HardenableGate):
    GATE = "serf"  # x·erf(softplus(λx))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lambda_serf(x, self._lam_for(x))


class LogSigmoid(nn.Module):
    """log σ(x) = −softplus(−x). torch's exporter writes nn.LogSigmoid as Log(Sigmoid(x)), and onnxruntime's
    Sigmoid has an absolute (not relative) error, so the Log amplifies it to ~1e-3 for x ≪ 0: this form
    exports as Neg → Softplus → Neg and agrees with PyTorch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -F.softplus(-x)


class Linked(nn.Module):
    """Linked neurons with the mirror linkage (Riera & Pujol, Eq. 6): f(z) = (g(z), g(−z)), concatenated
    on dim 1, so C units give 2C outputs that share input weights (CReLU when g = ReLU). `inner` is
    called on z and on −z, so a per-unit λ or PReLU slope is shared by the pair.

    Not a Gate itself: the swap walker descends into it and swaps `inner`, which yields the linked ReLU
    pair and keeps the widths; `to_relu` does the same for callers that hold the pair.
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # [N, C, ...] -> [N, 2C, ...]
        return torch.cat([self.inner(z), self.inner(-z)], dim=1)

    def to_relu(self) -> "Linked":
        return Linked(self.inner.to_relu() if isinstance(self.inner, Gate) else self.inner)


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
    # Registry name of the activation after the swap stage ("relu" for a gate, "linked_relu" for a linked
    # gate pair); None: not a gate, the swap leaves it as it is.
    swap_to: str | None = None


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
    "gelu": ActivationSpec(build=lambda ctx: GELU(), swap_to="relu"),
    "lambda_gelu": ActivationSpec(
        build=lambda ctx: LambdaGELU(_hardness_param(ctx), ctx.cfg.temperature), hardenable=True, gate="phi", swap_to="relu"
    ),
}

# Self-gated activations and their λ forms (see `lambda_swish`, `lambda_serf`).
ACTIVATIONS.update({
    "silu": ActivationSpec(build=lambda ctx: SiLU(), gate="sigmoid", swap_to="relu"),
    "serf": ActivationSpec(build=lambda ctx: SERF(), gate="serf", swap_to="relu"),
    "mish": ActivationSpec(build=lambda ctx: Mish(), gate="mish", swap_to="relu"),
    "lambda_swish": ActivationSpec(build=lambda ctx: LambdaSwish(_hardness_param(ctx), ctx.cfg.temperature),
                                   hardenable=True, gate="sigmoid", swap_to="relu"),
    "lambda_serf": ActivationSpec(build=lambda ctx: LambdaSERF(_hardness_param(ctx), ctx.cfg.temperature),
                                  hardenable=True, gate="serf", swap_to="relu"),
})

# The GELU analysis paper's zoo (torch defaults). Not gates: the swap leaves them unchanged. PReLU has
# one slope per unit (He et al.); RReLU samples slopes in training and uses their mean in eval.
ACTIVATIONS.update({name: ActivationSpec(build=build) for name, build in {
    "elu": lambda ctx: nn.ELU(),
    "hardshrink": lambda ctx: nn.Hardshrink(),
    "hardsigmoid": lambda ctx: nn.Hardsigmoid(),
    "hardtanh": lambda ctx: nn.Hardtanh(),
    "hardswish": lambda ctx: nn.Hardswish(),
    "leaky_relu": lambda ctx: nn.LeakyReLU(),
    "logsigmoid": lambda ctx: LogSigmoid(),
    "prelu": lambda ctx: nn.PReLU(num_parameters=ctx.channels),
    "relu6": lambda ctx: nn.ReLU6(),
    "rrelu": lambda ctx: nn.RReLU(),
    "selu": lambda ctx: nn.SELU(),
    "celu": lambda ctx: nn.CELU(),
    "sigmoid": lambda ctx: nn.Sigmoid(),
    "softplus": lambda ctx: nn.Softplus(),
    "softshrink": lambda ctx: nn.Softshrink(),
    "softsign": lambda ctx: nn.Softsign(),
    "tanh": lambda ctx: nn.Tanh(),
    "tanhshrink": lambda ctx: nn.Tanhshrink(),
}.items()})

RELU_FORMS = ("relu", "linked_relu")  # what a swapped model's activation is


def _linked(base: ActivationSpec) -> ActivationSpec:
    return ActivationSpec(build=lambda ctx: Linked(base.build(ctx)), hardenable=base.hardenable, gate=base.gate,
                          expansion=2 * base.expansion, swap_to="linked_relu" if base.swap_to else None)


# Linked neurons for every activation above: linked_<name> = (g(z), g(−z)); linked_relu is CReLU.
ACTIVATIONS.update({f"linked_{name}": _linked(spec) for name, spec in list(ACTIVATIONS.items())})


def swapped_activation(name: str) -> str | None:
    """Registry name of the model's activation after the swap stage; None when the swap does not apply."""
    return name if name in RELU_FORMS else ACTIVATIONS[name].swap_to


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
