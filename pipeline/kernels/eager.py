"""Native ATen kernels, in-place wherever a temporary is ours: the fallback that always works."""

from __future__ import annotations

import torch

from .common import INV_SQRT_2PI, PDF_CLAMP, Phi, sum_to


def forward(x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """x·Φ(λx) with `pipeline.gates.Phi` (from erfc: relative accuracy in the left tail, where GELU's 1 + erf cancels).
    x is clamped below at −max before the product: at x = −inf, Φ is 0 and the product is −0, not inf·0."""
    return Phi(torch.mul(x, lam)).mul_(x.clamp(min=-torch.finfo(x.dtype).max))


def backward(grad: torch.Tensor, x: torch.Tensor, lam: torch.Tensor, need_x: bool, need_lam: bool):
    # ∂f/∂x = Φ(z) + z·φ(z), ∂f/∂λ = x·z·φ(z)/λ. z is clamped to ±PDF_CLAMP where it multiplies φ (which is 0
    # there in float32 and float64), and x is zeroed where |z| > PDF_CLAMP, so z or x = ±inf give 0, not inf·0.
    z = torch.mul(x, lam)
    zc = z.clamp(-PDF_CLAMP, PDF_CLAMP)
    zpdf = torch.square(zc).mul_(-0.5).exp_().mul_(zc).mul_(INV_SQRT_2PI)  # z·φ(z)
    gx = None
    if need_x:
        gx = Phi(z).add_(zpdf).mul_(grad)
        if gx.shape != x.shape:  # λ broadcast x to a larger shape
            gx = sum_to(gx, x.shape)
    glam = None
    if need_lam:
        xs = torch.where(z.abs() > PDF_CLAMP, 0.0, x)
        glam = sum_to(zpdf.mul_(xs).mul_(grad), lam.shape).div_(lam)
    return gx, glam
