"""Reading models into a `graph.Graph`: ONNX graphs through a table from op type to handler, torch modules
through their ONNX export (so anything the exporter writes in ops listed here can be verified).

The ONNX reader takes one float input (a leading batch axis of 1 or symbolic, or none) and one output.
Constant subgraphs (shape arithmetic, weights behind Cast/Transpose/DequantizeLinear) are evaluated with numpy
(`CONSTANT_OPS`). A smooth gate is read from the ops its module exports to: λ-GELU = GELU(λx)/λ is
Mul → Gelu → Div (folded back into one Gate with its λ), x·σ(λx) is Mul → Sigmoid → Mul, SERF's
x·erf(softplus(λx)) is Mul → Softplus → Erf → Mul. Anything else raises `UnsupportedModel`, one line naming
the op and the node (for a torch module: the module path).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline import gates
from pipeline.gates import GateFamily
from pipeline.numerics import U

from .graph import Graph, Node
from .ops import (Concat, Conv, Gate, Linear, Op, Permute, QuantizedInput, ReLU, Rounding, Scale, Sum, UnsupportedModel,
                  as_tensor, average_pool, numel)


WEIGHT_RANGE = (-64, 64)  # 7-bit weights as reduce_range makes them: a pair of products 2·255·64 = 32640 fits int16 (`quantized`)


@dataclass
class Value:
    """A variable tensor: the graph node that computes it, and the shape it is read with (no batch axis)."""

    node: int
    shape: tuple[int, ...]


@dataclass
class QValue:
    """The integer output of a QuantizeLinear on a variable: read only by the DequantizeLinear of the same grid."""

    src: Value
    scale: np.ndarray  # per unit (flat, the source's shape)
    zero: np.ndarray  # per unit
    qmin: int
    qmax: int
    onnx_node: Any


@dataclass
class Grid:
    """What a dequantized node's values are known to be: points of this grid, in [lo, hi] per unit."""

    scale: np.ndarray
    zero: np.ndarray
    qmin: int
    qmax: int
    lo: torch.Tensor
    hi: torch.Tensor

    def same(self, q: Any) -> bool:
        """Is `q` (a QValue, a Grid, parameters read from a node) this grid: scale, zero point and range?"""
        return (self.qmin, self.qmax) == (q.qmin, q.qmax) and np.array_equal(self.scale, q.scale) and np.array_equal(self.zero, q.zero)


@dataclass
class Pending:
    """The inner part of a gate x·g(λx) (σ(λx), softplus(λx), erf(softplus(λx))): read only as part of the gate."""

    ops: tuple[str, ...]  # the ops read so far of a gate family's chain (`gate_patterns`)
    arg: Value
    onnx_node: Any


class OnnxReader:
    """State while reading one ONNX graph: constants, values, the nodes built so far."""

    def __init__(self, model: Any):
        import onnx
        from onnx import numpy_helper

        self.onnx = onnx
        self.graph = model.graph
        self.consts: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in self.graph.initializer}
        self.vals: dict[str, Value | Pending] = {}
        self.nodes: list[Node] = [Node(None, (), "input")]
        inputs = [i for i in self.graph.input if i.name not in self.consts]
        if len(inputs) != 1 or len(self.graph.output) != 1:
            raise UnsupportedModel(f"the graph has {len(inputs)} inputs and {len(self.graph.output)} outputs; one of each is supported")
        dims = [d.dim_value if d.dim_value > 0 else 1 for d in inputs[0].type.tensor_type.shape.dim]
        if not dims:
            raise UnsupportedModel("the graph input has no shape")
        # the batch axis: a leading 1 (fixed or symbolic); a graph without one takes a single flat input
        self.batch = len(dims) > 1 and dims[0] == 1
        self.input_shape = tuple(dims[1:]) if self.batch else tuple(dims)
        self.vals[inputs[0].name] = Value(0, self.input_shape)
        self.node: Any = None  # the ONNX node being read (for messages)
        # int8 QDQ graphs (`quantized`): scales of dequantized constants by tensor name, the grid of each dequantized
        # node, and per affine node what its runtime rounding depends on (weight scales, an int32 bias)
        self.const_scales: dict[str, np.ndarray] = {}
        self.grids: dict[int, Grid] = {}
        self.affine_info: dict[int, dict[str, Any]] = {}
        self.wide_weights: set[str] = set()  # 8-bit weights: outside what `quantized` covers

    # -- building -----------------------------------------------------------------------------
    def add(self, op: Op, inputs: Sequence[Value], shape: tuple[int, ...]) -> Value:
        self.nodes.append(Node(op, tuple(v.node for v in inputs), self.node.name if self.node is not None else ""))
        return Value(len(self.nodes) - 1, tuple(int(d) for d in shape))

    def set(self, value: Value | Pending, index: int = 0) -> None:
        self.vals[self.node.output[index]] = value

    # -- reading inputs -----------------------------------------------------------------------
    def is_const(self, name: str) -> bool:
        return name in self.consts

    def const(self, name: str) -> np.ndarray:
        if name not in self.consts:
            raise self.unsupported(f"input {name!r} must be a constant")
        return self.consts[name]

    def var(self, name: str) -> Value:
        v = self.vals.get(name)
        if isinstance(v, Pending):
            raise self.unsupported(f"{v.onnx_node.op_type} output is read only as the gate of x·g(λx)", where=v.onnx_node)
        if isinstance(v, QValue):
            raise self.unsupported(f"an integer tensor {name!r} read by a {self.node.op_type}: the reader takes integer tensors "
                                   "only into the DequantizeLinear of their own QuantizeLinear")
        if v is None:
            raise self.unsupported(f"a constant input {name!r} where this reader takes a variable" if name in self.consts
                                   else f"input {name!r} is not computed before")
        return v

    def attr(self, name: str, default: Any = None) -> Any:
        for a in self.node.attribute:
            if a.name == name:
                return self.onnx.helper.get_attribute_value(a)
        return default

    def full(self, c: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """A constant broadcast to a variable's shape (its batch axis dropped), flat."""
        c = np.asarray(c, dtype=np.float64)
        if self.batch and c.ndim == len(shape) + 1:
            if c.shape[0] != 1:
                raise self.unsupported(f"a constant of shape {c.shape} does not broadcast to {shape}")
            c = c[0]
        try:
            return np.broadcast_to(c, shape).reshape(-1).copy()
        except ValueError:
            raise self.unsupported(f"a constant of shape {c.shape} does not broadcast to {shape}") from None

    def axis(self, a: int, rank: int) -> int:
        """An ONNX axis (counting the batch axis) as an axis of the shapes read here."""
        full = rank + (1 if self.batch else 0)
        a = a + full if a < 0 else a
        a = a - (1 if self.batch else 0)
        if not 0 <= a < rank:
            raise self.unsupported(f"an axis over the batch dimension (axis {a})")
        return a

    def with_batch(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return ((1,) if self.batch else ()) + tuple(shape)

    def without_batch(self, shape: Sequence[int]) -> tuple[int, ...]:
        shape = tuple(int(d) for d in shape)
        if self.batch:
            if not shape or shape[0] != 1:
                raise self.unsupported(f"a shape {shape} that moves the batch axis")
            return shape[1:]
        return shape

    def unsupported(self, why: str = "", where: Any = None) -> UnsupportedModel:
        node = where if where is not None else self.node
        e = UnsupportedModel(f"unsupported ONNX op {node.op_type} ({_where(node)}){': ' + why if why else ''}; "
                             f"the verifier reads {', '.join(readable_ops())}")
        e.onnx_node, e.why = node, why  # type: ignore[attr-defined]
        return e

    # -- the walk -----------------------------------------------------------------------------
    def read(self) -> Graph:
        for node in self.graph.node:
            self.node = node
            if node.op_type == "Constant":
                self.consts[node.output[0]] = _constant(self, node)
                continue
            if all(i in self.consts or i == "" for i in node.input) and node.op_type in CONSTANT_OPS:
                for k, v in enumerate(CONSTANT_OPS[node.op_type](self, [self.consts.get(i) for i in node.input])):
                    self.consts[node.output[k]] = v
                continue
            handler = HANDLERS.get(node.op_type) or _gate_handler(node.op_type)
            if handler is None:
                raise self.unsupported()
            handler(self)
        self.node = None
        out = self.vals.get(self.graph.output[0].name)
        if isinstance(out, Value) and out.node in self.grids and not isinstance(self.nodes[out.node].op, QuantizedInput):
            # the output's DequantizeLinear runs in float32: one rounding, relative 2⁻²⁴, of a value within the grid's range
            g = self.grids[out.node]
            E = U * torch.maximum(g.lo.abs(), g.hi.abs()).numpy()
            out = self.add(Rounding(E, None, source=self.graph.output[0].name), [out], out.shape)
        if isinstance(out, Pending):
            raise self.unsupported(f"{out.onnx_node.op_type} output is read only as the gate of x·g(λx)", where=out.onnx_node)
        if not isinstance(out, Value):
            raise UnsupportedModel("the graph output is not computed from its input")
        return Graph(self.input_shape, self.nodes, out.node).pruned()


def _where(node: Any) -> str:
    return f"node {node.name!r}" if node.name else f"a {node.op_type} node"


def _constant(r: OnnxReader, node: Any) -> np.ndarray:
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name in ("value_float", "value_int"):
            return np.array(r.onnx.helper.get_attribute_value(a))
        if a.name in ("value_floats", "value_ints"):
            return np.array(list(r.onnx.helper.get_attribute_value(a)))
    raise r.unsupported("a Constant without a tensor value")


# ---------------------------------------------------------------------------------------------
# constant folding (numpy)

def _reshape_target(target: np.ndarray, shape: tuple[int, ...], allowzero: int) -> list[int]:
    t = [int(d) for d in target]
    t = [shape[i] if d == 0 and not allowzero else d for i, d in enumerate(t)]
    if -1 in t:
        known = int(np.prod([d for d in t if d != -1]))
        t[t.index(-1)] = numel(shape) // max(known, 1)
    return t


def _slice(r: OnnxReader, x: np.ndarray, starts, ends, axes=None, steps=None) -> np.ndarray:
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    idx = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        idx[int(a)] = slice(int(s), int(e), int(st))
    return x[tuple(idx)]


def _dequantize(r: OnnxReader, args: list[Any]) -> np.ndarray:
    x, scale = args[0], np.asarray(args[1], dtype=np.float64)
    zero = np.asarray(args[2], dtype=np.float64) if len(args) > 2 and args[2] is not None else np.zeros_like(scale)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * x.ndim
        shape[r.attr("axis", 1)] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    if r.node is not None:  # an int8 graph's weight or bias: its scale decides the runtime's bias rounding
        r.const_scales[r.node.output[0]] = np.broadcast_to(scale, x.shape)
        ints = np.asarray(x, dtype=np.float64) - zero
        if x.dtype in (np.int8, np.uint8) and (ints.min(initial=0) < WEIGHT_RANGE[0] or ints.max(initial=0) > WEIGHT_RANGE[1]):
            r.wide_weights.add(r.node.output[0])
    return (x.astype(np.float64) - zero) * scale


CONSTANT_OPS: dict[str, Callable[[OnnxReader, list[Any]], list[np.ndarray]]] = {
    "Identity": lambda r, a: [a[0]],
    "Cast": lambda r, a: [a[0]],
    "Reshape": lambda r, a: [a[0].reshape(_reshape_target(a[1], a[0].shape, r.attr("allowzero", 0)))],
    "Transpose": lambda r, a: [np.transpose(a[0], r.attr("perm", None))],
    "Unsqueeze": lambda r, a: [np.expand_dims(a[0], tuple(int(v) for v in (a[1] if len(a) > 1 else r.attr("axes"))))],
    "Squeeze": lambda r, a: [np.squeeze(a[0], tuple(int(v) for v in (a[1] if len(a) > 1 and a[1] is not None else r.attr("axes", [])))
                                        or None)],
    "Concat": lambda r, a: [np.concatenate(a, axis=r.attr("axis"))],
    "Gather": lambda r, a: [np.take(a[0], a[1], axis=r.attr("axis", 0))],
    "Slice": lambda r, a: [_slice(r, a[0], *a[1:])],
    "Add": lambda r, a: [a[0] + a[1]],
    "Sub": lambda r, a: [a[0] - a[1]],
    "Mul": lambda r, a: [a[0] * a[1]],
    "Div": lambda r, a: [a[0] / a[1] if np.issubdtype(np.asarray(a[0]).dtype, np.floating) else a[0] // a[1]],
    "Neg": lambda r, a: [-a[0]],
    "Sqrt": lambda r, a: [np.sqrt(a[0])],
    "Flatten": lambda r, a: [a[0].reshape(int(np.prod(a[0].shape[:r.attr("axis", 1)])), -1)],
    "DequantizeLinear": lambda r, a: [_dequantize(r, a)],
}


# ---------------------------------------------------------------------------------------------
# the handlers: one per ONNX op type

HANDLERS: dict[str, Callable[[OnnxReader], None]] = {}


def handles(*ops: str):
    def deco(fn: Callable[[OnnxReader], None]) -> Callable[[OnnxReader], None]:
        for op in ops:
            HANDLERS[op] = fn
        return fn
    return deco


@handles("Identity", "Dropout", "Cast")
def _identity(r: OnnxReader) -> None:
    if r.node.op_type == "Cast" and r.attr("to") not in (1, 10, 11, 16):  # float, float16, double, bfloat16
        raise r.unsupported("a cast to a non-float type")
    r.set(r.vals.get(r.node.input[0]) or r.var(r.node.input[0]))


@handles("Shape")
def _shape(r: OnnxReader) -> None:
    r.consts[r.node.output[0]] = np.array(r.with_batch(r.var(r.node.input[0]).shape), dtype=np.int64)


@handles("Gemm")
def _gemm(r: OnnxReader) -> None:
    a, w = r.node.input[0], r.node.input[1]
    if r.attr("transA", 0) or r.is_const(a) or not r.is_const(w):
        raise r.unsupported("only x·Wᵀ + b with x the variable and W constant")
    x = r.var(a)
    W = r.const(w).astype(np.float64)
    W = W if r.attr("transB", 0) else W.T  # (out, in)
    if len(x.shape) != 1 or x.shape[0] != W.shape[1]:
        raise r.unsupported(f"a Gemm of {W.shape[::-1]} on a tensor of shape {x.shape}")
    c = r.node.input[2] if len(r.node.input) > 2 else ""
    b = r.const(c).astype(np.float64) if c else np.zeros(W.shape[0])
    bias = r.attr("beta", 1.0) * np.broadcast_to(b, (1, W.shape[0])).ravel()
    out = r.add(Linear(r.attr("alpha", 1.0) * W, bias), [x], (W.shape[0],))
    ws = r.const_scales.get(w)
    _record_affine(r, out, x, W.shape[1], None if ws is None else (ws if r.attr("transB", 0) else ws.T).max(1), bool(c) and c in r.const_scales)
    r.set(out)


def _record_affine(r: OnnxReader, out: Value, x: Value, terms: int, w_scale: np.ndarray | None, int_bias: bool) -> None:
    """What the runtime's rounding of this affine node depends on, for a QuantizeLinear that may read it."""
    if r.node.input[1] in r.wide_weights:
        raise r.unsupported("int8 weights beyond 7 bits: onnxruntime's x86 kernels without VNNI add products in pairs in "
                            "int16 with saturation, so no bound holds; quantize with quantize.reduce_range=true")
    r.affine_info[out.node] = {"input": x.node, "terms": int(terms), "int_bias": int_bias,
                               "w_scale": None if w_scale is None else np.asarray(w_scale, dtype=np.float64).reshape(-1)}


@handles("MatMul")
def _matmul(r: OnnxReader) -> None:
    a, w = r.node.input
    if r.is_const(a) or not r.is_const(w):
        raise r.unsupported("only x·W with x the variable and W constant")
    x, W = r.var(a), r.const(w).astype(np.float64)
    if W.ndim != 2 or len(x.shape) != 1 or x.shape[0] != W.shape[0]:
        raise r.unsupported(f"only x·W with x flat (got shape {x.shape}) and a constant 2-d W (got {W.shape})")
    out = r.add(Linear(W.T, np.zeros(W.shape[1])), [x], (W.shape[1],))
    ws = r.const_scales.get(w)
    _record_affine(r, out, x, W.shape[0], None if ws is None else ws.max(0), False)
    r.set(out)


@handles("Add", "Sub", "Mul", "Div")
def _arith(r: OnnxReader) -> None:
    op = r.node.op_type
    a, b = r.node.input
    if not r.is_const(a) and not r.is_const(b):
        return _two_variables(r, op, a, b)
    var_first = not r.is_const(a)
    x = r.var(a if var_first else b)
    c = r.full(r.const(b if var_first else a), x.shape)
    one, zero = np.ones_like(c), np.zeros_like(c)
    if op == "Add":
        scale, shift = one, c
    elif op == "Sub":
        scale, shift = (one, -c) if var_first else (-one, c)
    elif op == "Mul":
        scale, shift = c, zero
    elif var_first:
        scale, shift = 1.0 / c, zero
    else:
        raise r.unsupported("a constant divided by the variable")
    if op in ("Mul", "Div") and (folded := _fold_gate(r, x, scale)) is not None:
        return r.set(folded)
    r.set(r.add(Scale(scale, shift), [x], x.shape))


def _two_variables(r: OnnxReader, op: str, a: str, b: str) -> None:
    if op in ("Add", "Sub"):
        x, y = r.var(a), r.var(b)
        if x.shape != y.shape:
            raise r.unsupported(f"{op} of tensors of shapes {x.shape} and {y.shape} (broadcasting is not read)")
        r.set(r.add(Sum(numel(x.shape), (1.0, 1.0 if op == "Add" else -1.0)), [x, y], x.shape))
        return
    if op == "Mul":
        va, vb = r.vals.get(a), r.vals.get(b)
        pend, other = (va, vb) if isinstance(va, Pending) else (vb, va)
        fam = gate_patterns().get(pend.ops) if isinstance(pend, Pending) else None
        if fam is not None and not fam.onnx.whole and isinstance(other, Value):
            lam = _lambda_of(r, pend.arg, other)
            if lam is not None:
                r.set(r.add(Gate(fam.name, lam, source=r.node.name), [other], other.shape))
                return
        raise r.unsupported("a product of two variables that is not a gate x·g(λx)")
    raise r.unsupported("a quotient of two variables")


def _lambda_of(r: OnnxReader, arg: Value, x: Value) -> np.ndarray | None:
    """λ (per unit) when `arg` is λ·x: x itself (λ = 1), or a Scale node with no shift and λ > 0 on x."""
    if arg.node == x.node and arg.shape == x.shape:
        return np.ones(numel(x.shape))
    node = r.nodes[arg.node]
    if (isinstance(node.op, Scale) and node.inputs == (x.node,) and bool(torch.all(node.op.shift == 0))
            and bool(torch.all(node.op.scale > 0))):
        return node.op.scale.numpy()
    return None


def _fold_gate(r: OnnxReader, x: Value, scale: np.ndarray) -> Value | None:
    """GELU(λx)·(1/λ) (Mul → Gelu → Div as λ-GELU exports) read back as one Gate x·Φ(λx) with its λ."""
    node = r.nodes[x.node]
    if not (isinstance(node.op, Gate) and bool(torch.all(node.op.lam == 1))):
        return None
    inner = r.nodes[node.inputs[0]]
    if not (isinstance(inner.op, Scale) and bool(torch.all(inner.op.shift == 0)) and bool(torch.all(inner.op.scale > 0))):
        return None
    lam = inner.op.scale
    if not bool(torch.all((as_tensor(scale) * lam - 1).abs() <= 1e-12)):
        return None
    src = Value(inner.inputs[0], x.shape)
    return r.add(Gate(node.op.kind, lam, source=r.node.name), [src], x.shape)


@handles("Neg")
def _neg(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    r.set(r.add(Scale(-np.ones(numel(x.shape)), np.zeros(numel(x.shape))), [x], x.shape))


@handles("Relu")
def _relu(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    r.set(r.add(ReLU(numel(x.shape), source=r.node.input[0]), [x], x.shape))


@handles("Clip")
def _clip(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    bounds = []
    for k, name in ((1, "min"), (2, "max")):
        v = r.node.input[k] if len(r.node.input) > k and r.node.input[k] else None
        bounds.append(float(r.const(v)) if v else r.attr(name, None))
    lo, hi = bounds
    if lo is None:
        raise r.unsupported("a Clip without a lower bound")
    n = numel(x.shape)
    r.set(_clamp(r, x, np.full(n, lo), None if hi is None else np.full(n, hi)))


def _clamp(r: OnnxReader, x: Value, lo: np.ndarray, hi: np.ndarray | None) -> Value:
    """clamp(x, lo, hi) = lo + ReLU(x − lo) − ReLU(x − hi) per unit: ReLUs, so branch and bound splits it like one."""
    n, one = numel(x.shape), np.ones(numel(x.shape))
    low = r.add(ReLU(n, source=r.node.input[0]), [r.add(Scale(one, -lo), [x], x.shape)], x.shape)
    if hi is not None:
        high = r.add(ReLU(n), [r.add(Scale(one, -hi), [x], x.shape)], x.shape)
        low = r.add(Sum(n, (1.0, -1.0)), [low, high], x.shape)
    return r.add(Scale(one, lo), [low], x.shape)


# -- int8 QDQ graphs (`quantized` says which execution the reading covers) -------------------------

def _quant_params(r: OnnxReader, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(scale, zero point) per unit of a tensor of `shape`, and the integer range, of a Q/DQ node."""
    from .quantized import INT_RANGES

    scale = np.asarray(r.const(r.node.input[1]), dtype=np.float64)
    zname = r.node.input[2] if len(r.node.input) > 2 else ""
    if zname:
        zc = r.consts[zname] if zname in r.consts else r.const(zname)
        dtype = {np.dtype(np.int8): 3, np.dtype(np.uint8): 2}.get(np.asarray(zc).dtype)
        zero = np.asarray(zc, dtype=np.float64)
    else:  # no zero point: uint8 unless output_dtype says otherwise (opset 21)
        dtype, zero = r.attr("output_dtype", 2) or 2, np.zeros_like(scale)
    if dtype not in INT_RANGES:
        raise r.unsupported("only int8 and uint8 quantization")
    if scale.size > 1:  # per channel along `axis`
        axis = r.axis(r.attr("axis", 1), len(shape))
        bshape = [1] * len(shape)
        bshape[axis] = scale.size
        scale, zero = scale.reshape(bshape), zero.reshape(bshape)
    full = lambda v: np.broadcast_to(v, shape).reshape(-1).copy()  # noqa: E731
    qmin, qmax = INT_RANGES[dtype]
    return full(scale), full(zero), qmin, qmax


@handles("QuantizeLinear")
def _quantize(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    scale, zero, qmin, qmax = _quant_params(r, x.shape)
    r.set(QValue(x, scale, zero, qmin, qmax, r.node))


@handles("DequantizeLinear")
def _dequantize_var(r: OnnxReader) -> None:
    """DequantizeLinear of a QuantizeLinear on the same grid: the pair's relaxation (`quantized` derives it)."""
    from .quantized import exact_error, int32_safe, requant_error

    q = r.vals.get(r.node.input[0])
    if not isinstance(q, QValue):
        raise r.unsupported("a DequantizeLinear of a variable that no QuantizeLinear made")
    scale, zero, qmin, qmax = _quant_params(r, q.src.shape)
    lo, hi = q.scale * (qmin - q.zero), q.scale * (qmax - q.zero)
    if not Grid(scale, zero, qmin, qmax, as_tensor(lo), as_tensor(hi)).same(q):
        raise r.unsupported("a DequantizeLinear whose scale or zero point differs from its QuantizeLinear's")
    x = q.src
    grid = r.grids.get(x.node)
    if grid is not None and grid.same(q):  # requantized on its own grid (around a Flatten, a MaxPool): exact
        return r.set(x)
    op = r.nodes[x.node].op
    if x.node == 0:
        out = r.add(QuantizedInput(q.scale, q.zero, qmin, qmax, source=r.node.input[0]), [x], x.shape)
    else:
        if grid is not None:
            E = exact_error((grid.lo, grid.hi), q.scale, q.zero)
        elif isinstance(op, ReLU) and r.nodes[x.node].inputs[0] in r.grids:
            g = r.grids[r.nodes[x.node].inputs[0]]
            E = exact_error((g.lo.clamp(min=0), g.hi.clamp(min=0)), q.scale, q.zero)
        elif x.node in r.affine_info and r.affine_info[x.node]["input"] in r.grids:
            info = r.affine_info[x.node]
            g = r.grids[info["input"]]
            step = None if info["w_scale"] is None or info["int_bias"] else float(g.scale.max()) * info["w_scale"]
            if not int32_safe(op, (g.lo, g.hi), g.scale, info["w_scale"]):
                raise r.unsupported("an integer sum that may overflow int32")
            E = requant_error(op, (g.lo, g.hi), q.scale, q.zero, info["terms"], step)
        else:
            what = r.nodes[x.node].name or type(op).__name__
            raise r.unsupported(f"the quantized value comes from {what}, not from an affine op, a ReLU or a layout op on "
                                "dequantized inputs: its float32 rounding is not bounded here")
        noisy = r.add(Rounding(E, q.scale, source=r.node.input[0]), [x], x.shape)
        out = _clamp(r, noisy, lo, hi)
    r.grids[out.node] = Grid(q.scale, q.zero, qmin, qmax, as_tensor(lo), as_tensor(hi))
    r.set(out)


# -- gates: the ONNX patterns of the gate families (`pipeline.gates.GateFamily.onnx`) -------------------------

def gate_patterns() -> dict[tuple[str, ...], GateFamily]:
    """The op chains read as gates, of every family the verifier can bound (it has an ONNX pattern and relaxation
    data), registered now: a chain computes g(λx) (then x·g(λx) is its Mul by x) or, `whole`, F(λx) itself."""
    return {fam.onnx.ops: fam for fam in gates.GATES.values() if fam.onnx is not None and fam.relaxation is not None}


def readable_ops() -> list[str]:
    """Every op type the reader reads (the handlers' and the gate patterns')."""
    return sorted({*HANDLERS, *(op for ops in gate_patterns() for op in ops)})


def _gate_handler(op: str) -> Callable[[OnnxReader], None] | None:
    return _gate_op if any(op in ops for ops in gate_patterns()) else None


def _gate_op(r: OnnxReader) -> None:
    """One op of a gate's chain: a whole chain of a `whole` pattern (Gelu) is the gate at λ = 1, which `_fold_gate`
    turns into x·g(λx) when it sits between Mul(λ) and Div(λ); any other part is Pending until its Mul by x."""
    op, src = r.node.op_type, r.vals.get(r.node.input[0])
    ops, arg = ((*src.ops, op), src.arg) if isinstance(src, Pending) else ((op,), r.var(r.node.input[0]))
    patterns = gate_patterns()
    if not any(p[:len(ops)] == ops for p in patterns):
        known = "; ".join(" → ".join(p) for p in patterns)
        raise r.unsupported(f"{op} is read only as a part of a gate x·g(λx) ({known})")
    fam = patterns.get(ops)
    if fam is not None and fam.onnx.whole:
        approximate = r.attr("approximate", "none")
        if approximate not in ("none", b"none"):
            form = approximate.decode() if isinstance(approximate, bytes) else approximate
            raise r.unsupported(f"the {form} approximation of {op.upper()}")
        return r.set(r.add(Gate(fam.name, np.ones(numel(arg.shape)), source=r.node.name), [arg], arg.shape))
    r.set(Pending(ops, arg, r.node))


@handles("Conv")
def _conv(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    if len(x.shape) != 3:
        raise r.unsupported(f"a 2-d Conv on a tensor of shape {x.shape}")
    w = r.const(r.node.input[1]).astype(np.float64)
    if w.ndim != 4:
        raise r.unsupported("only 2-d convolutions")
    b = r.const(r.node.input[2]).astype(np.float64) if len(r.node.input) > 2 and r.node.input[2] else np.zeros(w.shape[0])
    pads = list(r.attr("pads", [0, 0, 0, 0]))
    if r.attr("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or pads[0] != pads[2] or pads[1] != pads[3]:
        raise r.unsupported("auto_pad or asymmetric padding")
    conv = Conv(w, b, x.shape, tuple(r.attr("strides", [1, 1])), (pads[0], pads[1]), tuple(r.attr("dilations", [1, 1])),
                r.attr("group", 1))
    out = r.add(conv, [x], conv.out_shape)
    ws = r.const_scales.get(r.node.input[1])
    per_unit = None if ws is None else np.repeat(ws.reshape(ws.shape[0], -1).max(1), numel(conv.out_shape[1:]))
    bias_name = r.node.input[2] if len(r.node.input) > 2 else ""
    _record_affine(r, out, x, numel(w.shape[1:]), per_unit, bool(bias_name) and bias_name in r.const_scales)
    r.set(out)


@handles("AveragePool", "GlobalAveragePool")
def _avgpool(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    if len(x.shape) != 3:
        raise r.unsupported(f"2-d pooling on a tensor of shape {x.shape}")
    if r.node.op_type == "GlobalAveragePool":
        op = average_pool(x.shape, x.shape[1:], (1, 1))
    else:
        pads = list(r.attr("pads", [0, 0, 0, 0]))
        if pads[0] != pads[2] or pads[1] != pads[3] or (any(pads) and not r.attr("count_include_pad", 0)) or r.attr("ceil_mode", 0):
            raise r.unsupported("padding not counted in the average, asymmetric padding or ceil_mode")
        kernel = tuple(r.attr("kernel_shape"))
        op = average_pool(x.shape, kernel, tuple(r.attr("strides", kernel)), (pads[0], pads[1]))
    r.set(r.add(op, [x], op.out_shape))


@handles("BatchNormalization")
def _batchnorm(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    scale, bias, mean, var = (r.const(i).astype(np.float64) for i in r.node.input[1:5])
    a = scale / np.sqrt(var + r.attr("epsilon", 1e-5))
    per_channel = lambda v: np.broadcast_to(v.reshape(-1, *([1] * (len(x.shape) - 1))), x.shape).reshape(-1)  # noqa: E731
    r.set(r.add(Scale(per_channel(a), per_channel(bias - mean * a)), [x], x.shape))


@handles("Flatten")
def _flatten(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    full = r.with_batch(x.shape)
    axis = r.attr("axis", 1)
    axis = axis + len(full) if axis < 0 else axis
    if r.batch and axis != 1:
        raise r.unsupported(f"Flatten over the batch axis (axis={axis})")
    shape = (numel(full[axis:]),) if r.batch else (numel(full[:axis]), numel(full[axis:]))
    r.set(Value(x.node, shape))


@handles("Reshape")
def _reshape(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    full = r.with_batch(x.shape)
    target = _reshape_target(r.const(r.node.input[1]), full, r.attr("allowzero", 0))
    if numel(tuple(target)) != numel(full):
        raise r.unsupported(f"a reshape of {full} to {target}")
    r.set(Value(x.node, r.without_batch(target)))


@handles("Squeeze", "Unsqueeze")
def _squeeze(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    axes = r.const(r.node.input[1]) if len(r.node.input) > 1 and r.node.input[1] else r.attr("axes", None)
    probe = np.empty(r.with_batch(x.shape), dtype=np.int8)
    shape = (np.expand_dims(probe, tuple(int(a) for a in axes)) if r.node.op_type == "Unsqueeze"
             else np.squeeze(probe, None if axes is None else tuple(int(a) for a in axes))).shape
    r.set(Value(x.node, r.without_batch(shape)))


@handles("Transpose")
def _transpose(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    full = r.with_batch(x.shape)
    perm = list(r.attr("perm", list(range(len(full)))[::-1]))
    if r.batch and perm[0] != 0:
        raise r.unsupported(f"a transpose that moves the batch axis (perm {perm})")
    inner = [p - 1 for p in perm[1:]] if r.batch else perm
    index = np.transpose(np.arange(numel(x.shape)).reshape(x.shape), inner)
    r.set(r.add(Permute(index.reshape(-1)), [x], index.shape))


@handles("Concat")
def _concat(r: OnnxReader) -> None:
    xs = [r.var(i) for i in r.node.input]
    axis = r.axis(r.attr("axis"), len(xs[0].shape))
    try:
        op = Concat(tuple(v.shape for v in xs), axis)
    except ValueError as e:
        raise r.unsupported(str(e)) from None
    r.set(r.add(op, xs, op.out_shape))




# ---------------------------------------------------------------------------------------------
# entry points


def from_onnx(model: Any) -> Graph:
    """A Graph from an ONNX path, bytes or ModelProto (one float input, one output)."""
    import onnx

    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    elif isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    return OnnxReader(model).read()


def module_path(onnx_node_name: str) -> str:
    """The torch module an exported ONNX node came from. The exporter names nodes by scope, '/net/net.2/fc/Gemm':
    a child of a Sequential is named by its full path ('net.2'), other children by their attribute ('fc')."""
    parts = [p for p in onnx_node_name.split("/") if p][:-1]
    path = ""
    for p in parts:
        path = p if not path or p.startswith(path + ".") else f"{path}.{p}"
    return path or "(the model itself)"


def from_torch(model: torch.nn.Module, input_shape: Sequence[int]) -> Graph:
    """A Graph from a torch module (eval semantics) through its ONNX export (`pipeline.onnx_io.to_onnx`, fixed batch
    1, opset 20). `input_shape` excludes the batch axis. A module the exporter cannot write, or that exports to an op
    no handler reads, raises UnsupportedModel naming the op and the module path."""
    from pipeline.onnx_io import to_onnx  # the exporter (torch.onnx, onnxsim), imported on first use

    shape = tuple(int(d) for d in input_shape)
    m = copy.deepcopy(model).float().cpu().eval()
    try:
        proto, _ = to_onnx(m, torch.zeros(1, *shape), opset=20, simplify=True, dynamic_batch=False)
    except Exception as e:  # the exporter's own errors are long; the first line says what failed
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UnsupportedModel(f"{type(model).__name__} could not be exported to ONNX for verification: {first[:300]}") from None
    try:
        return from_onnx(proto)
    except UnsupportedModel as e:
        node = getattr(e, "onnx_node", None)
        if node is None:
            raise
        why = getattr(e, "why", "")
        raise UnsupportedModel(f"{type(model).__name__}: unsupported op {node.op_type} in module '{module_path(node.name)}'"
                               f"{': ' + why if why else ''}; the verifier reads {', '.join(readable_ops())}") from None


def read(model: Any, input_shape: Sequence[int] | None = None) -> Graph:
    """A Graph from a Graph, an nn.Module (needs `input_shape`), or an ONNX path/bytes/ModelProto."""
    if isinstance(model, Graph):
        return model
    if isinstance(model, torch.nn.Module):
        if input_shape is None:
            raise ValueError("reading a torch model needs its input_shape (without the batch axis)")
        return from_torch(model, input_shape)
    return from_onnx(model)

