"""Reading models into a `graph.Graph`: ONNX graphs through a table from op type to handler, torch modules
through their ONNX export (so anything the exporter writes in ops listed here can be verified).

The ONNX reader takes one float input (a leading batch axis of 1 or symbolic, or none) and one output, and reads the
graph at batch size 1 with concrete shapes: every tensor keeps its full ONNX shape (the batch axis as 1), so a
Reshape that folds the batch axis into the tokens, a Transpose that moves it, or a Shape → Gather → Equal → Where
chain on the batch size (what nn.MultiheadAttention exports) are read like any other. Constant subgraphs (shape
arithmetic, weights behind Cast/Transpose/DequantizeLinear, masks) are evaluated with numpy (`CONSTANT_OPS`).

A smooth gate is read from the ops its module exports to: λ-GELU = GELU(λx)/λ is Mul → Gelu → Div (folded back into
one Gate with its λ), x·σ(λx) is Mul → Sigmoid → Mul, SERF's x·erf(softplus(λx)) is Mul → Softplus → Erf → Mul, Mish
Softplus → Tanh → Mul, GELU written with Erf (Div by √2, Erf, Add 1, Mul by x, Mul by ½) one Gate x·Φ(λx). Any other
Sigmoid, Tanh, Softplus, Elu, Selu, Softsign or Erf, anywhere (a gate's chain that no Mul by x takes included), is
the activation itself (`smooth.Smooth`).
A transformer's ops become the `nonlinear` ops: Softmax as exp and reciprocal (softmax_i = 1/Σ_j exp(x_j − x_i)),
LayerNormalization as centring, its variance (`Variance`, bounded from the input's box as a whole), Rsqrt and a Product, a MatMul of two variables as `BatchMatMul`, a Mul
or Div of two variables as `Product` (with `Reciprocal` for the divisor), Sqrt/Exp/Reciprocal/Pow as they are.
Data movement on a variable (Gather, Slice, Split, Expand, Tile, Where on a constant condition, Concat with constant
inputs such as a class token) becomes `Select`/`Concat`; ReduceMean/ReduceSum a `Pool`; a MatMul by a constant on
tokens a `TokenLinear`. MaxPool (and GlobalMaxPool) is each window's max as a balanced tree of max(a, b) = a + ReLU(b − a)
(`_max_tree`): exact, and ReLUs, which CROWN relaxes, branch and bound splits and the MILP encodes.

An int8 QDQ graph (`quantized` says which execution the reading covers) is read by the same handlers; the reader then
also follows, for every float32 value between a DequantizeLinear and the next QuantizeLinear, how far onnxruntime's
float32 value may be from the graph's exact one (`Float`), so a QuantizeLinear of a residual Add, a BatchNorm, a
ReLU or an average is read as a rounding of that value like one of a Gemm or a Conv. The input's own normalization
(Mul/Add by constants before the first QuantizeLinear) is folded into the first quantization, which stays exact.

What is not read raises `UnsupportedModel`, one line: "unsupported ONNX op X (node N); the verifier reads …" for an
op type no handler reads, "X (node N) is not read: <the form met>; <the fix>" for a handled op in a form it does not
take, with the node, the op, the form and the fix as the exception's fields. For a torch module the message names
the module path. `supported_ops()` is the engine's own list.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline import gates
from pipeline.gates import GateFamily
from pipeline.numerics import U

from .floats import Float, batchnorm_float, follow, layer_norm_float, matmul_float, softmax_float
from .graph import Graph, Node
from .ops.affine import Conv, Linear, Scale, Sum, TokenLinear
from .ops.base import Op, UnsupportedModel, as_tensor, numel
from .ops.curves import Exp, Reciprocal, Rsqrt, Sqrt, Square
from .ops.gates import Gate
from .ops.norm import Variance
from .ops.pooling import PairMax, Pool, average_pool
from .ops.products import BatchMatMul, Product
from .ops.relu import ReLU
from .ops.rounding import QuantizedInput, Rounding
from .ops.shape import Concat, Permute, Select
from .ops.smooth import SELU_ALPHA, SELU_GAMMA, Smooth
from .ops.softmax import ExpSums

WEIGHT_RANGE = (-64, 64)  # 7-bit weights as reduce_range makes them: a pair of products 2·255·64 = 32640 fits int16 (`quantized`)


@dataclass
class Value:
    """A variable tensor: the graph node that computes it, its full ONNX shape (the batch axis as 1), and in an int8
    graph what is known of onnxruntime's float32 value of it (`Float`; None: not followed)."""

    node: int
    shape: tuple[int, ...]
    fl: Float | None = field(default=None, repr=False)


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
        self.vals: dict[str, Value | Pending | QValue] = {}
        self.nodes: list[Node] = [Node(None, (), "input")]
        inputs = [i for i in self.graph.input if i.name not in self.consts]
        if len(inputs) != 1 or len(self.graph.output) != 1:
            raise UnsupportedModel(f"the graph has {len(inputs)} inputs and {len(self.graph.output)} outputs; one of each is supported",
                                   what=f"{len(inputs)} inputs and {len(self.graph.output)} outputs")
        elem = inputs[0].type.tensor_type.elem_type
        if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
            kind = onnx.TensorProto.DataType.Name(elem).lower()
            raise UnsupportedModel(f"the graph's input '{inputs[0].name}' is {kind} (token ids or indices): the verifier's "
                                   "properties are boxes over a float input; verify the model from its embedding on "
                                   "(a module that takes the embedded tokens as its input)",
                                   what=f"an integer input ({kind}: token ids or indices)",
                                   fix="verify the model from its embedding on (a module that takes the embedded tokens as its input)")
        dims = [d.dim_value if d.dim_value > 0 else 1 for d in inputs[0].type.tensor_type.shape.dim]
        if not dims:
            raise UnsupportedModel("the graph input has no shape", what="an input without a shape")
        # the batch axis: a leading 1 (fixed or symbolic); a graph without one takes a single flat input
        self.batch = len(dims) > 1 and dims[0] == 1
        self.input_shape = tuple(dims[1:]) if self.batch else tuple(dims)
        self.int8 = any(n.op_type == "QuantizeLinear" for n in self.graph.node)
        n_in = numel(tuple(dims))
        inf = np.full(n_in, np.inf)
        start = Float(np.zeros(n_in), -inf, inf, (np.ones(n_in), np.zeros(n_in), 0)) if self.int8 else None
        self.vals[inputs[0].name] = Value(0, tuple(dims), start)
        self.node: Any = None  # the ONNX node being read (for messages)
        # int8 QDQ graphs (`quantized`): scales of dequantized constants by tensor name, the grid of each dequantized
        # node, and per affine node what its runtime rounding depends on (weight scales, an int32 bias)
        self.const_scales: dict[str, np.ndarray] = {}
        self.grids: dict[int, Grid] = {}
        self.affine_info: dict[int, dict[str, Any]] = {}
        self.wide_weights: set[str] = set()  # 8-bit weights: outside what `quantized` covers
        self.sixteen_bit = False  # a 16-bit grid seen (`quantize.activation_type` "int16")
        self.chains: dict[str, list[tuple[str, ...]]] = {}  # the gate patterns of two or more ops, by their first op
        for ops in gate_patterns():
            if len(ops) > 1:
                self.chains.setdefault(ops[0], []).append(ops)

    # -- building -----------------------------------------------------------------------------
    def add(self, op: Op, inputs: Sequence[Value], shape: Sequence[int], flops: int | None = None) -> Value:
        """A node applying `op` to `inputs`; in an int8 graph its `Float` follows from theirs (`_follow`), with `flops`
        float32 operations per output for an elementwise op (None: the op's own count)."""
        self.nodes.append(Node(op, tuple(v.node for v in inputs), self.node.name if self.node is not None else ""))
        out = Value(len(self.nodes) - 1, tuple(int(d) for d in shape))
        if self.int8:
            out.fl = _follow(self, op, inputs, flops)
        return out

    def set(self, value: Value | Pending | QValue, index: int = 0) -> None:
        self.vals[self.node.output[index]] = value

    # -- reading inputs -----------------------------------------------------------------------
    def is_const(self, name: str) -> bool:
        return name in self.consts

    def const(self, name: str) -> np.ndarray:
        if name not in self.consts:
            raise self.unsupported(f"input {name!r} is a variable where a constant is read", what="a variable input where a constant is read")
        return self.consts[name]

    def var(self, name: str) -> Value:
        v = self.vals.get(name)
        if isinstance(v, Pending):
            v = self.vals[name] = self.standalone(v)
        if isinstance(v, QValue):
            raise self.unsupported(f"it reads the integer tensor {name!r}; the reader takes integer tensors only into the "
                                   "DequantizeLinear of their own QuantizeLinear", what="an integer tensor read by a float op")
        if v is None:
            raise self.unsupported(f"input {name!r} is not computed before it", what="an input computed later")
        return v

    def standalone(self, pend: Pending) -> Value:
        """A gate's inner chain read by something other than its gate (a plain sigmoid layer, softplus then a Gemm): each
        op of the chain as the activation it is (`smooth.Smooth`, or its own curve)."""
        x = pend.arg
        for op in pend.ops:
            if op not in STANDALONE:
                raise self.unsupported(f"its input comes from {op} ({_where(pend.onnx_node)}), which is read only as a part "
                                       "of a gate x·g(λx)", what=f"a {op} outside a gate x·g(λx)")
            x = STANDALONE[op](self, x, pend.onnx_node)
        return x

    def attr(self, name: str, default: Any = None) -> Any:
        for a in self.node.attribute:
            if a.name == name:
                return self.onnx.helper.get_attribute_value(a)
        return default

    def axis(self, a: int, rank: int) -> int:
        a = int(a)
        a = a + rank if a < 0 else a
        if not 0 <= a < rank:
            raise self.unsupported(f"axis {a} of a rank-{rank} tensor", what=f"axis {a} of a rank-{rank} tensor")
        return a

    def expand(self, v: Value, shape: tuple[int, ...]) -> Value:
        """`v` broadcast to `shape` (numpy's rules): itself, or a `Select` that repeats its units."""
        shape = tuple(int(d) for d in shape)
        if v.shape == shape:
            return v
        try:
            index = np.broadcast_to(np.arange(numel(v.shape)).reshape(v.shape), shape)
        except ValueError:
            raise self.unsupported(f"a tensor of shape {v.shape} does not broadcast to {shape}",
                                   what=f"shapes {v.shape} and {shape} that do not broadcast") from None
        return self.add(Select(index.reshape(-1), numel(v.shape)), [v], shape)

    def unsupported(self, why: str = "", where: Any = None, what: str | None = None, fix: str | None = None) -> UnsupportedModel:
        """A handled op in a form it does not read: "X (node N) is not read: why[; fix]" with its fields."""
        node = where if where is not None else self.node
        msg = f"{node.op_type} ({_where(node)}) is not read: {why}" + (f"; {fix}" if fix else "")
        e = UnsupportedModel(msg, node=node.name or None, op=node.op_type, what=what or why, fix=fix)
        e.onnx_node, e.why = node, why + (f"; {fix}" if fix else "")  # type: ignore[attr-defined]
        return e

    def unknown_op(self) -> UnsupportedModel:
        node = self.node
        e = UnsupportedModel(f"unsupported ONNX op {node.op_type} ({_where(node)}); the verifier reads {', '.join(readable_ops())}",
                             node=node.name or None, op=node.op_type, what=f"the op {node.op_type}",
                             fix=f"replace it by ops the verifier reads ({', '.join(readable_ops())})")
        e.onnx_node, e.why = node, ""  # type: ignore[attr-defined]
        return e

    # -- the walk -----------------------------------------------------------------------------
    def _starts_gate(self, node: Any) -> bool:
        """Whether `node` begins the op chain of a gate pattern of two or more ops (Exp → Tanh), each next op the only
        reader of the one before: an op with a handler of its own (Exp) is then a part of the gate."""
        for ops in self.chains.get(node.op_type, ()):
            cur = node
            for op in ops[1:]:
                nxt = [n for n in self.graph.node if cur.output[0] in n.input]
                if len(nxt) != 1 or nxt[0].op_type != op:
                    break
                cur = nxt[0]
            else:
                return True
        return False

    def read(self) -> Graph:
        for node in self.graph.node:
            self.node = node
            if node.op_type == "Constant":
                self.consts[node.output[0]] = _constant(self, node)
                continue
            if all(i in self.consts or i == "" for i in node.input) and node.op_type in CONSTANT_OPS:
                for k, v in enumerate(CONSTANT_OPS[node.op_type](self, [self.consts.get(i) if i else None for i in node.input])):
                    self.consts[node.output[k]] = np.asarray(v)
                continue
            handler = HANDLERS.get(node.op_type)
            gate = _gate_handler(node.op_type)
            # an op of a gate's chain is read as one (a plain activation where no gate takes it), unless it has a handler
            # of its own (Exp) and begins no chain here
            if gate is not None and (handler in (None, _standalone) or (node.op_type in self.chains and self._starts_gate(node))):
                handler = gate
            if handler is None:
                raise self.unknown_op()
            handler(self)
        self.node = None
        out = self.vals.get(self.graph.output[0].name)
        if isinstance(out, Value) and out.node in self.grids and not isinstance(self.nodes[out.node].op, QuantizedInput):
            # the output's DequantizeLinear runs in float32: one rounding, relative 2⁻²⁴, of a value within the grid's range
            g = self.grids[out.node]
            E = U * torch.maximum(g.lo.abs(), g.hi.abs()).numpy()
            out = self.add(Rounding(E, None, source=self.graph.output[0].name), [out], out.shape)
        if isinstance(out, Pending):
            out = self.standalone(out)
        if not isinstance(out, Value):
            raise UnsupportedModel("the graph output is not computed from its input", what="an output that is a constant")
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
    raise r.unsupported("a Constant without a tensor value", what="a Constant without a tensor value")


# ---------------------------------------------------------------------------------------------
# constant folding (numpy)

def _reshape_target(target: np.ndarray, shape: tuple[int, ...], allowzero: int) -> list[int]:
    t = [int(d) for d in target]
    t = [shape[i] if d == 0 and not allowzero else d for i, d in enumerate(t)]
    if -1 in t:
        known = int(np.prod([d for d in t if d != -1]))
        t[t.index(-1)] = numel(shape) // max(known, 1)
    return t


def _slice_index(x: np.ndarray, starts, ends, axes=None, steps=None) -> np.ndarray:
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    idx = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = int(a) + x.ndim if int(a) < 0 else int(a)
        idx[a] = slice(int(s), int(e), int(st))
    return x[tuple(idx)]


def _axes(r: OnnxReader, args: list[Any], rank: int, index: int = 1) -> tuple[int, ...] | None:
    """The axes of a Reduce/Squeeze/Unsqueeze node: its input `index` (opset ≥ 13/18) or its `axes` attribute."""
    a = args[index] if len(args) > index and args[index] is not None else r.attr("axes", None)
    return None if a is None else tuple(int(v) + rank if int(v) < 0 else int(v) for v in np.asarray(a).reshape(-1))


def _split_sizes(r: OnnxReader, args: list[Any], dim: int) -> list[int]:
    if len(args) > 1 and args[1] is not None:
        return [int(v) for v in np.asarray(args[1]).reshape(-1)]
    if r.attr("split", None) is not None:
        return [int(v) for v in r.attr("split")]
    n = r.attr("num_outputs", None) or len(r.node.output)
    step = -(-dim // n)
    return [min(step, dim - k * step) for k in range(n)]


def _split(r: OnnxReader, args: list[Any]) -> list[np.ndarray]:
    x = args[0]
    axis = int(r.attr("axis", 0))
    sizes = _split_sizes(r, args, x.shape[axis])
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


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


def _softmax_np(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _reduce(fn):
    def run(r: OnnxReader, a: list[Any]) -> list[np.ndarray]:
        axes = _axes(r, a, np.ndim(a[0]))
        if axes is None and r.attr("noop_with_empty_axes", 0):
            return [a[0]]
        return [fn(a[0], axis=axes, keepdims=bool(r.attr("keepdims", 1)))]
    return run


CONSTANT_OPS: dict[str, Callable[[OnnxReader, list[Any]], list[np.ndarray]]] = {
    "Identity": lambda r, a: [a[0]],
    "Cast": lambda r, a: [a[0].astype({1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64}
                                      .get(r.attr("to"), a[0].dtype))],
    "Reshape": lambda r, a: [a[0].reshape(_reshape_target(a[1], a[0].shape, r.attr("allowzero", 0)))],
    "Transpose": lambda r, a: [np.transpose(a[0], r.attr("perm", None))],
    "Unsqueeze": lambda r, a: [np.expand_dims(a[0], tuple(sorted(_axes(r, a, np.ndim(a[0]) + len(np.asarray(a[1] if len(a) > 1 and a[1] is not None else r.attr("axes")).reshape(-1))))))],
    "Squeeze": lambda r, a: [np.squeeze(a[0], _axes(r, a, np.ndim(a[0])))],
    "Concat": lambda r, a: [np.concatenate(a, axis=r.attr("axis"))],
    "Gather": lambda r, a: [np.take(a[0], a[1], axis=r.attr("axis", 0))],
    "Slice": lambda r, a: [_slice_index(a[0], *[v for v in a[1:]])],
    "Split": _split,
    "Add": lambda r, a: [a[0] + a[1]],
    "Sub": lambda r, a: [a[0] - a[1]],
    "Mul": lambda r, a: [a[0] * a[1]],
    "Div": lambda r, a: [a[0] / a[1] if np.issubdtype(np.asarray(a[0]).dtype, np.floating) else a[0] // a[1]],
    "Neg": lambda r, a: [-a[0]],
    "Abs": lambda r, a: [np.abs(a[0])],
    "Sqrt": lambda r, a: [np.sqrt(a[0])],
    "Exp": lambda r, a: [np.exp(a[0])],
    "Reciprocal": lambda r, a: [1 / a[0]],
    "Pow": lambda r, a: [np.power(a[0], a[1])],
    "Relu": lambda r, a: [np.maximum(a[0], 0)],
    "Softmax": lambda r, a: [_softmax_np(a[0], r.attr("axis", -1))],
    "Flatten": lambda r, a: [a[0].reshape(int(np.prod(a[0].shape[:r.attr("axis", 1)])), -1)],
    "Shape": lambda r, a: [np.array(np.shape(a[0]), dtype=np.int64)],
    "Size": lambda r, a: [np.array(np.size(a[0]), dtype=np.int64)],
    "Equal": lambda r, a: [np.equal(a[0], a[1])],
    "Less": lambda r, a: [np.less(a[0], a[1])],
    "LessOrEqual": lambda r, a: [np.less_equal(a[0], a[1])],
    "Greater": lambda r, a: [np.greater(a[0], a[1])],
    "GreaterOrEqual": lambda r, a: [np.greater_equal(a[0], a[1])],
    "Not": lambda r, a: [np.logical_not(a[0])],
    "And": lambda r, a: [np.logical_and(a[0], a[1])],
    "Or": lambda r, a: [np.logical_or(a[0], a[1])],
    "Where": lambda r, a: [np.where(a[0], a[1], a[2])],
    "Max": lambda r, a: [np.maximum.reduce(a)],
    "Min": lambda r, a: [np.minimum.reduce(a)],
    "Expand": lambda r, a: [a[0] * np.ones([int(d) for d in a[1]], dtype=a[0].dtype)],
    "Tile": lambda r, a: [np.tile(a[0], [int(d) for d in a[1]])],
    "Range": lambda r, a: [np.arange(a[0], a[1], a[2])],
    "ConstantOfShape": lambda r, a: [np.full([int(d) for d in a[0]], _constant_of_shape_value(r))],
    "Trilu": lambda r, a: [(np.triu if r.attr("upper", 1) else np.tril)(a[0], int(a[1]) if len(a) > 1 and a[1] is not None else 0)],
    "ReduceMean": _reduce(np.mean),
    "ReduceSum": _reduce(np.sum),
    "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
    "DequantizeLinear": lambda r, a: [_dequantize(r, a)],
}


def _constant_of_shape_value(r: OnnxReader) -> Any:
    from onnx import numpy_helper

    v = r.attr("value", None)
    return numpy_helper.to_array(v).reshape(-1)[0] if v is not None else np.float32(0)


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
        raise r.unsupported("a cast of a variable to a non-float type", what="a cast to a non-float type")
    r.set(r.vals.get(r.node.input[0]) or r.var(r.node.input[0]))


@handles("Shape")
def _shape(r: OnnxReader) -> None:
    shape = np.array(r.var(r.node.input[0]).shape, dtype=np.int64)
    start, end = r.attr("start", 0), r.attr("end", None)
    r.consts[r.node.output[0]] = shape[start:end]


@handles("Size")
def _size(r: OnnxReader) -> None:
    r.consts[r.node.output[0]] = np.array(numel(r.var(r.node.input[0]).shape), dtype=np.int64)


def _on_rows(r: OnnxReader, x: Value, W: np.ndarray, b: np.ndarray, out_shape: tuple[int, ...], terms: int,
             w_scale: np.ndarray | None, int_bias: bool) -> Value:
    """y = W x + b on each row of x (its last axis): a Linear for one row, a TokenLinear for several."""
    rows = numel(x.shape[:-1])
    op = Linear(W, b) if rows == 1 else TokenLinear(W, b, rows)
    out = r.add(op, [x], out_shape)
    if w_scale is not None:
        w_scale = np.tile(np.asarray(w_scale, dtype=np.float64).reshape(-1), rows)
    _record_affine(r, out, x, terms, w_scale, int_bias)
    return out


@handles("Gemm")
def _gemm(r: OnnxReader) -> None:
    a, w = r.node.input[0], r.node.input[1]
    if r.attr("transA", 0) or r.is_const(a) or not r.is_const(w):
        raise r.unsupported("only x·Wᵀ + b with x the variable and W a constant is read",
                            what="a Gemm whose weight is a variable or whose input is transposed")
    x = r.var(a)
    W = r.const(w).astype(np.float64)
    W = W if r.attr("transB", 0) else W.T  # (out, in)
    if len(x.shape) != 2 or x.shape[1] != W.shape[1]:
        raise r.unsupported(f"a Gemm of {W.shape[::-1]} on a tensor of shape {x.shape}", what=f"a Gemm on shape {x.shape}")
    c = r.node.input[2] if len(r.node.input) > 2 else ""
    b = r.const(c).astype(np.float64) if c else np.zeros(W.shape[0])
    bias = r.attr("beta", 1.0) * np.broadcast_to(b, (1, W.shape[0])).ravel()
    ws = r.const_scales.get(w)
    w_scale = None if ws is None else (ws if r.attr("transB", 0) else ws.T).max(1)
    r.set(_on_rows(r, x, r.attr("alpha", 1.0) * W, bias, (x.shape[0], W.shape[0]), W.shape[1], w_scale,
                   bool(c) and c in r.const_scales))


def _record_affine(r: OnnxReader, out: Value, x: Value, terms: int, w_scale: np.ndarray | None, int_bias: bool) -> None:
    """What the runtime's rounding of this affine node depends on, for a QuantizeLinear that may read it."""
    from .quantized import fusable

    g = r.grids.get(x.node)
    wide = len(r.node.input) > 1 and r.node.input[1] in r.wide_weights
    if wide and (g is None or fusable(g.qmin, g.qmax)):  # on a 16-bit input no integer kernel runs it
        raise r.unsupported("its weights are 8-bit: onnxruntime's x86 kernels without VNNI add products in pairs in int16 "
                            "with saturation, so no bound holds", what="int8 weights beyond 7 bits",
                            fix="quantize with quantize.reduce_range=true")
    info = {"input": x.node, "terms": int(terms), "int_bias": int_bias,
            "w_scale": None if w_scale is None else np.asarray(w_scale, dtype=np.float64).reshape(-1)}
    info["bias_step"] = (None if info["w_scale"] is None or int_bias or g is None
                         else float(g.scale.max()) * info["w_scale"])  # the fused kernels round a float bias to int32
    r.affine_info[out.node] = info
    if r.int8 and x.fl is not None:  # its float32 value when no QuantizeLinear follows it directly
        out.fl = follow(r.nodes[out.node].op, [x.fl], None, info if info["w_scale"] is not None else None)


@handles("MatMul")
def _matmul(r: OnnxReader) -> None:
    a, w = r.node.input
    if r.is_const(a) and r.is_const(w):
        return
    if r.is_const(a):
        raise r.unsupported("a constant times a variable (W·x) is not read", what="a MatMul of a constant by a variable",
                            fix="write it as x·Wᵀ (a Linear)")
    x = r.var(a)
    if not r.is_const(w):
        return _matmul_variables(r, x, r.var(w))
    W = r.const(w).astype(np.float64)
    if W.ndim != 2 or len(x.shape) < 1 or x.shape[-1] != W.shape[0]:
        raise r.unsupported(f"only x·W with W a constant 2-d matrix is read (x {x.shape}, W {W.shape})",
                            what=f"a MatMul of shape {x.shape} by a constant of shape {W.shape}")
    ws = r.const_scales.get(w)
    r.set(_on_rows(r, x, W.T, np.zeros(W.shape[1]), x.shape[:-1] + (W.shape[1],), W.shape[0],
                   None if ws is None else ws.max(0), False))


def _matmul_variables(r: OnnxReader, x: Value, y: Value) -> None:
    """A @ B of two variables (attention's q·kᵀ and p·v): `BatchMatMul` over their broadcast batch axes."""
    if len(x.shape) < 2 or len(y.shape) < 2 or x.shape[-1] != y.shape[-2]:
        raise r.unsupported(f"a product of variables of shapes {x.shape} and {y.shape}",
                            what=f"a MatMul of variables of shapes {x.shape} and {y.shape}")
    try:
        batch = tuple(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]))
    except ValueError:
        raise r.unsupported(f"batch axes {x.shape[:-2]} and {y.shape[:-2]} do not broadcast",
                            what=f"a MatMul of variables of shapes {x.shape} and {y.shape}") from None
    m, k, n = x.shape[-2], x.shape[-1], y.shape[-1]
    xa, yb = r.expand(x, batch + (m, k)), r.expand(y, batch + (k, n))
    nb = numel(batch)
    cat = r.add(Concat(((numel(xa.shape),), (numel(yb.shape),)), 0), [xa, yb], (numel(xa.shape) + numel(yb.shape),))
    out = r.add(BatchMatMul(nb, m, k, n, source=r.node.name), [cat], batch + (m, n))
    if r.int8:
        out.fl = _follow_matmul(r, xa, yb, nb, m, k, n)
    r.set(out)


def _broadcast(r: OnnxReader, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise r.unsupported(f"shapes {' and '.join(map(str, shapes))} do not broadcast",
                            what=f"operands of shapes {' and '.join(map(str, shapes))}") from None


@handles("Add", "Sub", "Mul", "Div")
def _arith(r: OnnxReader) -> None:
    op = r.node.op_type
    a, b = r.node.input
    if not r.is_const(a) and not r.is_const(b):
        return _two_variables(r, op, a, b)
    var_first = not r.is_const(a)
    x = r.var(a if var_first else b)
    c = np.asarray(r.const(b if var_first else a), dtype=np.float64)
    shape = _broadcast(r, x.shape, c.shape)
    x = r.expand(x, shape)
    c = np.broadcast_to(c, shape).reshape(-1).copy()
    one, zero = np.ones_like(c), np.zeros_like(c)
    if op == "Add":
        scale, shift = one, c
    elif op == "Sub":
        scale, shift = (one, -c) if var_first else (-one, c)
    elif op == "Mul":
        scale, shift = c, zero
    elif var_first:
        scale, shift = 1.0 / c, zero
    else:  # c / x = c·(1/x): a division by the variable, read when it is provably positive on the box
        inv = r.add(Reciprocal(numel(shape), source=r.node.name), [x], shape)
        return r.set(r.add(Scale(c, zero), [inv], shape))
    if op in ("Mul", "Div") and (folded := _fold_gate(r, x, scale)) is not None:
        return r.set(folded)
    r.set(r.add(Scale(scale, shift), [x], shape, flops=2 if op == "Div" else 1))


def _two_variables(r: OnnxReader, op: str, a: str, b: str) -> None:
    if op == "Mul":
        va, vb = r.vals.get(a), r.vals.get(b)
        pend, other = (va, vb) if isinstance(va, Pending) else (vb, va)
        fam = gate_patterns().get(pend.ops) if isinstance(pend, Pending) else None
        if fam is not None and not fam.onnx.whole and isinstance(other, Value):
            lam = _lambda_of(r, pend.arg, other)
            if lam is not None:
                r.set(r.add(Gate(fam.name, lam, source=r.node.name), [other], other.shape))
                return
        if isinstance(va, Value) and isinstance(vb, Value) and (gelu := _erf_gelu(r, va, vb) or _erf_gelu(r, vb, va)):
            return r.set(gelu)
    x, y = r.var(a), r.var(b)
    shape = _broadcast(r, x.shape, y.shape)
    x, y = r.expand(x, shape), r.expand(y, shape)
    n = numel(shape)
    if op in ("Add", "Sub"):
        r.set(r.add(Sum(n, (1.0, 1.0 if op == "Add" else -1.0)), [x, y], shape))
        return
    if op == "Div":  # x / y = x·(1/y) for a divisor provably positive on the box (a norm, a softmax's sum)
        y = r.add(Reciprocal(n, source=r.node.name), [y], shape)
    cat = r.add(Concat(((n,), (n,)), 0), [x, y], (2 * n,))
    out = r.add(Product(n, source=r.node.name), [cat], shape)
    if r.int8:
        out.fl = None  # a float32 product of two variables feeding a QuantizeLinear: not followed (module docstring)
    r.set(out)


def _lambda_of(r: OnnxReader, arg: Value, x: Value) -> np.ndarray | None:
    """λ (per unit) when `arg` is λ·x: x itself (λ = 1), or a Scale node with no shift and λ > 0 on x."""
    if arg.node == x.node and numel(arg.shape) == numel(x.shape):
        return np.ones(numel(x.shape))
    node = r.nodes[arg.node]
    if (isinstance(node.op, Scale) and node.inputs == (x.node,) and bool(torch.all(node.op.shift == 0))
            and bool(torch.all(node.op.scale > 0))):
        return node.op.scale.numpy()
    return None


def _scaled(r: OnnxReader, v: Value) -> tuple[int, np.ndarray, np.ndarray]:
    """(source node, scale, shift) when `v` is a `Scale` of a node (else v itself with scale 1, shift 0)."""
    node = r.nodes[v.node]
    if isinstance(node.op, Scale):
        return node.inputs[0], node.op.scale.numpy(), node.op.shift.numpy()
    n = numel(v.shape)
    return v.node, np.ones(n), np.zeros(n)


def _erf_gelu(r: OnnxReader, p: Value, q: Value) -> Value | None:
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


@handles("Elu", "Selu", "Softsign", "Tanh", "Erf", "Softplus", "Sigmoid")
def _standalone(r: OnnxReader) -> None:
    r.set(STANDALONE[r.node.op_type](r, r.var(r.node.input[0]), r.node))


@handles("Mish")
def _mish(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    r.set(r.add(Gate("mish", np.ones(numel(x.shape)), source=r.node.name), [x], x.shape))


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
    r.set(r.add(Scale(-np.ones(numel(x.shape)), np.zeros(numel(x.shape))), [x], x.shape, flops=0))


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
        raise r.unsupported("a Clip without a lower bound", what="a Clip without a lower bound")
    n = numel(x.shape)
    r.set(_clamp(r, x, np.full(n, lo), None if hi is None else np.full(n, hi)))


def _clamp(r: OnnxReader, x: Value, lo: np.ndarray, hi: np.ndarray | None) -> Value:
    """clamp(x, lo, hi) = lo + ReLU(x − lo) − ReLU(x − hi) per unit: ReLUs, so branch and bound splits it like one."""
    n, one = numel(x.shape), np.ones(numel(x.shape))
    low = r.add(ReLU(n, source=r.node.input[0]), [r.add(Scale(one, -lo), [x], x.shape, flops=0)], x.shape)
    if hi is not None:
        high = r.add(ReLU(n), [r.add(Scale(one, -hi), [x], x.shape, flops=0)], x.shape)
        low = r.add(Sum(n, (1.0, -1.0)), [low, high], x.shape, flops=0)
    return r.add(Scale(one, lo), [low], x.shape, flops=0)


@handles("Sqrt", "Reciprocal", "Exp")
def _curve(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    cls = {"Sqrt": Sqrt, "Reciprocal": Reciprocal, "Exp": Exp}[r.node.op_type]
    out = r.add(cls(numel(x.shape), source=r.node.name), [x], x.shape)
    if r.int8:
        out.fl = None  # exp/sqrt/1/x in float32 before a QuantizeLinear: not followed
    r.set(out)


@handles("Pow")
def _pow(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    p = np.asarray(r.const(r.node.input[1]), dtype=np.float64)
    if p.size != 1 or float(p) not in (2.0, 0.5, -0.5, -1.0, 1.0):
        raise r.unsupported(f"an exponent {p.reshape(-1)[:3].tolist()}; the exponents read are 2, 0.5, -0.5, -1 and 1",
                            what=f"Pow with exponent {p.reshape(-1)[:3].tolist()}")
    p = float(p)
    if p == 1.0:
        return r.set(x)
    cls = {2.0: Square, 0.5: Sqrt, -0.5: Rsqrt, -1.0: Reciprocal}[p]
    out = r.add(cls(numel(x.shape), source=r.node.name), [x], x.shape)
    if r.int8:
        out.fl = None
    r.set(out)


def _softmax_rows(r: OnnxReader, x: Value, rows: int, T: int) -> Value:
    """softmax over the last axis of rows × T values, as 1/Σ_j exp(x_j − x_i) (module docstring), then a Reciprocal.
    The sums: one `ExpSums` op on the logits where the rows·T² differences would be a wide layer, else the differences
    as a layer of their own, an Exp on each and a sum (tighter: `ExpSums.MIN_DIFFS`)."""
    if rows * T * T >= ExpSums.MIN_DIFFS:
        s = r.add(ExpSums(rows, T, source=r.node.name), [x], (rows, T))
    else:
        eye = np.eye(T)
        diff = (eye[None, :, :] - eye[:, None, :]).reshape(T * T, T)  # row (i, j): e_j − e_i (exactly 0 where j = i)
        d = r.add(TokenLinear(diff, np.zeros(T * T), rows), [x], (rows, T * T))
        e = r.add(Exp(rows * T * T, source=r.node.name), [d], (rows, T * T))
        s = r.add(TokenLinear(np.kron(np.eye(T), np.ones((1, T))), np.zeros(T), rows), [e], (rows, T))
    return r.add(Reciprocal(rows * T, source=r.node.name), [s], (rows, T))


def _to_last(r: OnnxReader, x: Value, axis: int) -> tuple[Value, list[int] | None]:
    """x with `axis` moved last (a Permute), and the permutation that undoes it (None: it was last)."""
    rank = len(x.shape)
    if axis == rank - 1:
        return x, None
    perm = [a for a in range(rank) if a != axis] + [axis]
    index = np.transpose(np.arange(numel(x.shape)).reshape(x.shape), perm)
    moved = r.add(Permute(index.reshape(-1)), [x], index.shape)
    return moved, list(np.argsort(perm))


def _permute_back(r: OnnxReader, v: Value, inverse: list[int] | None) -> Value:
    if inverse is None:
        return v
    index = np.transpose(np.arange(numel(v.shape)).reshape(v.shape), inverse)
    return r.add(Permute(index.reshape(-1)), [v], index.shape)


@handles("Softmax")
def _softmax(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    axis = r.axis(r.attr("axis", -1), len(x.shape))
    moved, inverse = _to_last(r, x, axis)
    T = moved.shape[-1]
    p = _softmax_rows(r, moved, numel(moved.shape) // T, T)
    out = _permute_back(r, Value(p.node, moved.shape), inverse)
    out = Value(out.node, x.shape)
    if r.int8:
        out.fl = softmax_float(x.fl, numel(x.shape) // T, T, axis == len(x.shape) - 1)
    r.set(out)


@handles("LayerNormalization")
def _layer_norm(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    if any(o for o in r.node.output[1:]):
        used = {i for n in r.graph.node for i in n.input} | {o.name for o in r.graph.output}
        if any(o in used for o in r.node.output[1:]):
            raise r.unsupported("its Mean or InvStdDev output is read", what="LayerNormalization's second or third output")
    axis = r.axis(r.attr("axis", -1), len(x.shape))
    N, rows = numel(x.shape[axis:]), numel(x.shape[:axis])
    eps = float(r.attr("epsilon", 1e-5))
    gamma = np.broadcast_to(np.asarray(r.const(r.node.input[1]), dtype=np.float64), x.shape[axis:]).reshape(-1)
    bname = r.node.input[2] if len(r.node.input) > 2 else ""
    beta = np.broadcast_to(np.asarray(r.const(bname), dtype=np.float64), x.shape[axis:]).reshape(-1) if bname else np.zeros(N)
    c = r.add(TokenLinear(np.eye(N) - 1.0 / N, np.zeros(N), rows), [x], (rows, N))  # x − mean(x)
    xc = r.add(Concat(((rows * N,), (rows * N,)), 0), [Value(x.node, (rows * N,)), c], (2 * rows * N,))
    var = r.add(Variance(rows, N, eps, source=r.node.name), [xc], (rows,))  # var + ε, from x's box and c's intervals
    inv = r.add(Rsqrt(rows, source=r.node.name), [var], (rows,))
    spread = r.add(Select(np.repeat(np.arange(rows), N), rows), [inv], (rows, N))
    cat = r.add(Concat(((rows * N,), (rows * N,)), 0), [c, spread], (2 * rows * N,))
    z = r.add(Product(rows * N, source=r.node.name), [cat], (rows, N))
    out = r.add(Scale(np.tile(gamma, rows), np.tile(beta, rows)), [z], x.shape)
    if r.int8:
        out = layer_norm_float(r, x, var, out, gamma, beta, N, rows, eps)
    r.set(out)


@handles("ReduceMean", "ReduceSum")
def _reduce_var(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    rank = len(x.shape)
    axes = _axes(r, [None] + [r.consts.get(i) if i else None for i in r.node.input[1:]], rank)
    if axes is None:
        if r.attr("noop_with_empty_axes", 0):
            return r.set(x)
        axes = tuple(range(rank))
    keep = bool(r.attr("keepdims", 1))
    out_full = tuple(1 if a in axes else d for a, d in enumerate(x.shape))
    group = np.broadcast_to(np.arange(numel(out_full)).reshape(out_full), x.shape)
    # each input unit's output: its index with the reduced axes set to 0, in the reduced shape
    idx = np.indices(x.shape)
    for a in axes:
        idx[a] = 0
    group = np.ravel_multi_index(tuple(idx), out_full).reshape(-1)
    count = numel(x.shape) // numel(out_full)
    w = 1.0 / count if r.node.op_type == "ReduceMean" else 1.0
    shape = out_full if keep else tuple(d for a, d in enumerate(x.shape) if a not in axes)
    r.set(r.add(Pool(group, np.full(numel(x.shape), w), numel(out_full)), [x], shape, flops=count))


def _take(r: OnnxReader, x: Value, index: np.ndarray) -> Value:
    """The units `index` (an array of x's flat positions, any shape) of x, shaped like `index`."""
    flat = np.asarray(index).reshape(-1)
    if flat.size == numel(x.shape) and np.array_equal(flat, np.arange(flat.size)):
        return Value(x.node, tuple(np.shape(index)), x.fl)
    return r.add(Select(flat, numel(x.shape)), [x], np.shape(index))


def _positions(x: Value) -> np.ndarray:
    return np.arange(numel(x.shape)).reshape(x.shape)


@handles("Gather")
def _gather(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    if not r.is_const(r.node.input[1]):
        raise r.unsupported("indices that are a variable", what="Gather with variable indices")
    axis = r.axis(r.attr("axis", 0), len(x.shape))
    idx = np.asarray(r.const(r.node.input[1])).astype(np.int64)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    r.set(_take(r, x, np.take(_positions(x), idx, axis=axis)))


@handles("Slice")
def _slice(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    args = [r.const(i) if i else None for i in r.node.input[1:]]
    r.set(_take(r, x, _slice_index(_positions(x), *args)))


@handles("Split")
def _split_var(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    args = [None] + [r.const(i) if i else None for i in r.node.input[1:]]
    for k, part in enumerate(_split(r, [_positions(x)] + args[1:])):
        r.set(_take(r, x, part), k)


@handles("Expand")
def _expand(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    target = tuple(int(d) for d in r.const(r.node.input[1]))
    r.set(r.expand(x, _broadcast(r, x.shape, target)))


@handles("Tile")
def _tile(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    r.set(_take(r, x, np.tile(_positions(x), [int(d) for d in r.const(r.node.input[1])])))


@handles("Where")
def _where_var(r: OnnxReader) -> None:
    cname, a, b = r.node.input
    if not r.is_const(cname):
        raise r.unsupported("a condition that is a variable", what="Where on a variable condition")
    cond = np.asarray(r.const(cname), dtype=bool)
    parts = [r.vals.get(n) if not r.is_const(n) else np.asarray(r.const(n), dtype=np.float64) for n in (a, b)]
    shapes = [p.shape if isinstance(p, Value) else np.shape(p) for p in parts]
    shape = _broadcast(r, cond.shape, *shapes)
    n = numel(shape)
    cond = np.broadcast_to(cond, shape).reshape(-1)
    vals = [r.expand(r.var(name), shape) if not r.is_const(name) else None for name in (a, b)]
    consts = tuple(None if v is not None else np.broadcast_to(p, shape).reshape(-1) for v, p in zip(vals, parts))
    both = r.add(Concat(((n,), (n,)), 0, consts), [v for v in vals if v is not None], (2 * n,))
    r.set(r.add(Select(np.where(cond, np.arange(n), n + np.arange(n)), 2 * n), [both], shape))


# -- int8 QDQ graphs (`quantized` says which execution the reading covers) -------------------------

def _quant_params(r: OnnxReader, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(scale, zero point) per unit of a tensor of `shape`, and the integer range, of a Q/DQ node."""
    import onnx

    from .quantized import INT_RANGES, fusable

    scale = np.asarray(r.const(r.node.input[1]), dtype=np.float64)
    zname = r.node.input[2] if len(r.node.input) > 2 else ""
    if zname:
        zc = r.consts[zname] if zname in r.consts else r.const(zname)
        dtype = onnx.helper.np_dtype_to_tensor_dtype(np.asarray(zc).dtype)
        zero = np.asarray(zc, dtype=np.float64)
    else:  # no zero point: uint8 unless output_dtype says otherwise (opset 21)
        dtype, zero = r.attr("output_dtype", 2) or 2, np.zeros_like(scale)
    if dtype not in INT_RANGES:
        raise r.unsupported("only int8, uint8 and int16 quantization is read", what="a quantization to another integer type",
                            fix="quantize with quantize.activation_type int8, uint8 or int16")
    if scale.size > 1:  # per channel along `axis`
        axis = r.axis(r.attr("axis", 1), len(shape))
        bshape = [1] * len(shape)
        bshape[axis] = scale.size
        scale, zero = scale.reshape(bshape), zero.reshape(bshape)
    full = lambda v: np.broadcast_to(v, shape).reshape(-1).copy()  # noqa: E731
    qmin, qmax = INT_RANGES[dtype]
    r.sixteen_bit |= not fusable(qmin, qmax)
    return full(scale), full(zero), qmin, qmax


@handles("QuantizeLinear")
def _quantize(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    scale, zero, qmin, qmax = _quant_params(r, x.shape)
    r.set(QValue(x, scale, zero, qmin, qmax, r.node))


@handles("DequantizeLinear")
def _dequantize_var(r: OnnxReader) -> None:
    """DequantizeLinear of a QuantizeLinear on the same grid: the pair's relaxation (`quantized` derives it)."""
    from .quantized import exact_error, float_error, fusable, int32_safe, requant_error

    q = r.vals.get(r.node.input[0])
    if not isinstance(q, QValue):
        raise r.unsupported("it dequantizes a variable that no QuantizeLinear made", what="a DequantizeLinear of a float tensor")
    scale, zero, qmin, qmax = _quant_params(r, q.src.shape)
    lo, hi = q.scale * (qmin - q.zero), q.scale * (qmax - q.zero)
    if not Grid(scale, zero, qmin, qmax, as_tensor(lo), as_tensor(hi)).same(q):
        raise r.unsupported("its scale or zero point differs from its QuantizeLinear's",
                            what="a DequantizeLinear on another grid than its QuantizeLinear")
    x = q.src
    grid = r.grids.get(x.node)
    if grid is not None and grid.same(q):  # requantized on its own grid (around a Flatten, a MaxPool): exact
        return r.set(Value(x.node, x.shape, Float(U * np.maximum(np.abs(lo), np.abs(hi)), lo.copy(), hi.copy())))
    op = r.nodes[x.node].op
    chain = x.fl.chain if x.fl is not None else None
    if chain is not None:  # the raw input, through its normalization (elementwise constants) only: exact (`quantized`)
        a, b, ops = chain
        out = r.add(QuantizedInput(q.scale, q.zero, qmin, qmax, source=r.node.input[0], pre_scale=a, pre_shift=b, pre_ops=ops),
                    [Value(0, x.shape)], x.shape)
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
            if fusable(g.qmin, g.qmax) and not int32_safe(op, (g.lo, g.hi), g.scale, info["w_scale"]):
                raise r.unsupported("its integer sum may overflow int32", what="an int32 sum that may overflow")
            E = requant_error(op, (g.lo, g.hi), q.scale, q.zero, info["terms"], step)
        elif x.fl is not None and np.all(np.isfinite(x.fl.err)) and np.all(np.isfinite(x.fl.mag)):
            E = float_error(x.fl, q.scale, q.zero)  # a float32 value onnxruntime computes from dequantized ones
        else:
            what = r.nodes[x.node].name or type(op).__name__
            raise r.unsupported(f"the quantized value comes from {what}, whose float32 rounding is not bounded here "
                                "(it reads the raw input beyond its normalization, or an op whose float32 error is not derived)",
                                what=f"a quantization of {type(op).__name__} output ({what})")
        noisy = r.add(Rounding(E, q.scale, source=r.node.input[0]), [x], x.shape)
        out = _clamp(r, noisy, lo, hi)
    r.grids[out.node] = Grid(q.scale, q.zero, qmin, qmax, as_tensor(lo), as_tensor(hi))
    # the dequantized value: a grid point in [lo, hi]; onnxruntime's float32 DequantizeLinear rounds it once
    r.set(Value(out.node, x.shape, Float(U * np.maximum(np.abs(lo), np.abs(hi)), lo.copy(), hi.copy()) if r.int8 else None))


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
    if not any(p[:len(ops)] == ops for p in patterns) and op in STANDALONE:
        return r.set(STANDALONE[op](r, r.var(r.node.input[0]), r.node))
    if not any(p[:len(ops)] == ops for p in patterns):
        known = "; ".join(" → ".join(p) for p in patterns)
        raise r.unsupported(f"{op} is read only as a part of a gate x·g(λx) ({known})",
                            what=f"a {op} outside a gate x·g(λx)")
    fam = patterns.get(ops)
    if fam is not None and fam.onnx.whole:
        approximate = r.attr("approximate", "none")
        if approximate not in ("none", b"none"):
            form = approximate.decode() if isinstance(approximate, bytes) else approximate
            raise r.unsupported(f"the {form} approximation of {op.upper()}", what=f"{op} with approximate='{form}'",
                                fix="use the exact form (nn.GELU())")
        return r.set(r.add(Gate(fam.name, np.ones(numel(arg.shape)), source=r.node.name), [arg], arg.shape))
    r.set(Pending(ops, arg, r.node))


def _image(r: OnnxReader, x: Value, what: str) -> tuple[int, int, int]:
    if len(x.shape) != 4 or x.shape[0] != 1:
        raise r.unsupported(f"a 2-d {what} on a tensor of shape {x.shape}", what=f"a {what} on shape {x.shape}")
    return x.shape[1:]


@handles("Conv")
def _conv(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    in_shape = _image(r, x, "Conv")
    w = r.const(r.node.input[1]).astype(np.float64)
    if w.ndim != 4:
        raise r.unsupported("only 2-d convolutions are read", what=f"a {w.ndim - 2}-d convolution")
    b = r.const(r.node.input[2]).astype(np.float64) if len(r.node.input) > 2 and r.node.input[2] else np.zeros(w.shape[0])
    pads = list(r.attr("pads", [0, 0, 0, 0]))
    if r.attr("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or pads[0] != pads[2] or pads[1] != pads[3]:
        raise r.unsupported("auto_pad or asymmetric padding", what="a Conv with auto_pad or asymmetric padding")
    conv = Conv(w, b, in_shape, tuple(r.attr("strides", [1, 1])), (pads[0], pads[1]), tuple(r.attr("dilations", [1, 1])),
                r.attr("group", 1))
    out = r.add(conv, [x], (1,) + conv.out_shape)
    ws = r.const_scales.get(r.node.input[1])
    per_unit = None if ws is None else np.repeat(ws.reshape(ws.shape[0], -1).max(1), numel(conv.out_shape[1:]))
    bias_name = r.node.input[2] if len(r.node.input) > 2 else ""
    _record_affine(r, out, x, numel(w.shape[1:]), per_unit, bool(bias_name) and bias_name in r.const_scales)
    r.set(out)


@handles("AveragePool", "GlobalAveragePool")
def _avgpool(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    in_shape = _image(r, x, "pooling")
    if r.node.op_type == "GlobalAveragePool":
        op = average_pool(in_shape, in_shape[1:], (1, 1))
    else:
        pads = list(r.attr("pads", [0, 0, 0, 0]))
        if pads[0] != pads[2] or pads[1] != pads[3] or (any(pads) and not r.attr("count_include_pad", 0)) or r.attr("ceil_mode", 0):
            raise r.unsupported("padding not counted in the average, asymmetric padding or ceil_mode",
                                what="an AveragePool with padding outside the average, asymmetric padding or ceil_mode",
                                fix="use count_include_pad=True and symmetric padding")
        kernel = tuple(r.attr("kernel_shape"))
        op = average_pool(in_shape, kernel, tuple(r.attr("strides", kernel)), (pads[0], pads[1]))
    r.set(r.add(op, [x], (1,) + op.out_shape))


@handles("MaxPool", "GlobalMaxPool")
def _maxpool(r: OnnxReader) -> None:
    """The max of each window (padded positions, −inf in ONNX, left out) as a tree of ReLUs (`_max_tree`)."""
    x = r.var(r.node.input[0])
    c, h, w = _image(r, x, "MaxPool")
    if len(r.node.output) > 1 and r.node.output[1]:
        raise r.unsupported("its Indices output is read", what="a MaxPool whose Indices output is used",
                            fix="use the pooled values only (return_indices=False)")
    if r.node.op_type == "GlobalMaxPool":
        kernel, strides, pads, dil = (h, w), (1, 1), (0, 0, 0, 0), (1, 1)
    else:
        kernel = tuple(int(k) for k in r.attr("kernel_shape"))
        strides = tuple(int(v) for v in r.attr("strides", [1, 1]))
        pads = tuple(int(v) for v in r.attr("pads", [0, 0, 0, 0]))
        dil = tuple(int(v) for v in r.attr("dilations", [1, 1]))
        auto_pad = r.attr("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if r.attr("ceil_mode", 0) or auto_pad not in ("NOTSET", "VALID"):
            form = "ceil_mode=1" if r.attr("ceil_mode", 0) else f"auto_pad={auto_pad}"
            raise r.unsupported(f"{form}", what=f"a MaxPool with {form}",
                                fix="use explicit pads and ceil_mode=False (nn.MaxPool2d(k, s, padding=p))")
    windows = pool_windows((c, h, w), kernel, strides, pads, dil)
    if windows is None:
        raise r.unsupported(f"a window with no element of the input (kernel {kernel}, pads {pads})",
                            what="a MaxPool window wholly in the padding")
    out_shape = (1, c, *windows.shape[1:3])
    out = _max_tree(r, x, windows.reshape(-1, windows.shape[-1]), out_shape)
    if r.int8 and x.fl is not None:
        # float32 max is exact: the window's largest error and the range of its max
        out.fl = Float(*(_window_max(v, windows) for v in (x.fl.err, x.fl.lo, x.fl.hi)))
    grid, flat = r.grids.get(x.node), windows.reshape(-1, windows.shape[-1])
    first = flat.max(1)  # an element of each window
    same = lambda v: bool(np.all((flat < 0) | (v[np.maximum(flat, 0)] == v[first, None])))  # noqa: E731
    if grid is not None and same(grid.scale) and same(grid.zero):
        # maxima of a grid's points are points of it: a requantization on the same grid is exact
        lo, hi = (as_tensor(_window_max(t.numpy(), windows)) for t in (grid.lo, grid.hi))
        r.grids[out.node] = Grid(grid.scale[first], grid.zero[first], grid.qmin, grid.qmax, lo, hi)
    r.set(out)


def pool_windows(in_shape: tuple[int, int, int], kernel: tuple[int, int], stride: tuple[int, int],
                 pads: tuple[int, int, int, int], dilation: tuple[int, int]) -> np.ndarray | None:
    """[C, Ho, Wo, kh·kw] flat input positions of each pooling window (pads: top, left, bottom, right); −1 where the
    window lies in the padding. None when some window lies wholly in it."""
    c, h, w = in_shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    ho = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (w + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    if ho < 1 or wo < 1:
        return None
    rows = np.arange(ho)[:, None] * sh - pads[0] + np.arange(kh)[None, :] * dh  # [Ho, kh]
    cols = np.arange(wo)[:, None] * sw - pads[1] + np.arange(kw)[None, :] * dw  # [Wo, kw]
    R, C = rows[:, None, :, None], cols[None, :, None, :]  # [Ho, 1, kh, 1], [1, Wo, 1, kw]
    ok = (R >= 0) & (R < h) & (C >= 0) & (C < w)
    pos = np.where(ok, R * w + C, -1).reshape(ho, wo, kh * kw)
    if not np.all((pos >= 0).any(-1)):
        return None
    chan = np.arange(c)[:, None, None, None] * (h * w)
    return np.where(pos[None] >= 0, pos[None] + chan, -1)


def _window_max(v: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Per window (rows of `windows`, −1 left out), the max of v over it."""
    flat = windows.reshape(-1, windows.shape[-1])
    return np.where(flat >= 0, np.asarray(v)[np.maximum(flat, 0)], -np.inf).max(1)


def _max_tree(r: OnnxReader, x: Value, windows: np.ndarray, shape: tuple[int, ...]) -> Value:
    """max over each row of `windows` (flat positions of x; −1: none) as a balanced tree of max(a, b) = a + ReLU(b − a),
    ⌈log2 n⌉ levels for n elements: per level a `Pool` of the pairs' differences b − a, their ReLUs, and a `PairMax`
    a + ReLU(b − a) per pair (an odd element carried). Exact, and made of ReLUs: CROWN relaxes each pairwise max by the
    ReLU's triangle (α-CROWN's lower slope picks any mix of a and b), branch and bound splits them, the MILP encodes
    them exactly; `PairMax` keeps interval arithmetic and the swap gap at the max's own [max l, max u] and max δ."""
    slots = [[int(p) for p in row if p >= 0] for row in windows]  # per output, its elements' positions in `cur`
    cur, n = x, numel(x.shape)
    while any(len(s) > 1 for s in slots):
        first, other, nxt = [], [], []  # per output of the level, in window order: a and b (−1: a carried)
        for s in slots:
            nxt.append(list(range(len(first), len(first) + (len(s) + 1) // 2)))
            first += s[0::2]
            other += s[1::2] + ([-1] if len(s) % 2 else [])
        a, b = np.array(first), np.array(other)
        pa, pb = a[b >= 0], b[b >= 0]
        p = pa.size
        diff = r.add(Pool(np.repeat(np.arange(p), 2), np.tile([1.0, -1.0], p), p, np.stack([pb, pa], 1).reshape(-1), n), [cur], (p,))
        both = r.add(Concat(((n,), (p,)), 0), [cur, r.add(ReLU(p), [diff], (p,))], (n + p,))
        cur = r.add(PairMax.of(a, b, n), [both], (a.size,))
        n, slots = a.size, nxt
    last = np.array([s[0] for s in slots], dtype=np.int64)
    if np.array_equal(last, np.arange(n)):
        return Value(cur.node, tuple(shape), cur.fl)
    return r.add(Select(last, n), [cur], shape)  # a 1×1 window: the elements themselves


@handles("BatchNormalization")
def _batchnorm(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    scale, bias, mean, var = (r.const(i).astype(np.float64) for i in r.node.input[1:5])
    a = scale / np.sqrt(var + r.attr("epsilon", 1e-5))
    per_channel = lambda v: np.broadcast_to(v.reshape(-1, *([1] * (len(x.shape) - 2))), x.shape).reshape(-1)  # noqa: E731
    out = r.add(Scale(per_channel(a), per_channel(bias - mean * a)), [x], x.shape, flops=0)
    if r.int8:
        out.fl = batchnorm_float(x.fl, per_channel(a), per_channel(mean), per_channel(bias))
    r.set(out)


@handles("Flatten")
def _flatten(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    axis = r.attr("axis", 1)
    axis = axis + len(x.shape) if axis < 0 else axis
    r.set(Value(x.node, (numel(x.shape[:axis]), numel(x.shape[axis:])), x.fl))


@handles("Reshape")
def _reshape(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    target = _reshape_target(r.const(r.node.input[1]), x.shape, r.attr("allowzero", 0))
    if numel(tuple(target)) != numel(x.shape):
        raise r.unsupported(f"a reshape of {x.shape} to {target}", what=f"a reshape of {x.shape} to {target}")
    r.set(Value(x.node, tuple(target), x.fl))


@handles("Squeeze", "Unsqueeze")
def _squeeze(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    axes = r.const(r.node.input[1]) if len(r.node.input) > 1 and r.node.input[1] else r.attr("axes", None)
    probe = np.empty(x.shape, dtype=np.int8)
    if r.node.op_type == "Unsqueeze":
        rank = len(x.shape) + len(np.asarray(axes).reshape(-1))
        shape = np.expand_dims(probe, tuple(sorted(int(a) + rank if int(a) < 0 else int(a) for a in np.asarray(axes).reshape(-1)))).shape
    else:
        shape = np.squeeze(probe, None if axes is None else tuple(int(a) for a in np.asarray(axes).reshape(-1))).shape
    r.set(Value(x.node, tuple(shape), x.fl))


@handles("Transpose")
def _transpose(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    perm = list(r.attr("perm", list(range(len(x.shape)))[::-1]))
    index = np.transpose(_positions(x), perm)
    moved = [d for d in range(len(perm)) if x.shape[perm[d]] > 1]
    if [perm[d] for d in moved] == sorted(perm[d] for d in moved):  # only axes of size 1 move: the same order of units
        return r.set(Value(x.node, index.shape, x.fl))
    r.set(r.add(Permute(index.reshape(-1)), [x], index.shape))


@handles("Concat")
def _concat(r: OnnxReader) -> None:
    names = list(r.node.input)
    parts = [np.asarray(r.const(n), dtype=np.float64) if r.is_const(n) else r.var(n) for n in names]
    shapes = [p.shape if isinstance(p, Value) else np.shape(p) for p in parts]
    axis = r.axis(r.attr("axis"), len(shapes[0]))
    consts = tuple(None if isinstance(p, Value) else p for p in parts)
    try:
        op = Concat(tuple(shapes), axis, consts)
    except ValueError as e:
        raise r.unsupported(str(e), what=f"a Concat of shapes {shapes}") from None
    r.set(r.add(op, [p for p in parts if isinstance(p, Value)], op.out_shape))




def supported_ops() -> dict[str, str]:
    """The ONNX op types the reader reads on a variable (the engine's own list: the handlers' and the gate families'
    patterns, `readable_ops`), each with the form it takes; any op also folds when all its inputs are constants
    (`CONSTANT_OPS`)."""
    forms = {
        "Gemm": "x·Wᵀ + b, W constant", "MatMul": "x·W with W constant, or a product of two variables",
        "Add": "a constant or another variable (broadcast)", "Sub": "a constant or another variable (broadcast)",
        "Mul": "a constant, another variable, or a gate x·g(λx)", "Div": "by a constant or a variable provably positive on the box",
        "Conv": "2-d, symmetric padding", "AveragePool": "symmetric padding counted in the average",
        "MaxPool": "2-d, explicit pads, ceil_mode=False (a tree of ReLUs)", "GlobalMaxPool": "2-d (a tree of ReLUs)",
        "Concat": "variables and constants", "Where": "a constant condition", "Gather": "constant indices",
        "Pow": "exponents 2, 0.5, -0.5, -1, 1", "Softmax": "any axis", "LayerNormalization": "its first output",
        "QuantizeLinear": "int8/uint8, read with its DequantizeLinear", "DequantizeLinear": "of its own QuantizeLinear",
        "Clip": "with a lower bound",
    }
    for ops, fam in gate_patterns().items():
        for op in ops:
            forms.setdefault(op, f"inside a gate x·g(λx) ({' → '.join(ops)})")
    return {op: forms.get(op, "") for op in readable_ops()}


# ---------------------------------------------------------------------------------------------
# int8 graphs: following onnxruntime's float32 values (`Float`); the bounds themselves are `quantized`'s


def _follow(r: OnnxReader, op: Op, inputs: Sequence[Value], flops: int | None) -> Float | None:
    fls = [v.fl for v in inputs]
    if any(f is None for f in fls):
        return None
    return follow(op, fls, flops, r.affine_info.get(len(r.nodes) - 1))


def _follow_matmul(r: OnnxReader, a: Value, b: Value, nb: int, m: int, k: int, n: int) -> Float | None:
    if a.fl is None or b.fl is None:
        return None
    return matmul_float(a.fl, b.fl, nb, m, k, n)


# ---------------------------------------------------------------------------------------------
# entry points


def from_onnx(model: Any) -> Graph:
    """A Graph from an ONNX path, bytes or ModelProto (one float input, one output)."""
    import onnx

    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    elif isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    reader = OnnxReader(model)
    graph = reader.read()
    if reader.sixteen_bit:
        _refuse_unbounded_rewrites(model)
    return graph


def _refuse_unbounded_rewrites(model: Any) -> None:
    """A 16-bit QDQ graph runs unfused, except where onnxruntime's CPU optimizer rewrites DequantizeLinear → MatMul (a
    transformer's Linear on its tokens, even written as a Gemm) as MatMulNBits, which by default
    (`session.qdq_matmulnbits_accuracy_level` 4) computes with its input requantized to int8 per block: a rounding not
    bounded here (measured on a tiny deit: outputs 4.5e-4 outside the float32 bound). Asked of onnxruntime itself,
    from the graph it would run; refused in one line with the fix."""
    import tempfile

    import onnx
    import onnxruntime as ort

    from pipeline.onnx_io import session_options  # the settings every session of the pipeline runs with

    with tempfile.TemporaryDirectory() as d:
        optimized = Path(d) / "optimized.onnx"
        ort.InferenceSession(model.SerializeToString(), session_options(1, optimized), providers=["CPUExecutionProvider"])
        nbits = [n.name for n in onnx.load(str(optimized)).graph.node if n.op_type == "MatMulNBits"]
    if nbits:
        raise UnsupportedModel(
            f"MatMulNBits ({len(nbits)} node(s) onnxruntime makes of DequantizeLinear → MatMul in this 16-bit graph, e.g. "
            f"'{nbits[0]}') is not read: it computes with its input requantized to int8 per block, a rounding not "
            "bounded here; quantize with quantize.activation_type int8",
            node=nbits[0], op="MatMulNBits", what="a MatMul on quantized weights in a 16-bit graph",
            fix="quantize with quantize.activation_type int8")


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
    first = next((mod for mod in m.modules() if not list(mod.children())), None)
    if isinstance(first, torch.nn.Embedding):  # its input is token ids: no float box to bound
        fix = "verify the model from its embedding on (a module that takes the embedded tokens as its input)"
        raise UnsupportedModel(f"{type(model).__name__} takes token ids (its first module is an nn.Embedding): the "
                               f"verifier's properties are boxes over a float input; {fix}",
                               what="an integer input (token ids into an nn.Embedding)", fix=fix)
    try:
        proto, _ = to_onnx(m, torch.zeros(1, *shape), opset=20, simplify=True, dynamic_batch=False)
    except Exception as e:  # the exporter's own errors are long; the first line says what failed
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UnsupportedModel(f"{type(model).__name__} could not be exported to ONNX for verification: {first[:300]}",
                               what="a module the ONNX exporter cannot write", fix=None) from None
    try:
        return from_onnx(proto)
    except UnsupportedModel as e:
        node = getattr(e, "onnx_node", None)
        if node is None:
            raise
        where = module_path(node.name)
        why = getattr(e, "why", "")
        if node.op_type in readable_ops():
            msg = f"{type(model).__name__}: {node.op_type} in module '{where}' is not read: {why}"
        else:
            msg = f"{type(model).__name__}: unsupported op {node.op_type} in module '{where}'; the verifier reads {', '.join(readable_ops())}"
        raise UnsupportedModel(msg, node=where, op=node.op_type, what=e.what, fix=e.fix) from None


def read(model: Any, input_shape: Sequence[int] | None = None) -> Graph:
    """A Graph from a Graph, an nn.Module (needs `input_shape`), or an ONNX path/bytes/ModelProto."""
    if isinstance(model, Graph):
        return model
    if isinstance(model, torch.nn.Module):
        if input_shape is None:
            raise ValueError("reading a torch model needs its input_shape (without the batch axis)")
        return from_torch(model, input_shape)
    return from_onnx(model)
