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


def _mha(walk, func, args: tuple, kwargs: dict, out):
    """F.multi_head_attention_forward (what nn.MultiheadAttention calls) as the ops it runs, each dispatched to its own
    rule: the packed in-projection (`linear`), the heads' reshapes, `scaled_dot_product_attention` and the out-projection.
    That is its own code path when need_weights=False; with need_weights=True torch computes q·scale, bmm, softmax and bmm
    instead, whose float32 rounding `_sdpa`'s terms also cover (the scale's product is one of its γ_{E+2} terms). The
    averaged attention weights, when asked for, get no bound (∞). Masks, bias_k/v, zero attention, separate projection
    weights and dropout in training are refused. The decomposition is checked against torch's own output."""
    import inspect

    import torch.nn.functional as F

    from ..core import Refused, _Dev

    names = list(inspect.signature(func).parameters)
    p = dict(zip(names, args))
    p.update(kwargs)
    get = lambda n, d=None: p.get(n, d)  # noqa: E731
    if (get("key_padding_mask") is not None or get("attn_mask") is not None or get("bias_k") is not None
            or get("bias_v") is not None or get("add_zero_attn") or get("use_separate_proj_weight")
            or get("static_k") is not None or get("static_v") is not None or get("is_causal")
            or (get("training") and get("dropout_p", 0.0) > 0)):
        raise Refused("multi_head_attention_forward with a mask, bias_k/v, zero attention, separate projection weights, "
                      "a causal hint or dropout in training: no rule")
    query, key, value = get("query"), get("key"), get("value")
    H = int(get("num_heads"))
    batched = query.dim() == 3
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    L, N, E = query.shape
    S = key.shape[0]
    hd = E // H
    q, k, v = F._in_projection_packed(query, key, value, get("in_proj_weight"), get("in_proj_bias"))
    q = q.view(L, N * H, hd).transpose(0, 1).view(N, H, L, hd)
    k = k.view(S, N * H, hd).transpose(0, 1).view(N, H, S, hd)
    v = v.view(S, N * H, hd).transpose(0, 1).view(N, H, S, hd)
    attn = F.scaled_dot_product_attention(q, k, v, None, 0.0, False)
    attn = attn.permute(2, 0, 1, 3).reshape(N * L, E)
    y = F.linear(attn, get("out_proj_weight"), get("out_proj_bias")).view(L, N, E)
    if not batched:
        y = y.squeeze(1)
    ref = out[0]
    if not isinstance(y, _Dev) or not torch.allclose(y.value.to(torch.float64), ref.to(torch.float64), rtol=1e-6,
                                                      atol=1e-6 * (1 + float(ref.abs().max()))):
        raise Refused("multi_head_attention_forward's decomposition does not reproduce its output here")
    y = walk.wrap(ref, list(y.boxes))  # torch's own value, the decomposition's boxes
    weights = out[1]
    if weights is not None:
        weights = walk.wrap(weights, [torch.full(weights.shape, math.inf, dtype=torch.float64) for _ in walk.channels])
    return type(out)((y, weights))
