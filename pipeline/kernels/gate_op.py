"""The λ-gates as torch.library ops, so that `torch.compile` sees them: `lambda_gates::gate` and its backward
`lambda_gates::gate_backward`, each a `torch.library.triton_op` whose CUDA body launches the Triton kernels of
`triton_gate.py` through `torch.library.wrap_triton` (inductor traces into them and keeps them inside its graphs and
CUDA graphs: `train.compile=true train.compile_mode=reduce-overhead`); on any other device the same ops compute the
gate's expression and its analytic gradients (`GateFamily.g` and `Relaxation.dF`), so the registration works, and is
tested, on the CPU.

    y = torch.ops.lambda_gates.gate(x, p, t, kernel_id, channel_dim, from_s)   # p = s (from_s) or a frozen λ

Inside an op nothing persists between calls (a compiled graph may replay it at any time), so the backward allocates its
partials and zeroed counters per call, where the eager path keeps them in its launch plan.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import gates
from . import triton_gate as tg

NAMESPACE = "lambda_gates"
KERNEL_FAMILY = {v: k for k, v in tg.GATES.items()}  # kernel id -> family name


def _layout(x: torch.Tensor, p: torch.Tensor, channel_dim: int) -> tg.Layout:
    lay = tg._layout(x, p, channel_dim)
    if isinstance(lay, str):
        raise ValueError(f"lambda_gates: {lay}")
    C, outer, inner, permuted = lay
    return tg.Layout(x.numel(), C, outer, inner, permuted)


def _lam(p: torch.Tensor, t: float, from_s: bool) -> torch.Tensor:
    return 1.0 + F.softplus(p / t) if from_s else p


def _bcast(v: torch.Tensor, x: torch.Tensor, channel_dim: int) -> torch.Tensor:
    if v.numel() == 1:
        return v.reshape(())
    shape = [1] * x.dim()
    shape[channel_dim % x.dim()] = -1
    return v.reshape(shape)


def _reduce_to(v: torch.Tensor, p: torch.Tensor, channel_dim: int) -> torch.Tensor:
    if p.numel() == 1:
        return v.sum().reshape(p.shape)
    return v.movedim(channel_dim % v.dim(), -1).reshape(-1, p.numel()).sum(0).reshape(p.shape)


if tg.available():
    from torch.library import triton_op, wrap_triton

    @triton_op(f"{NAMESPACE}::gate", mutates_args=())
    def gate(x: torch.Tensor, p: torch.Tensor, t: float, kernel: int, channel_dim: int, from_s: bool) -> torch.Tensor:
        """x·g(λx) with λ = 1 + softplus(p/t) (from_s) or λ = p; p has 1 or C = x.shape[channel_dim] elements."""
        lay = _layout(x, p, channel_dim)
        xv = lay.view(x)
        y = torch.empty_like(xv)
        wrap_triton(tg._gate_fwd)[lay.fwd_grid](
            xv, p, y, lay.M, lay.N, lay.C, lay.TI, t, COL=lay.col, FROM_S=from_s, GATE=kernel,
            PRECISE=x.dtype == torch.float32, FAST=True, BM=lay.bm, BN=lay.bn, num_warps=lay.warps)
        return lay.restore(y, x)

    @triton_op(f"{NAMESPACE}::gate_backward", mutates_args=())
    def gate_backward(grad: torch.Tensor, x: torch.Tensor, p: torch.Tensor, t: float, kernel: int, channel_dim: int,
                      from_s: bool, need_p: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(∂x, ∂p in p's dtype and shape; zeros unless need_p) of `gate`."""
        lay = _layout(x, p, channel_dim)
        xv = lay.view(x)
        gv = (grad.permute(0, 2, 3, 1) if lay.permuted else grad).contiguous()
        gx = torch.empty_like(xv)
        gp = torch.zeros(p.numel(), dtype=torch.float32, device=x.device)
        part = torch.empty(lay.parts, dtype=torch.float32, device=x.device)
        counters = torch.zeros(lay.lanes, dtype=torch.int32, device=x.device)
        wrap_triton(tg._gate_bwd)[lay.bwd_grid](
            gv, xv, p, gx, gp, part, counters, lay.M, lay.N, lay.C, lay.TI, lay.TT, lay.CH, lay.iters, t,
            COL=lay.col, FROM_S=from_s, GATE=kernel, PRECISE=x.dtype == torch.float32, FAST=True, NEED_X=True,
            NEED_P=need_p, BM=lay.bm, BN=lay.bn, PR=lay.pr, num_warps=lay.warps)
        return lay.restore(gx, x), gp.to(p.dtype).reshape(p.shape)

    @gate.register_kernel("cpu")
    def _gate_cpu(x, p, t, kernel, channel_dim, from_s):
        fam = gates.family(KERNEL_FAMILY[kernel])
        lam = _bcast(_lam(p, t, from_s).to(x.dtype), x, channel_dim)
        return fam.f(x, lam)

    @gate_backward.register_kernel("cpu")
    def _gate_backward_cpu(grad, x, p, t, kernel, channel_dim, from_s, need_p):
        # ∂f/∂x = F'(z), ∂f/∂λ = x²·g'(z) = x·(F'(z) − g(z))/λ with z = λx, F(y) = y·g(y)
        fam = gates.family(KERNEL_FAMILY[kernel])
        lam_flat = _lam(p, t, from_s).to(x.dtype)
        lam = _bcast(lam_flat, x, channel_dim)
        z = lam * x
        dF, g = fam.relaxation.dF(z), fam.g(z)
        gx = grad * dF
        gp = torch.zeros_like(p)
        if need_p:
            glam = _reduce_to(grad * x * (dF - g), p, channel_dim) / lam_flat.reshape(p.shape)
            gp = (glam * torch.sigmoid(p / t) / t if from_s else glam).to(p.dtype)
        return gx, gp

    def _setup(ctx, inputs, output):
        x, p, t, kernel, channel_dim, from_s = inputs
        ctx.save_for_backward(x, p)
        ctx.args = (t, kernel, channel_dim, from_s)

    def _backward(ctx, grad):
        x, p = ctx.saved_tensors
        t, kernel, channel_dim, from_s = ctx.args
        need_p = bool(from_s and ctx.needs_input_grad[1])
        gx, gp = torch.ops.lambda_gates.gate_backward(grad, x, p, t, kernel, channel_dim, from_s, need_p)
        return (gx if ctx.needs_input_grad[0] else None), (gp if need_p else None), None, None, None, None

    gate.register_autograd(_backward, setup_context=_setup)


def available() -> bool:
    return tg.available()
