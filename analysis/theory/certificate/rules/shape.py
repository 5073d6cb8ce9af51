"""Ops that copy, rearrange, pad or negate entries: applied to the box, the op is the box (exact in float), and
negation keeps it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core import SAFETY, U32, _Call, _map


def _structural(c: _Call):
    """The op copies, rearranges or broadcasts entries: applied to the box, it is the box (exact in float)."""
    first = c.args[0]
    if isinstance(first, (list, tuple)):  # cat / stack of a sequence
        first = type(first)(c.box(a) for a in first)
    else:
        first = c.box(first)
    return c.func(first, *_map(c.args[1:], c.value), **_map(c.kwargs, c.value))


def _same(c: _Call):
    return c.box(c.args[0])


def _pad(c: _Call):
    p = c.bind(("input", "pad", "mode", "value"), {"mode": "constant", "value": None})
    if p["mode"] == "constant":
        box = F.pad(c.box(p["input"]), p["pad"], "constant", 0.0)
        if c.ch.rounding and p["value"]:  # the pad value as a float32 number
            box = box + F.pad(torch.zeros_like(c.box(p["input"])), p["pad"], "constant", SAFETY * U32 * abs(p["value"]))
        return box
    return F.pad(c.box(p["input"]), p["pad"], p["mode"])  # reflect / replicate / circular: copies of entries




_STRUCTURAL = ("flatten", "view", "reshape", "transpose", "permute", "contiguous", "expand", "expand_as", "unsqueeze",
               "squeeze", "__getitem__", "select", "narrow", "clone", "detach", "unbind", "chunk", "split", "t", "movedim",
               "unflatten", "cat", "concat", "concatenate", "stack", "repeat", "tile", "broadcast_to", "view_as", "reshape_as",
               "swapaxes", "flip", "roll")


def _to(c: _Call):
    """`.to(device)` (HF models move their logits): the same values, as between integer types (a mask made a count); a
    change of floating dtype is a rounding with no rule."""
    src = c.value(c.args[0]).dtype
    if src != c.out.dtype and (src.is_floating_point or c.out.dtype.is_floating_point):
        from ..core import _NoRule

        raise _NoRule(f"`to` changes the dtype ({c.value(c.args[0]).dtype} → {c.out.dtype})")
    return c.box(c.args[0])
