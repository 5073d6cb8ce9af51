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


def cast_target(name: str, args: tuple, kwargs: dict) -> torch.dtype | None:
    """The dtype a cast asks for (`x.to(torch.float32)`, `x.float()`, `x.type_as(y)`), or None for a move alone."""
    named = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}
    if name in named:
        return named[name]
    if name == "type_as":
        return args[1].dtype
    for a in (*args[1:], kwargs.get("dtype")):
        if isinstance(a, torch.dtype):
            return a
        if isinstance(a, torch.Tensor) and name == "to":  # x.to(other): other's dtype
            return a.dtype
    return None


def _to(c: _Call):
    """A cast between floating dtypes. The walk keeps its float64 value (`core._Dev`): in real arithmetic a cast is the
    identity, so the exact boxes pass unchanged. The float32 network rounds where it casts down to float32 (from a
    float64 it computed in): one rounding, u·|x| + UNDERFLOW, added whatever it cast from. A cast below float32 (float16,
    bfloat16) makes the float32 statements' premise false after it, and is refused there. `.to(device)` and casts
    between integer types move the same values."""
    from ..core import SAFETY, U32, UNDERFLOW, _NoRule

    src = c.value(c.args[0]).dtype
    dst = cast_target(c.name, c.args, c.kwargs) or c.out.dtype
    if src == dst or not (src.is_floating_point or dst.is_floating_point):
        return c.box(c.args[0])
    if not (src.is_floating_point and dst.is_floating_point):  # integers that agree are exact in both (mask counts)
        if bool(c.box(c.args[0]).any()):
            raise _NoRule(f"`{c.name}` changes the dtype between floating point and integers ({src} → {dst}) on values "
                          "that differ between the networks")
        return c.box(c.args[0])
    if not c.ch.rounding:
        return c.box(c.args[0])
    if torch.finfo(dst).eps > torch.finfo(torch.float32).eps:
        raise _NoRule(f"`{c.name}` casts to {dst}: the float32 statements assume float32 arithmetic after it")
    box = c.box(c.args[0])
    if dst == torch.float32:
        box = box + SAFETY * (U32 * c.mag(c.args[0]) + UNDERFLOW)
    return box
