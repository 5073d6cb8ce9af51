"""Constants and layout helpers shared by every kernel backend.

Gradients (z = λx): ∂f/∂x = Φ(z) + z·φ(z), ∂f/∂λ = x²·φ(z) = x·(z·φ(z))/λ. The last form never multiplies
an overflowing x² by an underflowing φ; z is clamped to ±PDF_CLAMP where it multiplies φ, which is exactly
0 there in float32, so z = ±inf gives 0 instead of inf·0.
"""

from __future__ import annotations

import math

import torch

from ..gates import INV_SQRT2, INV_SQRT_2PI, Phi  # noqa: F401  (Φ and its constants have one home)

ENV_KERNEL = "LAMBDA_GELU_KERNEL"  # the environment variable that picks the default kernel (see pipeline.kernels)
PDF_CLAMP = 40.0  # |z| beyond which the float32 normal pdf is exactly 0


def layout(x: torch.Tensor, lam: torch.Tensor) -> tuple[int, int] | None:
    """(C, inner) when λ is a scalar or varies along exactly one dim of x, viewing x as [outer, C, inner];
    None otherwise (eager handles it)."""
    if x.numel() == 0 or lam.dim() > x.dim():
        return None
    if lam.numel() == 1:
        return 1, x.numel()
    shape = (1,) * (x.dim() - lam.dim()) + tuple(lam.shape)
    dims = [d for d, n in enumerate(shape) if n != 1]
    if len(dims) != 1 or shape[dims[0]] != x.shape[dims[0]]:
        return None
    d = dims[0]
    return x.shape[d], math.prod(x.shape[d + 1:])


def sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce a broadcast gradient back to `shape` (the λ tensor's shape)."""
    if t.shape == shape:
        return t
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead > 0 else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t
