"""Activation registry: every gate a model can use, built through one constructor signature.

A *gate* is an activation module that the swap stage may replace (`Gate.to_relu`). A *hardenable*
gate has the form x·g(λx) with λ = 1 + softplus(s/t) ≥ 1, and anneals toward ReLU as λ → ∞.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import gates, kernels
from .config import GateConfig, check_choice
from .gates import GATES, Phi, channel_axis, per_channel


def with_limits(x: torch.Tensor, lam: torch.Tensor, g: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """x·g(λx) for a step-like gate g, equal to its limits where λx = ±∞ (x there, 0 at −∞; never inf·0 = NaN),
    with the limits' gradients there too (∂f/∂x = 1 or 0, ∂f/∂λ = 0). Elsewhere exactly x·g(λx)."""
    z = lam * x
    inf = torch.isinf(z)
    xs = torch.where(inf, torch.zeros((), dtype=x.dtype, device=x.device), x)
    return torch.where(inf & (z > 0), x, xs * g(lam * xs))


def lambda_gelu(x: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
    """λ-GELU(x) = x·Φ(λx). Exports to ONNX as Mul → Gelu → Div (GELU(λx)/λ, the exporter's path)."""
    lam = torch.as_tensor(lam, dtype=x.dtype, device=x.device)
    # The TorchScript ONNX exporter traces (is_tracing); the dynamo one compiles (is_compiling). ONNX has no
    # Erfc: the graph keeps GELU(λx)/λ and its runtime's Gelu decides the far tail.
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return F.gelu(x * lam) / lam
    if not torch.is_grad_enabled():
        return with_limits(x, lam, Phi)
    if torch.compiler.is_compiling():  # a compiled graph fuses and differentiates the product form itself
        return lambda_gelu_reference(x, lam)
    # training: the chosen kernel (pipeline.kernels), one autograd node per layer
    return kernels.apply(x, lam)


def _kernel_path(x: torch.Tensor) -> bool:
    """Training (autograd on, not tracing for export, not inside torch.compile): the fused kernels serve."""
    return torch.is_grad_enabled() and not torch.jit.is_tracing() and not torch.compiler.is_compiling()


def lambda_gelu_s(x: torch.Tensor, s: torch.Tensor, t: float) -> torch.Tensor:
    """λ-GELU with λ = 1 + softplus(s/t) from the hardness parameter s ([1] per layer, [C] per channel along
    `channel_axis`). Training computes λ inside the fused kernel where one runs; otherwise `lambda_gelu(x, λ(s))`."""
    s = per_channel(s, x)
    if _kernel_path(x):
        y = kernels.apply_s(x, s, t, "phi")
        if y is not None:
            return y
    return lambda_gelu(x, lambda_from_s(s, t))


def lambda_gelu_reference(x: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
    """Plain autograd form x·Φ(λx) with its limits at ±∞ (erfc-based); the float64 reference in tests."""
    return with_limits(x, torch.as_tensor(lam, dtype=x.dtype, device=x.device), Phi)


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


def _sync_frozen_after_load(module: "HardenableGate", _incompatible_keys) -> None:
    module._sync_frozen()


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
        self._frozen = False  # the buffer's value on the host: forward must not read a GPU buffer every step
        self.register_load_state_dict_post_hook(_sync_frozen_after_load)  # a module-level function: the model pickles

    def _sync_frozen(self) -> None:
        self._frozen = bool(self.frozen)

    @property
    def lam(self) -> torch.Tensor:
        """Current λ, shape like s."""
        if self._frozen:
            return self.lam_fixed
        return lambda_from_s(self.s, self.temperature)

    def freeze(self, lam: torch.Tensor) -> None:
        """Stop learning s and use the given λ (annealing step of Algorithm 1)."""
        self.lam_fixed.copy_(torch.as_tensor(lam, dtype=self.lam_fixed.dtype).expand_as(self.lam_fixed))
        self.frozen.fill_(True)
        self._frozen = True

    def _lam_for(self, x: torch.Tensor) -> torch.Tensor:
        return per_channel(self.lam, x)

    @staticmethod
    def expression(x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """x·g(λx) as a differentiable expression (each gate defines it)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Training goes through a fused kernel where one serves this gate: λ from s inside the op while s is
        # learned, the frozen λ buffer while annealing; otherwise the gate's own expression. On CUDA the
        # Triton kernel takes s or λ flat ([1] or [C] along `channel_axis`): no view, no broadcast per call.
        if x.is_cuda and torch.compiler.is_compiling() and torch.is_grad_enabled():
            # torch.compile: the Triton kernels as a torch.library op it traces into (pipeline/kernels/gate_op.py)
            y = kernels.gate_compiled(x, self.lam_fixed if self._frozen else self.s, self.temperature, self.GATE,
                                      self._frozen, channel_axis(x))
            if y is not None:
                return y
        if _kernel_path(x):
            if x.is_cuda:
                y = kernels.gate_cuda(x, self.lam_fixed if self._frozen else self.s, self.temperature, self.GATE,
                                      self._frozen, channel_axis(x))
            else:
                y = (kernels.apply_frozen(x, per_channel(self.lam_fixed, x), self.GATE) if self._frozen
                     else kernels.apply_s(x, per_channel(self.s, x), self.temperature, self.GATE))
            if y is not None:
                return y
        return self.expression(x, self._lam_for(x))

    def extra_repr(self) -> str:
        return f"shape={tuple(self.s.shape)}, t={self.temperature}"


class LambdaGELU(HardenableGate):
    GATE = "phi"  # x·Φ(λx)
    expression = staticmethod(lambda x, lam: lambda_gelu(x, lam))


# ---------------------------------------------------------------------------------------------
# The other self-gated activations x·g(λx): σ (Swish/SiLU), erf∘softplus (SERF), tanh∘softplus (Mish), hardsigmoid
# (HardSwish).
# Each is a step as λ → ∞ (g(−∞) = 0, g(+∞) = 1), so the same hardening and swap apply.


def lambda_gate(x: torch.Tensor, lam: torch.Tensor | float, gate: str) -> torch.Tensor:
    """x·g(λx) for the family `gate`, kept as a product: autograd's ∂/∂λ of F(λx)/λ is a difference of two terms
    ≈ x/λ that cancel for λx ≫ 1, while the product gives x²·g'(λx) directly. Traced for ONNX as Mul → g's ops →
    Mul (`GateFamily.onnx`), or Mul → F's op → Div where the pattern names F; otherwise with its limits at λx = ±∞
    (`with_limits`)."""
    lam = torch.as_tensor(lam, dtype=x.dtype, device=x.device)
    fam = GATES[gate]
    g = fam.g
    if torch.jit.is_tracing():
        if fam.onnx is not None and fam.onnx.F is not None:  # one op the verifier reads exactly: HardSwish(λx)/λ
            return fam.onnx.F(lam * x) / lam
        return x * g(lam * x)
    return with_limits(x, lam, g)


def lambda_swish(x: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
    """x·σ(λx) (= SiLU(λx)/λ, kept as a product: `lambda_gate`). ONNX: Mul → Sigmoid → Mul."""
    return lambda_gate(x, lam, "sigmoid")


def lambda_serf(x: torch.Tensor, lam: torch.Tensor | float = 1.0) -> torch.Tensor:
    """x·erf(softplus(λx)); SERF at λ = 1. Stable for any |x|: softplus is the identity above 20 and
    log1p(eˣ) below, and every factor of the autograd derivative is bounded (erf' = 2/√π·e^{−s²} ≤ 2/√π,
    σ ≤ 1), so no inf·0 at |x| = 1e4. ONNX: Mul → Softplus → Erf → Mul."""
    return lambda_gate(x, lam, "serf")


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


class HardSwish(Gate):
    GATE = "hardsigmoid"  # x·hardsigmoid(x) (torch's nn.Hardswish): λ-HardSwish at λ = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardswish(x)


class LambdaSwish(HardenableGate):
    GATE = "sigmoid"  # x·σ(λx)
    expression = staticmethod(lambda x, lam: lambda_swish(x, lam))


class LambdaSERF(HardenableGate):
    GATE = "serf"  # x·erf(softplus(λx))
    expression = staticmethod(lambda x, lam: lambda_serf(x, lam))


class LambdaHardSwish(HardenableGate):
    GATE = "hardsigmoid"  # x·hardsigmoid(λx) = hardswish(λx)/λ, exported as Mul → HardSwish → Div
    expression = staticmethod(lambda x, lam: lambda_gate(x, lam, "hardsigmoid"))


class PReLU(nn.PReLU):
    """nn.PReLU with its per-unit slopes on the channel axis of token inputs [B, T, C] too (torch's applies
    them along dim 1, which is T there)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3 and self.num_parameters > 1:
            return super().forward(x.transpose(1, 2)).transpose(1, 2)
        return super().forward(x)


class LogSigmoid(nn.Module):
    """log σ(x) = −softplus(−x). torch's exporter writes nn.LogSigmoid as Log(Sigmoid(x)), and onnxruntime's
    Sigmoid has an absolute (not relative) error, so the Log amplifies it to ~1e-3 for x ≪ 0: this form
    exports as Neg → Softplus → Neg and agrees with PyTorch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -F.softplus(-x)


class Linked(nn.Module):
    """Linked neurons with the mirror linkage (Riera & Pujol, Eq. 6): f(z) = (g(z), g(−z)), concatenated
    along the channel axis (`channel_axis`), so C units give 2C outputs that share input weights (CReLU when g = ReLU). `inner` is
    called on z and on −z, so a per-unit λ or PReLU slope is shared by the pair.

    Not a Gate itself: the swap walker descends into it and swaps `inner`, which yields the linked ReLU
    pair and keeps the widths; `to_relu` does the same for callers that hold the pair.
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # [N, C, ...] -> [N, 2C, ...]
        return torch.cat([self.inner(z), self.inner(-z)], dim=channel_axis(z))  # the last dim of [B, T, C] tokens

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
    module: type[nn.Module]  # the class `build` returns (for a linked pair: the class of its inner g)
    expansion: int = 1  # outputs per input unit (2 for a linked pair (g(z), g(−z)))
    # Registry name of the activation after the swap stage ("relu" for a gate, "linked_relu" for a linked
    # gate pair); None: not a gate, the swap leaves it as it is.
    swap_to: str | None = None

    @property
    def hardenable(self) -> bool:
        """Has a λ that Algorithm 1 anneals."""
        return issubclass(self.module, HardenableGate)

    @property
    def gate(self) -> str | None:
        """The family of its gate g in x·g(λx) (`pipeline.gates`), declared by the module class."""
        return getattr(self.module, "GATE", None)


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


def gate_spec(cls: type[Gate]) -> ActivationSpec:
    """A gate: built plainly, or with a hardness parameter when it is hardenable; swaps to ReLU."""
    if issubclass(cls, HardenableGate):
        return ActivationSpec(build=lambda ctx: cls(_hardness_param(ctx), ctx.cfg.temperature), module=cls, swap_to="relu")
    return ActivationSpec(build=lambda ctx: cls(), module=cls, swap_to="relu")


ACTIVATIONS: dict[str, ActivationSpec] = {
    "relu": ActivationSpec(build=lambda ctx: nn.ReLU(), module=nn.ReLU),
    "gelu": gate_spec(GELU),
    "lambda_gelu": gate_spec(LambdaGELU),
    # Self-gated activations and their λ forms (see `lambda_swish`, `lambda_serf`).
    "silu": gate_spec(SiLU),
    "serf": gate_spec(SERF),
    "mish": gate_spec(Mish),
    "lambda_swish": gate_spec(LambdaSwish),
    "lambda_serf": gate_spec(LambdaSERF),
    "hardswish": gate_spec(HardSwish),
    "lambda_hardswish": gate_spec(LambdaHardSwish),
}

# The GELU analysis paper's zoo (torch defaults). Not gates: the swap leaves them unchanged. PReLU has
# one slope per unit (He et al.); RReLU samples slopes in training and uses their mean in eval.
ACTIVATIONS.update({name: ActivationSpec(build=lambda ctx, cls=cls, kw=kw: cls(**kw(ctx)), module=cls) for name, (cls, kw) in {
    "elu": (nn.ELU, lambda ctx: {}),
    "hardshrink": (nn.Hardshrink, lambda ctx: {}),
    "hardsigmoid": (nn.Hardsigmoid, lambda ctx: {}),
    "hardtanh": (nn.Hardtanh, lambda ctx: {}),
    "leaky_relu": (nn.LeakyReLU, lambda ctx: {}),
    "logsigmoid": (LogSigmoid, lambda ctx: {}),
    "prelu": (PReLU, lambda ctx: {"num_parameters": ctx.channels}),
    "relu6": (nn.ReLU6, lambda ctx: {}),
    "rrelu": (nn.RReLU, lambda ctx: {}),
    "selu": (nn.SELU, lambda ctx: {}),
    "celu": (nn.CELU, lambda ctx: {}),
    "sigmoid": (nn.Sigmoid, lambda ctx: {}),
    "softplus": (nn.Softplus, lambda ctx: {}),
    "softshrink": (nn.Softshrink, lambda ctx: {}),
    "softsign": (nn.Softsign, lambda ctx: {}),
    "tanh": (nn.Tanh, lambda ctx: {}),
    "tanhshrink": (nn.Tanhshrink, lambda ctx: {}),
}.items()})

RELU_FORMS = ("relu", "linked_relu")  # what a swapped model's activation is: the one notion of "already ReLU"


def linked(base: ActivationSpec) -> ActivationSpec:
    return ActivationSpec(build=lambda ctx: Linked(base.build(ctx)), module=base.module, expansion=2 * base.expansion,
                          swap_to="linked_relu" if base.swap_to else None)


# Linked neurons for every activation above: linked_<name> = (g(z), g(−z)); linked_relu is CReLU.
ACTIVATIONS.update({f"linked_{name}": linked(spec) for name, spec in list(ACTIVATIONS.items())})

_from_families: dict[str, list[str]] = {}  # gate family -> the registry names its registration added


def _family_changed(name: str, fam: gates.GateFamily | None) -> None:
    """A registered gate family (`pipeline.gates.register`) gets its hardenable activation, `fam.hardenable`, and the
    linked pair where the registry has none: x·g(λx) as `lambda_gate` computes it, its autograd expression in
    training (`GateFamily.kernel` says whether a fused kernel serves it). An unregistered family loses them."""
    for act in _from_families.pop(name, []):
        ACTIVATIONS.pop(act, None)
        globals().pop(f"Lambda_{name}", None)
    if fam is not None and fam.hardenable is not None and fam.hardenable not in ACTIVATIONS:
        cls = type(f"Lambda_{fam.name}", (HardenableGate,), {
            "__module__": __name__, "__doc__": f"x·g(λx) of the gate family {fam.name!r} ({fam.label}).", "GATE": fam.name,
            "expression": staticmethod(functools.partial(_family_expression, gate=fam.name))})
        globals()[cls.__name__] = cls  # found by name (pickle) in this process
        spec = gate_spec(cls)
        ACTIVATIONS[fam.hardenable], ACTIVATIONS[f"linked_{fam.hardenable}"] = spec, linked(spec)
        _from_families[name] = [fam.hardenable, f"linked_{fam.hardenable}"]
    activation_types.cache_clear()


def _family_expression(x: torch.Tensor, lam: torch.Tensor, gate: str) -> torch.Tensor:
    return lambda_gate(x, lam, gate)


def check_names(variants: list[str]) -> None:
    for v in variants:
        check_choice("variants", v, ACTIVATIONS)


def swapped_activation(name: str) -> str | None:
    """Registry name of the model's activation after the swap stage; None when the swap does not apply."""
    return name if name in RELU_FORMS else ACTIVATIONS[name].swap_to


def build_activation(name: str, ctx: GateContext) -> nn.Module:
    return ACTIVATIONS[name].build(ctx)


# ---------------------------------------------------------------------------------------------
# Walking a model: which modules are gates, and where the activation sites are

def gate_of(m: nn.Module) -> tuple[str, torch.Tensor] | None:
    """(gate family, λ as a flat float64 tensor) when `m` is a gate the swap turns into ReLU, else None.

    A gate is a module whose class declares its family in `GATE` (the project's gates, or a user's module
    computing x·g(λx) with its λ in `.lam`, λ = 1 without one), or a torch module a family names as its own at
    λ = 1 (`GateFamily.modules`: nn.GELU in its exact erf form, nn.SiLU, nn.Mish)."""
    fam = getattr(type(m), "GATE", None)
    if fam is not None:
        if fam not in GATES:
            raise ValueError(f"{type(m).__name__}.GATE = {fam!r} names no gate family; known: {', '.join(GATES)}")
        lam = getattr(m, "lam", None)
        return fam, (torch.ones(1, dtype=torch.float64) if lam is None
                     else torch.as_tensor(lam).detach().to(torch.float64).reshape(-1).cpu())
    fam = gates.of_module(type(m))
    if fam is not None and getattr(m, "approximate", "none") == "none":
        return fam, torch.ones(1, dtype=torch.float64)
    return None


# torch modules from nn.modules.activation that are no pointwise activation (attention, normalizations).
NOT_ACTIVATIONS = (nn.Softmax, nn.Softmin, nn.LogSoftmax, nn.Softmax2d, nn.MultiheadAttention, nn.Identity)
# A user's leaf module whose class name says "activation": reported when nothing else knows it.
ACTIVATION_NAME = re.compile(r"gelu|silu|swish|mish|relu|elu\b|sigmoid|tanh|softplus|activation", re.IGNORECASE)


def is_activation(m: nn.Module) -> bool:
    """An activation module: a class the registry or a gate family knows, one of torch's activation modules, or a
    leaf whose class name says so (timm's HardSigmoid); never a Softmax, an attention or an Identity."""
    if isinstance(m, NOT_ACTIVATIONS):
        return False
    return (isinstance(m, activation_types()) or type(m).__module__ == "torch.nn.modules.activation"
            or (next(m.children(), None) is None and bool(ACTIVATION_NAME.search(type(m).__name__))))


@functools.lru_cache(maxsize=1)
def activation_types() -> tuple[type[nn.Module], ...]:
    """Module classes that are activations: every class the registry builds, the gate families' torch modules, ReLU.
    Cached; a change to the registry or to the families clears it."""
    native = {cls for fam in GATES.values() for cls in fam.modules}
    return tuple({spec.module for spec in ACTIVATIONS.values()} | native | {nn.ReLU, Linked})


def activation_sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every activation site in forward order: the outermost activation modules, so a
    linked pair (g(z), g(−z)) is one site with 2C units and its inner g is not a site."""
    types = activation_types()
    sites: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if isinstance(m, types) and not any(name.startswith(n + ".") for n, _ in sites):
            sites.append((name, m))
    return sites


def gate_sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every gate (`gate_of` is not None), in forward order; the inner g of a linked pair
    is one (its forward hooks see both z and −z)."""
    return [(n, m) for n, m in model.named_modules() if gate_of(m) is not None]


def hardenable_gates(model: nn.Module) -> list[HardenableGate]:
    return [m for m in model.modules() if isinstance(m, HardenableGate)]


def hardness_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The distinct s parameters (a global s is shared by every gate, listed once)."""
    seen: dict[int, nn.Parameter] = {}
    for g in hardenable_gates(model):
        seen.setdefault(id(g.s), g.s)
    return list(seen.values())


gates.on_change(_family_changed)  # last: it needs the registry and `activation_types`
