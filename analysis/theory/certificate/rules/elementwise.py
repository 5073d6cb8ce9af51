"""Elementwise powers and square roots (RMSNorm's x·rsqrt(mean(x²) + eps)), per sample only: none is Lipschitz on
unbounded inputs. |v^k − z^k| ≤ (|z| + d)^k − |z|^k (the binomial expansion of (z + e)^k − z^k, term by term); √ and
1/√ are monotone, so the interval image [z − d, z + d] bounds them, and an interval reaching 0 or below is ∞.
float32: k − 1 products (γ_k) or one library call (`ULP_ELEMENTWISE`) at the largest value on the interval."""

from __future__ import annotations

import math

import torch

from ..core import SAFETY, ULP_ELEMENTWISE, U32, _Call, _Dev, _NoRule, gamma

POWERS = ("pow", "__pow__", "square")
ROOTS = ("sqrt", "rsqrt")


def _per_sample(c: _Call) -> None:
    if not c.ch.sample:
        raise _NoRule(f"`{c.name}` is not Lipschitz on unbounded inputs, so it has no global bound; only the "
                      "per-sample certificate covers it")


def _pow(c: _Call):
    x = c.args[0]
    k = 2 if c.name == "square" else c.kwargs.get("exponent", c.args[1] if len(c.args) > 1 else None)
    if isinstance(k, (_Dev, torch.Tensor)) or not isinstance(x, _Dev):
        raise _NoRule(f"`{c.name}` with an exponent that is a tensor")
    if float(k) != int(k) or int(k) < 1:
        raise _NoRule(f"`{c.name}` with the exponent {k}: only positive integer powers have a rule")
    k = int(k)
    if k > 1:
        _per_sample(c)
    z, d = c.value(x).abs().to(torch.float64), c.box(x)
    box = (z + d) ** k - z ** k
    if c.ch.rounding:
        box = box + SAFETY * (gamma(k) + ULP_ELEMENTWISE * U32) * c.mag(x) ** k
    return box


def _root(c: _Call):
    _per_sample(c)
    x = c.args[0]
    z, d = c.value(x).to(torch.float64), c.box(x)
    f = torch.sqrt if c.name == "sqrt" else torch.rsqrt
    lo, hi = z - d, z + d
    y = f(z)
    box = torch.maximum((f(hi) - y).abs(), (f(lo.clamp_min(0)) - y).abs())
    # the other network's value may be ≤ 0: √ of it is NaN, 1/√ of 0 is ∞
    box = torch.where((lo < 0) | ((lo <= 0) & (c.name == "rsqrt")) | (z < 0), torch.full_like(box, math.inf), box)
    if c.ch.rounding:
        top = f(hi) if c.name == "sqrt" else f(lo)  # the largest |f| on the interval
        box = box + SAFETY * ULP_ELEMENTWISE * U32 * top.nan_to_num(nan=math.inf)
    return box
