"""Means and sums over dims: linear with non-negative weights, so the op on the box (an average never grows the largest
deviation); float32: the n-term sum within γ_n of the sum of |x|, and a mean's division one rounding more."""

from __future__ import annotations

from ..core import SAFETY, _Call, _map, _NoRule, gamma

REDUCTIONS = ("mean", "sum")


def _reduce(c: _Call):
    if c.kwargs.get("dtype") is not None:
        raise _NoRule(f"`{c.name}` with a dtype: it computes at another precision")
    op = lambda t: c.func(t, *_map(c.args[1:], c.value), **_map(c.kwargs, c.value))
    box = op(c.box(c.args[0]))
    if c.ch.rounding:
        n = max(1, c.value(c.args[0]).numel() // max(1, c.out.numel()))  # terms per output entry
        box = box + SAFETY * gamma(n + 1) * op(c.mag(c.args[0]))
    return box
