"""Pooling: max-pooling is 1-Lipschitz per window (the op on the box), average pooling has non-negative weights."""

from __future__ import annotations

import math

from ..core import SAFETY, _Call, _NoRule, _map, gamma


def _pool_same(c: _Call):
    """Max-pooling: |max(v) − max(z)| ≤ max over the window of d: the op itself on the box."""
    if isinstance(c.out, (tuple, list)):
        raise _NoRule("pooling indices are not continuous")
    return c.func(c.box(c.args[0]), *_map(c.args[1:], c.value), **_map(c.kwargs, c.value))


def _avg_pool(c: _Call):
    """Average pooling: non-negative weights, the op on the box; rounding of ≤ (spatial size) terms."""
    op = lambda t: c.func(t, *_map(c.args[1:], c.value), **_map(c.kwargs, c.value))
    box = op(c.box(c.args[0]))
    if c.ch.rounding:
        x = c.value(c.args[0])
        box = box + SAFETY * gamma(math.prod(x.shape[2:]) + 1) * op(c.mag(c.args[0]))
    return box
