"""Sums, products and quotients of tensors: |a·Δb + b·Δa + Δa·Δb| for a product of two deviating tensors (per sample
only), |c|·d with a constant, one rounding per float32 operation."""

from __future__ import annotations

from ..core import SAFETY, U32, _Call, _Dev, _NoRule


def _add(c: _Call, alpha_pos: int = 2):
    a, b = c.args[0], c.args[1]
    alpha = c.kwargs.get("alpha", c.args[alpha_pos] if len(c.args) > alpha_pos else 1)
    box = c.box(a) + abs(alpha) * c.box(b)
    if c.ch.rounding:  # one rounding of the sum; Python-number operands and alpha add their own
        box = box + SAFETY * 2 * U32 * (c.mag(a) + abs(alpha) * c.mag(b))
    return box


def _mul(c: _Call):
    a, b = c.args[0], c.args[1]
    if isinstance(a, _Dev) and isinstance(b, _Dev):
        if not c.ch.sample:
            raise _NoRule("a product of two tensors that both differ between the networks has no global bound")
        da, db = c.box(a), c.box(b)
        box = a.value.abs() * db + b.value.abs() * da + da * db
    else:
        x, k = (a, b) if isinstance(a, _Dev) else (b, a)
        box = c.mag(k) * c.box(x)
    if c.ch.rounding:
        box = box + SAFETY * 2 * U32 * c.mag(a) * c.mag(b)
    return box


def _div(c: _Call):
    a, b = c.args[0], c.args[1]
    if isinstance(b, _Dev) or c.name in ("__rtruediv__", "__rdiv__"):
        raise _NoRule("division by a tensor that differs between the networks")
    if c.kwargs.get("rounding_mode") is not None:
        raise _NoRule("rounded division is not continuous")
    box = c.box(a) / c.mag(b)
    if c.ch.rounding:
        box = box + SAFETY * 2 * U32 * c.mag(a) / c.mag(b)
    return box
