"""Smooth activations read alone, anywhere (`ops.smooth.Smooth`): Sigmoid, Tanh, Softplus, Elu, Selu, Softsign, Erf,
a gate's inner chain that no Mul by x takes; Mish as its gate; GELU written with Erf as one Gate x·Φ(λx); GELU's tanh
approximation (opset 20's Gelu with approximate="tanh") as the ops its formula is read to."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..ops.affine import Scale, Sum
from ..ops.base import numel
from ..ops.curves import Exp, Square
from ..ops.gates import Gate
from ..ops.products import Product
from ..ops.shape import Concat
from ..ops.smooth import SELU_ALPHA, SELU_GAMMA, Smooth
from .reader import OnnxReader, describe
from .values import Pending, Value


def _scaled(r: OnnxReader, v: Value) -> tuple[int, np.ndarray, np.ndarray]:
    """(source node, scale, shift) when `v` is a `Scale` of a node (else v itself with scale 1, shift 0)."""
    node = r.nodes[v.node]
    if isinstance(node.op, Scale):
        return node.inputs[0], node.op.scale.numpy(), node.op.shift.numpy()
    n = numel(v.shape)
    return v.node, np.ones(n), np.zeros(n)


def erf_gelu(r: OnnxReader, p: Value, q: Value) -> Value | None:
    """GELU written with Erf, k·x · (t + t·erf(c·x)) = 2kt · x·Φ(√2·c·x) (torch's and Hugging Face's exports: Div by √2,
    Erf, Add 1, Mul by x, Mul by ½ in either order): one Gate with λ = √2·c and a Scale, instead of a product."""
    if p.shape != q.shape:
        return None
    src, k, k0 = _scaled(r, p)
    erf_node, s, t = _scaled(r, q)
    node = r.nodes[erf_node]
    if not (isinstance(node.op, Smooth) and node.op.kind == "erf") or not np.all(k0 == 0):
        return None
    inner, c, c0 = _scaled(r, Value(node.inputs[0], q.shape))
    if inner != src or not (np.all(c0 == 0) and np.all(c > 0) and np.allclose(s, t, rtol=1e-12, atol=0) and np.all(t != 0)):
        return None
    gate = r.add(Gate("phi", np.sqrt(2.0) * c, source=r.node.name), [Value(src, p.shape)], p.shape)
    return r.add(Scale(2 * k * t, np.zeros(numel(p.shape))), [gate], p.shape)


# GELU's tanh approximation, ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (ONNX Gelu's approximate="tanh", torch's and HF's)
TANH_GELU_C = math.sqrt(2.0 / math.pi)
TANH_GELU_K = 0.044715


def tanh_gelu(r: OnnxReader, x: Value) -> Value:
    """½x(1 + tanh(c(x + k·x³))) = x·σ(2c(x + k·x³)) as the ops its written formula reads to: x³ as x·x² (`Product`
    of x and `Square`), a `Sigmoid` of the affine sum, and its `Product` with x, each bounded by its own relaxation."""
    n, shape = numel(x.shape), x.shape

    def times_x(v: Value) -> Value:
        cat = r.add(Concat(((n,), (n,)), 0), [x, v], (2 * n,))
        return r.add(Product(n, source=r.node.name), [cat], shape)

    cube = times_x(r.add(Square(n, source=r.node.name), [x], shape))
    inner = r.add(Sum(n, (1.0, 1.0)), [x, r.add(Scale(np.full(n, TANH_GELU_K), np.zeros(n)), [cube], shape)], shape)
    z = r.add(Scale(np.full(n, 2.0 * TANH_GELU_C), np.zeros(n)), [inner], shape)
    out = times_x(r.add(Smooth(n, "sigmoid", source=r.node.name), [z], shape))
    if r.int8:
        out.fl = None  # a float32 GELU before a QuantizeLinear: not followed
    return out


def _smooth(kind: str, **params: str):
    """A reader of one ONNX activation as a `Smooth` op (params: its parameter's ONNX attribute name and default)."""
    def read(r: OnnxReader, x: Value, node: Any) -> Value:
        values = {}
        for name, (attr, default) in params.items():
            values[name] = default
            for a in node.attribute:
                if a.name == attr:
                    values[name] = float(r.onnx.helper.get_attribute_value(a))
        out = r.add(Smooth(numel(x.shape), kind, source=node.name, **values), [x], x.shape)
        if r.int8:
            out.fl = None  # a float32 activation before a QuantizeLinear: not followed
        return out
    return read


# each one-input smooth activation, read anywhere (a gate's inner chain is one of these when no gate takes it)
STANDALONE: dict[str, Callable[[OnnxReader, Value, Any], Value]] = {
    "Sigmoid": _smooth("sigmoid"), "Tanh": _smooth("tanh"), "Softplus": _smooth("softplus"), "Erf": _smooth("erf"),
    "Softsign": _smooth("softsign"), "Elu": _smooth("elu", alpha=("alpha", 1.0)),
    "Selu": _smooth("selu", alpha=("alpha", SELU_ALPHA), gamma=("gamma", SELU_GAMMA)),
    "Exp": lambda r, x, node: r.add(Exp(numel(x.shape), source=node.name), [x], x.shape),
}


def standalone(r: OnnxReader) -> None:
    """Sigmoid, Tanh, Softplus, Elu, Selu, Softsign or Erf read alone (`Smooth`)."""
    r.set(STANDALONE[r.node.op_type](r, r.var(r.node.input[0]), r.node))


def mish(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    r.set(r.add(Gate("mish", np.ones(numel(x.shape)), source=r.node.name), [x], x.shape))


def chain_alone(r: OnnxReader, pend: Pending) -> Value:
    """A gate's inner chain read by something other than its gate (a plain sigmoid layer, softplus then a Gemm): each
    op of the chain as the activation it is (`smooth.Smooth`, or its own curve)."""
    x = pend.arg
    for op in pend.ops:
        if op not in STANDALONE:
            raise r.unsupported(f"its input comes from {op} ({describe(pend.onnx_node)}), which is read only as a part "
                                "of a gate x·g(λx)", what=f"a {op} outside a gate x·g(λx)")
        x = STANDALONE[op](r, x, pend.onnx_node)
    return x

