"""Piecewise-linear activations: Relu, and Clip as ReLUs (clamp(x, lo, hi) = lo + ReLU(x − lo) − ReLU(x − hi))."""

from __future__ import annotations

import numpy as np

from ..ops.affine import Scale, Sum
from ..ops.base import numel
from ..ops.relu import ReLU
from .reader import OnnxReader
from .values import Value


def relu(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    r.set(r.add(ReLU(numel(x.shape), source=r.node.input[0]), [x], x.shape))


def clip(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    bounds = []
    for k, name in ((1, "min"), (2, "max")):
        v = r.node.input[k] if len(r.node.input) > k and r.node.input[k] else None
        bounds.append(float(r.const(v)) if v else r.attr(name, None))
    lo, hi = bounds
    if lo is None:
        raise r.unsupported("a Clip without a lower bound", what="a Clip without a lower bound")
    n = numel(x.shape)
    r.set(clamp(r, x, np.full(n, lo), None if hi is None else np.full(n, hi)))


def clamp(r: OnnxReader, x: Value, lo: np.ndarray, hi: np.ndarray | None) -> Value:
    """clamp(x, lo, hi) = lo + ReLU(x − lo) − ReLU(x − hi) per unit: ReLUs, so branch and bound splits it like one."""
    n, one = numel(x.shape), np.ones(numel(x.shape))
    low = r.add(ReLU(n, source=r.node.input[0]), [r.add(Scale(one, -lo), [x], x.shape, flops=0)], x.shape)
    if hi is not None:
        high = r.add(ReLU(n), [r.add(Scale(one, -hi), [x], x.shape, flops=0)], x.shape)
        low = r.add(Sum(n, (1.0, -1.0)), [low, high], x.shape, flops=0)
    return r.add(Scale(one, lo), [low], x.shape, flops=0)
