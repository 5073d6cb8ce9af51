"""Scaled dot-product attention, per sample only (softmax has no global Lipschitz bound on unbounded inputs)."""

from __future__ import annotations

import math

import torch

from ..core import SAFETY, ULP_ELEMENTWISE, U32, _Call, _inf_for_nan, _NoRule, gamma


def _sdpa(c: _Call):
    """softmax(q·kᵀ·scale + mask)·v, per sample (module docstring); float32: the scores' dot products,
    the subtraction of the row maximum, exp and the normalising sum (κ), and the p·v sums."""
    if not c.ch.sample:
        raise _NoRule("softmax attention has no global Lipschitz bound (it is not Lipschitz on unbounded inputs); "
                      "only the per-sample certificate covers attention")
    p = c.bind(("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
               {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False})
    if p["attn_mask"] is not None or p["dropout_p"] > 0 or p["enable_gqa"]:
        raise _NoRule("scaled_dot_product_attention with an explicit mask, dropout or grouped heads")
    q, k, v = (c.value(p[n]).to(torch.float64) for n in ("query", "key", "value"))
    dq, dk, dv = (c.box(p[n]) for n in ("query", "key", "value"))
    E, Lq, Lk = q.shape[-1], q.shape[-2], k.shape[-2]
    scale = p["scale"] if p["scale"] is not None else 1.0 / math.sqrt(E)
    allowed = torch.ones(Lq, Lk, dtype=torch.bool).tril() if p["is_causal"] else torch.ones(Lq, Lk, dtype=torch.bool)
    s = (q @ k.transpose(-2, -1)) * scale
    P = torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1)
    ref = P @ v
    if not torch.allclose(ref, c.out.to(torch.float64), rtol=1e-9, atol=1e-12 * (1 + float(v.abs().max()))):
        raise _NoRule("scaled_dot_product_attention's output is not softmax(q·kᵀ·scale)·v here")
    e = scale * (q.abs() @ dk.transpose(-2, -1) + dq @ k.abs().transpose(-2, -1) + dq @ dk.transpose(-2, -1))
    kappa = 0.0
    if c.ch.rounding:
        Mq, Mk = c.mag(p["query"]), c.mag(p["key"])
        e = e + SAFETY * gamma(E + 2) * scale * (Mq @ Mk.transpose(-2, -1))
        top = (s.abs() + e).masked_fill(~allowed, 0).amax(dim=-1, keepdim=True)
        e = e + SAFETY * 2 * U32 * (s.abs() + e + top)  # s − max s, rounded, is exp's argument
        kappa = SAFETY * (gamma(Lk + 1) + (ULP_ELEMENTWISE + 4) * U32)  # exp, the sum, the division, online rescaling
    e = e.masked_fill(~allowed, 0)
    grow = torch.exp(e + e.amax(dim=-1, keepdim=True))
    dP = torch.where(allowed, _inf_for_nan(P * (grow * (1 + kappa) - 1)), torch.zeros_like(P))
    box = dP @ v.abs() + (P + dP) @ dv
    if c.ch.rounding:
        box = box + SAFETY * gamma(Lk + 1) * ((P + dP) @ c.mag(p["value"]))
    return box
