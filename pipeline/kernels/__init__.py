"""λ-GELU kernels: x·Φ(λx) forward and backward, each in one pass over memory, saving only x and λ.

One registry of backends (`KERNELS`) and one process-wide choice (`use_kernel` sets it for a block and
restores it; the LAMBDA_GELU_KERNEL environment variable sets the default):

  cpp       our fused CPU kernel (`lambda_gelu.cpp`, float32/float64; `cpu.py` builds and loads it)
  triton    fused Triton kernels for CUDA (`triton_gate.py`, fp32/bf16/fp16 with fp32 math): λ from s inside
            the kernel, ∂s reduced inside it, one autograd node per layer; also serves λ-Swish (g = σ)
  inductor  `torch.compile`d forward/backward bodies (`inductor.py`)
  eager     native ATen ops (`eager.py`), Φ from erfc
  auto      cpp on CPU, triton on CUDA (inductor without Triton), eager for everything else (default)

Per gate family (`GateFamily.kernel` in `pipeline.gates` names the kernels' id for it): λ-GELU (Φ) has every
backend; λ-Swish (σ) has triton on CUDA and an autograd expression elsewhere (no fused CPU kernel: it is not the
paper's gate and the eager form is two ops); λ-SERF and any family without a kernel id keep their autograd
expression everywhere. `pipeline.activations` chooses.

A kernel that cannot be built or compiled is recorded with its reason (`status()`), warned about once, and
the call falls back to eager: training never fails for want of a compiler. `pipeline.activations` calls
`apply` / `apply_s` here on the training path only; exports and no-grad evaluation use plain expressions.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Iterator

import torch
from torch.autograd.function import once_differentiable

from ..gates import family
from . import cpu, eager, inductor
from .common import ENV_KERNEL, layout

KERNELS = {
    "auto": "cpp on CPU, triton on CUDA (inductor without Triton), eager otherwise",
    "cpp": "fused CPU kernel (lambda_gelu.cpp), float32/float64, autograd in C++",
    "triton": "fused Triton kernels (triton_gate.py), CUDA, fp32/bf16/fp16",
    "inductor": "torch.compile'd forward and backward bodies",
    "eager": "native ATen ops",
}


def _env_kernel() -> str:
    name = os.environ.get(ENV_KERNEL, "auto").strip().lower() or "auto"
    if name not in KERNELS:
        warnings.warn(f"{ENV_KERNEL}={name!r} is not one of {', '.join(KERNELS)}; using auto", stacklevel=2)
        return "auto"
    return name


_kernel = _env_kernel()


def get_kernel() -> str:
    return _kernel


def set_kernel(name: str) -> None:
    """Process-wide kernel choice; prefer `use_kernel`, which restores the previous one."""
    global _kernel
    if name not in KERNELS:
        raise ValueError(f"λ-GELU kernel {name!r} is unknown; choose one of {', '.join(KERNELS)}")
    _kernel = name


@contextlib.contextmanager
def use_kernel(name: str) -> Iterator[None]:
    previous = _kernel
    set_kernel(name)
    try:
        yield
    finally:
        set_kernel(previous)


_triton: Any = None  # the module, imported on the first CUDA call: Triton fixes its mode at import
_triton_ready: bool | None = None


def triton_module():
    """pipeline.kernels.triton_gate, or None when Triton cannot be imported (recorded in `status()`)."""
    global _triton, _triton_ready
    if _triton_ready is None:
        from . import triton_gate

        _triton, _triton_ready = triton_gate, triton_gate.available()
    return _triton if _triton_ready else None


def channel_dim(x: torch.Tensor, lam: torch.Tensor) -> int:
    """The dim of x that a broadcast-shaped λ (or s) varies along (1 when it is one value)."""
    if lam.numel() == 1:
        return 1
    shape = (1,) * (x.dim() - lam.dim()) + tuple(lam.shape)
    return next(d for d, n in enumerate(shape) if n != 1)


def _triton_ok(x: torch.Tensor, lam: torch.Tensor) -> bool:
    tg = triton_module() if x.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1" else None
    return tg is not None and tg.supports(x, lam.reshape(-1), channel_dim(x, lam))


def backend_for(x: torch.Tensor, lam: torch.Tensor) -> tuple[str, tuple[int, int] | None]:
    """The kernel that will run for these tensors now, and its layout."""
    mode = _kernel
    if mode == "eager":
        return "eager", None
    lay = layout(x, lam)
    if lay is None:
        return "eager", None
    cpp_ok = cpu.supports(x, lam)
    if mode == "cpp" or (mode == "auto" and cpp_ok):
        if cpp_ok and cpu.build():
            return "cpp", lay
        return "eager", None
    if mode == "triton" or (mode == "auto" and x.device.type == "cuda"):
        if _triton_ok(x, lam):
            return "triton", lay
        if mode == "triton":
            return "eager", None
    if mode == "inductor" or (mode == "auto" and x.device.type == "cuda"):
        return ("inductor", lay) if inductor.status.ready is not False else ("eager", None)
    return "eager", None


def forward(x: torch.Tensor, lam: torch.Tensor, backend: tuple[str, Any]) -> torch.Tensor:
    name, lay = backend
    if name == "cpp":
        return cpu.forward(x, lam, lay)
    if name == "inductor":
        out = inductor.forward(x, lam)
        if out is not None:
            return out
    return eager.forward(x, lam)


def backward(grad, x, lam, backend: tuple[str, Any], need_x: bool, need_lam: bool):
    name, lay = backend
    if name == "cpp":
        return cpu.backward(grad, x, lam, lay, need_x, need_lam)
    if name == "inductor":
        out = inductor.backward(grad, x, lam, need_lam)
        if out is not None:
            return (out[0] if need_x else None), out[1]
    return eager.backward(grad, x, lam, need_x, need_lam)


class LambdaGELUFunction(torch.autograd.Function):
    """x·Φ(λx) through the chosen backend, one pass each way; saves only x and λ for backward, as GELU
    saves x. (The cpp backend skips this class: its autograd is registered in C++.)"""

    @staticmethod
    def forward(ctx, x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:  # lam broadcasts to x
        ctx.backend = backend_for(x, lam)
        ctx.save_for_backward(x, lam)
        return forward(x, lam, ctx.backend)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, lam = ctx.saved_tensors
        return backward(grad, x, lam, ctx.backend, *ctx.needs_input_grad[:2])


def apply(x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """λ-GELU with autograd through the current kernel choice (λ broadcasts to x)."""
    name, lay = backend_for(x, lam)
    if name == "cpp":
        return cpu.fused(x, lam, lay)
    if name == "triton" and not lam.requires_grad:  # a frozen λ (the harden stage)
        return _triton.gate_frozen(x, lam.reshape(-1), "phi", channel_dim(x, lam))
    return LambdaGELUFunction.apply(x, lam)


def apply_s(x: torch.Tensor, s: torch.Tensor, t: float, gate: str = "phi") -> torch.Tensor | None:
    """x·g(λx) with λ = 1 + softplus(s/t) computed inside the op (s shaped to broadcast like λ), so the
    gradient flows to s directly; None when no backend for these tensors and this gate does that (the
    caller then computes λ and uses its expression)."""
    kernel = family(gate).kernel  # which fused kernels serve the family (None: none)
    if kernel == "phi" and x.device.type == "cpu":  # the CPU kernel computes Φ only, and takes s in x's dtype
        name, lay = backend_for(x, s.to(x.dtype))
        return cpu.fused_s(x, s.to(x.dtype), t, lay) if name == "cpp" else None
    if kernel is not None and backend_for(x, s)[0] == "triton":
        return _triton.gate_s(x, s.reshape(-1), t, kernel, channel_dim(x, s))
    return None


def apply_frozen(x: torch.Tensor, lam: torch.Tensor, gate: str) -> torch.Tensor | None:
    """x·g(λx) for a frozen λ buffer: Φ through `apply` (every backend), σ through the Triton kernel where it
    runs; None otherwise (the caller uses the gate's expression)."""
    kernel = family(gate).kernel
    if kernel == "phi":
        return apply(x, lam.to(x.dtype) if x.device.type == "cpu" else lam)
    if kernel is not None and backend_for(x, lam)[0] == "triton":
        return _triton.gate_frozen(x, lam.reshape(-1), kernel, channel_dim(x, lam))
    return None


def gate_cuda(x: torch.Tensor, p: torch.Tensor, t: float, gate: str, frozen: bool, axis: int) -> torch.Tensor | None:
    """The training path of a gate module on CUDA, kept lean (it runs once per layer and step): the Triton kernel
    for s (learned) or λ (`frozen`), a flat [1] or [C] tensor varying along x's dim `axis`; None when the kernel
    choice, Triton or these tensors rule it out (the caller falls back). What the tensors allow is decided once
    per layout, in the kernel's launch plan."""
    if _kernel not in ("auto", "triton"):
        return None
    tg = _triton if _triton_ready else triton_module()
    kid = tg.GATES.get(family(gate).kernel) if tg is not None else None  # the family's kernel id (None: none)
    if kid is None:
        return None
    return tg.try_gate_frozen(x, p, kid, axis) if frozen else tg.try_gate_s(x, p, t, kid, axis)


def gate_compiled(x: torch.Tensor, p: torch.Tensor, t: float, gate: str, frozen: bool, axis: int) -> torch.Tensor | None:
    """The gate inside `torch.compile` on CUDA: `torch.ops.lambda_gates.gate` (`gate_op.py`), which the compiler traces
    into; None when Triton or the kernel choice rules it out, or the gate family has no kernel (its expression serves)."""
    if _kernel not in ("auto", "triton") or triton_module() is None:
        return None
    kid = _triton.GATES.get(family(gate).kernel)
    if kid is None or x.dtype not in _triton.SUPPORTED_DTYPES:
        return None
    from . import gate_op  # registers the ops on first use

    return torch.ops.lambda_gates.gate(x, p.reshape(-1), float(t), kid, axis, not frozen)


def status() -> dict[str, Any]:
    """The kernel choice and what each backend did in this process (record it next to timings)."""
    triton = ({"ready": _triton.available(), "error": _triton.unavailable_reason(), "interpreted": _triton.interpreted(),
               "launcher": dict(_triton._LAUNCHER)}
              if _triton is not None else {"ready": None, "error": None})
    return {"kernel": _kernel, "cpp": cpu.status.as_dict(), "triton": triton, "inductor": inductor.status.as_dict(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}
