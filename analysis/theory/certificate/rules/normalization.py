"""BatchNorm in eval mode (a per-channel affine map) and LayerNorm (per sample through σ, globally through
1/√eps), with the rounding of their sums."""

from __future__ import annotations

import math

import torch

from ..core import SAFETY, U32, _Call, _NoRule, gamma
from .affine import _weights


def _batch_norm(c: _Call):
    p = c.bind(("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
               {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5})
    if p["training"] or p["running_var"] is None:
        raise _NoRule("BatchNorm in training mode (batch statistics couple the samples)")
    x, rv = p["input"], p["running_var"].detach().to(torch.float64)
    w = torch.ones_like(rv) if p["weight"] is None else p["weight"].detach().to(torch.float64)
    scale = w / torch.sqrt(rv + p["eps"])
    shape = (1, -1, *([1] * (c.value(x).dim() - 2)))
    box = c.box(x) * scale.abs().view(shape)
    if c.ch.rounding:  # α = γ/√(var + eps) and β = b − μ·α (≤ 3 roundings each), then x·α + β (2)
        b = torch.zeros_like(rv) if p["bias"] is None else p["bias"].detach().to(torch.float64)
        mu = p["running_mean"].detach().to(torch.float64)
        local = c.mag(x) * scale.abs().view(shape) + ((mu * scale).abs() + b.abs()).view(shape)
        box = box + SAFETY * 8 * U32 * local
    return box


def _layer_norm_rounding(M: torch.Tensor, C: torch.Tensor, s_lo: torch.Tensor, s_hi: torch.Tensor, D: int, dims: tuple,
                         w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """float32 LayerNorm of an input with |x| ≤ M, |x − mean x| ≤ C, σ(x) ∈ [s_lo, s_hi]: mean (γ_{D+1}),
    centering (one more u), variance (γ of its D-term sum, and the centering errors squared), √ and the
    normalisation (≤ 3u), γ·x̂ + β (2u)."""
    mean = lambda t: t.mean(dim=dims, keepdim=True)
    e_c = gamma(D + 2) * (M + mean(M))  # |ĉ − c|
    e_sq = mean(e_c * (2 * C + e_c))  # |mean(ĉ²) − mean(c²)|
    e_v = e_sq + gamma(D + 2) * (s_hi**2 + e_sq)
    s_hat = torch.sqrt(torch.clamp(s_lo**2 - e_v, min=eps)) * (1 - 2 * U32)  # σ̂ ≥ s_hat
    e_s = e_v / (s_lo + s_hat) + 2 * U32 * (s_hi + e_v / (s_lo + s_hat))  # |σ̂ − σ|
    norm = e_c / s_hat + C * e_s / (s_lo * s_hat) + 3 * U32 * (C + e_c) / s_hat
    return SAFETY * (w * norm + 2 * U32 * (w * (C + e_c) / s_hat + b))


def _layer_norm(c: _Call):
    p = c.bind(("input", "normalized_shape", "weight", "bias", "eps"), {"weight": None, "bias": None, "eps": 1e-5})
    x, eps = p["input"], float(p["eps"])
    dims = tuple(range(-len(p["normalized_shape"]), 0))
    D = math.prod(p["normalized_shape"])
    mean = lambda t: t.mean(dim=dims, keepdim=True)
    w, b = _weights(c, torch.ones(()) if p["weight"] is None else p["weight"], torch.zeros(()) if p["bias"] is None else p["bias"])
    d = c.box(x)
    if c.ch.sample:
        z = c.value(x).to(torch.float64)
        cz = z - mean(z)
        sigma = torch.sqrt(mean(cz**2) + eps)
        r = torch.sqrt(mean(d**2))
        s_lo = torch.clamp(sigma - r, min=math.sqrt(eps))
        box = w * ((d + mean(d)) / s_lo + cz.abs() * r / (sigma * s_lo))
        C, s_hi = cz.abs() + d + mean(d), sigma + r
    else:
        box = w * torch.sqrt((d**2).sum(dim=dims, keepdim=True)) / math.sqrt(eps)
        M = c.mag(x) if c.ch.rounding else None
        s_lo = torch.full_like(mean(d), math.sqrt(eps))
        C = None if M is None else M + mean(M)
        s_hi = None if M is None else torch.sqrt(mean(M**2) + eps)
    if c.ch.rounding:
        box = box + _layer_norm_rounding(c.mag(x), C, s_lo, s_hi, D, dims, w, b if b is not None else 0, eps)
    return box
