"""Linear and convolution layers, and addmm (what Hugging Face's GPT-2 `Conv1D` computes: bias + x·W): |W(v − z)| ≤
|W|·d; float32 dot products of length n plus a bias (n + 1 terms) within `pipeline.numerics.dot_error` in any
summation order."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..core import _Call, _Dev, _NoRule, dot_error


def _weights(c: _Call, w: Any, b: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(w, _Dev) or isinstance(b, _Dev):
        raise _NoRule(f"`{c.name}` with weights computed from the input")
    return w.detach().abs().to(torch.float64), None if b is None else b.detach().abs().to(torch.float64)


def _linear(c: _Call):
    p = c.bind(("input", "weight", "bias"), {"bias": None})
    w, b = _weights(c, p["weight"], p["bias"])
    box = F.linear(c.box(p["input"]), w)
    if c.ch.rounding:
        local = F.linear(c.mag(p["input"]), w) + (0 if b is None else b)
        box = box + dot_error(w.shape[-1] + 1, local)  # the products and the bias
    return box


def _conv(c: _Call):
    p = c.bind(("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
               {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1})
    w, b = _weights(c, p["weight"], p["bias"])
    conv = lambda t: c.func(t, w, None, p["stride"], p["padding"], p["dilation"], p["groups"])
    box = conv(c.box(p["input"]))
    if c.ch.rounding:
        local = conv(c.mag(p["input"])) + (0 if b is None else b.view(1, -1, *([1] * (w.dim() - 2))))
        box = box + dot_error(w[0].numel() + 1, local)
    return box


def _addmm(c: _Call):
    """β·input + α·(mat1 @ mat2): a product with one constant factor is linear in the other; two deviating factors are
    bounded per sample only (|A|·dB + dA·|B| + dA·dB, as `arithmetic._mul`)."""
    p = c.bind(("input", "mat1", "mat2"), {"beta": 1, "alpha": 1})
    a, b = p["mat1"], p["mat2"]
    alpha, beta = abs(float(p["alpha"])), abs(float(p["beta"]))
    mm = torch.bmm if c.value(a).dim() == 3 else torch.mm
    va, vb = c.value(a).detach().abs().to(torch.float64), c.value(b).detach().abs().to(torch.float64)
    da, db = c.box(a), c.box(b)
    if isinstance(a, _Dev) and isinstance(b, _Dev) and not c.ch.sample:
        raise _NoRule("`addmm` of two tensors that both differ between the networks has no global bound")
    box = beta * c.box(p["input"]) + alpha * (mm(da, vb) + mm(va, db) + mm(da, db))
    if c.ch.rounding:
        local = alpha * mm(c.mag(a), c.mag(b)) + beta * c.mag(p["input"])
        box = box + dot_error(c.value(a).shape[-1] + 1, local)
    return box
