"""Piecewise-linear activations, each read as an exact sum of ReLUs and affine maps, so CROWN relaxes and branch and
bound splits them as ReLUs: Relu; Clip (clamp(x, lo, hi) = hi − ReLU(hi − lo − ReLU(x − lo))); LeakyRelu and PRelu
(a·x + (1 − a)·ReLU(x)); Abs (2·ReLU(x) − x); Max and Min (b + ReLU(a − b), a − ReLU(a − b)); HardSigmoid (a clamp
of α·x + β to [0, 1]); and HardSwish, x·hardsigmoid(x), its own op (`ops.relu.HardSwish`)."""

from __future__ import annotations

import numpy as np

from ..ops.affine import Scale, Sum
from ..ops.base import numel
from ..ops.relu import HardSwish, ReLU
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
    n = numel(x.shape)
    if lo is None and hi is None:
        return r.set(x)
    if lo is None:  # min(x, hi) = x − ReLU(x − hi)
        return r.set(_minus_relu(r, x, x, np.full(n, hi)))
    r.set(clamp(r, x, np.full(n, lo), None if hi is None else np.full(n, hi)))


def clamp(r: OnnxReader, x: Value, lo: np.ndarray, hi: np.ndarray | None) -> Value:
    """clamp(x, lo, hi) = hi − ReLU(hi − lo − ReLU(x − lo)) per unit: ReLUs, so branch and bound splits it like one.
    Nested rather than lo + ReLU(x − lo) − ReLU(x − hi): interval arithmetic keeps the range [lo, hi] (the difference of
    two ReLUs of x reads [lo − (u − hi), u]), and a unit crossing both kinks gets the flat line hi as an upper bound."""
    n, one = numel(x.shape), np.ones(numel(x.shape))
    low = r.add(ReLU(n, source=r.node.input[0]), [r.add(Scale(one, -lo), [x], x.shape, flops=0)], x.shape)
    if hi is None:
        return r.add(Scale(one, lo), [low], x.shape, flops=0)
    room = r.add(Scale(-one, hi - lo), [low], x.shape, flops=0)  # hi − clamp(x, lo, ∞) ≥ 0 below hi
    top = r.add(ReLU(n), [room], x.shape)
    return r.add(Scale(-one, hi), [top], x.shape, flops=0)


def _minus_relu(r: OnnxReader, base: Value, x: Value, c: np.ndarray) -> Value:
    """base − ReLU(x − c)."""
    n = numel(x.shape)
    relu_ = r.add(ReLU(n, source=r.node.name), [r.add(Scale(np.ones(n), -c), [x], x.shape, flops=0)], x.shape)
    return r.add(Sum(n, (1.0, -1.0)), [base, relu_], x.shape, flops=0)


def _leaky(r: OnnxReader, x: Value, a: np.ndarray) -> Value:
    """a·x + (1 − a)·ReLU(x), per unit: x where x ≥ 0 and a·x below, for any slope a."""
    n = numel(x.shape)
    pos = r.add(ReLU(n, source=r.node.name), [x], x.shape)
    scaled = r.add(Scale(1.0 - a, np.zeros(n)), [pos], x.shape, flops=0)
    return r.add(Sum(n, (1.0, 1.0)), [r.add(Scale(a, np.zeros(n)), [x], x.shape, flops=0), scaled], x.shape, flops=0)


def leaky_relu(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    r.set(_leaky(r, x, np.full(numel(x.shape), float(r.attr("alpha", 0.01)))))


def prelu(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    if not r.is_const(r.node.input[1]):
        raise r.unsupported("a PRelu whose slope is a variable is not read", what="a PRelu with a variable slope",
                            fix="export the slope as a constant (an initializer)")
    slope = np.asarray(r.const(r.node.input[1]), dtype=np.float64)
    if r.broadcast(x.shape, slope.shape) != tuple(x.shape):
        raise r.unsupported(f"a slope of shape {slope.shape} on a tensor of shape {x.shape}",
                            what="a PRelu slope that broadcasts beyond its input")
    r.set(_leaky(r, x, np.broadcast_to(slope, x.shape).reshape(-1).copy()))


def abs_(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    n = numel(x.shape)
    pos = r.add(ReLU(n, source=r.node.name), [x], x.shape)
    r.set(r.add(Sum(n, (2.0, -1.0)), [pos, x], x.shape, flops=0))


def max_min(r: OnnxReader) -> None:
    """Max(a, b) = b + ReLU(a − b) and Min(a, b) = a − ReLU(a − b), folded over any number of inputs, each a variable
    or a constant (broadcast)."""
    names = [n for n in r.node.input if n]
    if not names:
        raise r.unsupported("a Max or Min with no input", what="a Max or Min with no input")
    shape = r.broadcast(*[(r.var(n).shape if not r.is_const(n) else np.asarray(r.const(n)).shape) for n in names])
    size = numel(shape)
    acc: Value | None = None
    consts: list[np.ndarray] = []
    for name in names:
        if r.is_const(name):
            consts.append(np.broadcast_to(np.asarray(r.const(name), dtype=np.float64), shape).reshape(-1))
            continue
        v = r.expand(r.var(name), shape)
        acc = v if acc is None else _pair(r, acc, v, size, shape)
    if acc is None:
        raise r.unsupported("a Max or Min of constants only", what="a Max or Min of constants")
    if consts:
        c = (np.maximum if r.node.op_type == "Max" else np.minimum).reduce(consts)
        if r.node.op_type == "Max":  # max(x, c) = c + ReLU(x − c)
            pos = r.add(ReLU(size, source=r.node.name), [r.add(Scale(np.ones(size), -c), [acc], shape, flops=0)], shape)
            acc = r.add(Scale(np.ones(size), c), [pos], shape, flops=0)
        else:  # min(x, c) = x − ReLU(x − c)
            acc = _minus_relu(r, acc, acc, c)
    r.set(acc)


def _pair(r: OnnxReader, a: Value, b: Value, n: int, shape: tuple[int, ...]) -> Value:
    diff = r.add(Sum(n, (1.0, -1.0)), [a, b], shape, flops=0)
    pos = r.add(ReLU(n, source=r.node.name), [diff], shape)
    if r.node.op_type == "Max":
        return r.add(Sum(n, (1.0, 1.0)), [b, pos], shape, flops=0)
    return r.add(Sum(n, (1.0, -1.0)), [a, pos], shape, flops=0)


def hard_sigmoid(r: OnnxReader) -> None:
    """clip(α·x + β, 0, 1), ONNX's defaults α = 0.2, β = 0.5 (torch's exporter writes α = 1/6)."""
    x = r.var(r.node.input[0])
    n = numel(x.shape)
    alpha, beta = float(r.attr("alpha", 0.2)), float(r.attr("beta", 0.5))
    z = r.add(Scale(np.full(n, alpha), np.full(n, beta)), [x], x.shape, flops=0)
    r.set(clamp(r, z, np.zeros(n), np.ones(n)))


def hard_swish(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    r.set(r.add(HardSwish(numel(x.shape), source=r.node.name), [x], x.shape))
