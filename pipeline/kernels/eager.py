"""Native ATen kernels, in-place wherever a temporary is ours: the fallback that always works."""

from __future__ import annotations

import torch

from .common import INV_SQRT_2PI, PDF_CLAMP, sum_to


def forward(x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    y = torch.mul(x, lam)
    torch._C._nn.gelu_(y)  # GELU(λx)/λ reuses the native (oneDNN) GELU
    return y.div_(lam)


def backward(grad: torch.Tensor, x: torch.Tensor, lam: torch.Tensor, need_x: bool, need_lam: bool):
    # Clamping z to ±40 changes neither GELU'(z) nor z·φ(z) (both saturate there, in float32 and float64) but
    # keeps z = ±inf finite.
    zc = torch.mul(x, lam).clamp_(-PDF_CLAMP, PDF_CLAMP)
    # d/dx[GELU(λx)/λ] = GELU'(λx): one native kernel.
    gx = torch.ops.aten.gelu_backward(grad, zc) if need_x else None
    if gx is not None and gx.shape != x.shape:  # λ broadcast x to a larger shape
        gx = sum_to(gx, x.shape)
    glam = None
    if need_lam:
        t = torch.square(zc).mul_(-0.5).exp_().mul_(zc)  # z·e^{−z²/2}
        t.mul_(x).mul_(grad)
        glam = sum_to(t, lam.shape).mul(INV_SQRT_2PI).div_(lam)
    return gx, glam
