"""The ONNX reader's driver (`OnnxReader`): it walks the graph's nodes in order, folds the constant ones
(`constants.CONSTANT_OPS`), hands every other node to the handler of its op type (the package's table `HANDLERS`) and
keeps what the handlers share: the constants, the value of each tensor, the nodes built so far, and the one-line
refusal (`unsupported`) that names the node being read."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from pipeline import gates
from pipeline.gates import GateFamily
from pipeline.numerics import U

from ..floats import Float, follow
from ..graph import Graph, Node
from ..ops.base import Op, UnsupportedModel, numel
from ..ops.rounding import QuantizedInput, Rounding
from ..ops.shape import Select
from .values import Grid, Pending, QValue, Value


def gate_patterns() -> dict[tuple[str, ...], GateFamily]:
    """The op chains read as gates, of every family the verifier can bound (it has an ONNX pattern and relaxation
    data), registered now: a chain computes g(λx) (then x·g(λx) is its Mul by x) or, `whole`, F(λx) itself."""
    return {fam.onnx.ops: fam for fam in gates.GATES.values() if fam.onnx is not None and fam.relaxation is not None}


def ops_read(handlers: Iterable[str]) -> list[str]:
    """Every op type the reader reads: those of `handlers` and the gate patterns'."""
    return sorted({*handlers, *(op for ops in gate_patterns() for op in ops)})


def describe(node: Any) -> str:
    return f"node {node.name!r}" if node.name else f"a {node.op_type} node"


def constant(r: OnnxReader, node: Any) -> np.ndarray:
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name in ("value_float", "value_int"):
            return np.array(r.onnx.helper.get_attribute_value(a))
        if a.name in ("value_floats", "value_ints"):
            return np.array(list(r.onnx.helper.get_attribute_value(a)))
    raise r.unsupported("a Constant without a tensor value", what="a Constant without a tensor value")


class OnnxReader:
    """State while reading one ONNX graph: constants, values, the nodes built so far."""

    def __init__(self, model: Any, handlers: dict[str, Handler], constant_ops: dict[str, ConstantOp], gate: Handler,
                 smooth: Handler, alone: Callable[[OnnxReader, Pending], Value]):
        import onnx
        from onnx import numpy_helper

        self.onnx = onnx
        self.graph = model.graph
        # the default domain's opset: some ops changed their inputs or meaning (Slice's attributes before 10, Softmax's
        # flattening before 13, Pad's attributes before 11)
        self.opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
        # the op tables (the package's `HANDLERS`, `CONSTANT_OPS`); the handler of an op of a gate's chain, that of a
        # smooth activation read alone (which an op of a gate's chain defers to the gate's), and the reading of a gate's
        # inner chain that no gate takes
        self.handlers, self.constant_ops, self.gate, self.smooth, self.alone = handlers, constant_ops, gate, smooth, alone
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
            v = self.vals[name] = self.alone(self, v)
        if isinstance(v, QValue):
            raise self.unsupported(f"it reads the integer tensor {name!r}; the reader takes integer tensors only into the "
                                   "DequantizeLinear of their own QuantizeLinear", what="an integer tensor read by a float op")
        if v is None:
            raise self.unsupported(f"input {name!r} is not computed before it", what="an input computed later")
        return v

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

    def broadcast(self, *shapes: tuple[int, ...]) -> tuple[int, ...]:
        """The shape `shapes` broadcast to (numpy's rules)."""
        try:
            return tuple(int(d) for d in np.broadcast_shapes(*shapes))
        except ValueError:
            raise self.unsupported(f"shapes {' and '.join(map(str, shapes))} do not broadcast",
                                   what=f"operands of shapes {' and '.join(map(str, shapes))}") from None

    def unsupported(self, why: str = "", where: Any = None, what: str | None = None, fix: str | None = None) -> UnsupportedModel:
        """A handled op in a form it does not read: "X (node N) is not read: why[; fix]" with its fields."""
        node = where if where is not None else self.node
        msg = f"{node.op_type} ({describe(node)}) is not read: {why}" + (f"; {fix}" if fix else "")
        e = UnsupportedModel(msg, node=node.name or None, op=node.op_type, what=what or why, fix=fix)
        e.onnx_node, e.why = node, why + (f"; {fix}" if fix else "")  # type: ignore[attr-defined]
        return e

    def unknown_op(self) -> UnsupportedModel:
        node = self.node
        e = UnsupportedModel(f"unsupported ONNX op {node.op_type} ({describe(node)}); the verifier reads {', '.join(ops_read(self.handlers))}",
                             node=node.name or None, op=node.op_type, what=f"the op {node.op_type}",
                             fix=f"replace it by ops the verifier reads ({', '.join(ops_read(self.handlers))})")
        e.onnx_node, e.why = node, ""  # type: ignore[attr-defined]
        return e

    def _check_arity(self, node: Any) -> None:
        """A node with fewer inputs than its op's schema at this opset requires is refused before it is read."""
        from onnx.defs import SchemaError, get_schema

        try:
            least = get_schema(node.op_type, self.opset, node.domain or "").min_input
        except SchemaError:
            return
        given = len([i for i in node.input if i])
        if given < least:
            raise self.unsupported(f"{given} input(s) where opset {self.opset}'s {node.op_type} takes at least {least}",
                                   what=f"a {node.op_type} with {given} of its {least} inputs")

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
                self.consts[node.output[0]] = constant(self, node)
                continue
            folds = all(i in self.consts or i == "" for i in node.input) and node.op_type in self.constant_ops
            handler = self.handlers.get(node.op_type)
            if not folds and any(node.op_type in ops for ops in gate_patterns()) and (
                    handler in (None, self.smooth) or (node.op_type in self.chains and self._starts_gate(node))):
                handler = self.gate
            if not folds and handler is None:
                raise self.unknown_op()
            self._check_arity(node)
            try:
                if folds:
                    for k, v in enumerate(self.constant_ops[node.op_type](self, [self.consts.get(i) if i else None for i in node.input])):
                        self.consts[node.output[k]] = np.asarray(v)
                else:
                    handler(self)
            except UnsupportedModel:
                raise
            except (ArithmeticError, AttributeError, LookupError, RuntimeError, TypeError, ValueError) as e:
                # a form no handler anticipates (a missing input, an attribute of another type, shapes that do not
                # fit): refused in one line naming this node, as any other form not read
                first = (str(e).strip().splitlines() or [""])[0][:200]
                raise self.unsupported(f"a form the reader does not take ({type(e).__name__}: {first})",
                                       what=f"a {node.op_type} in a form the reader does not take") from None
        self.node = None
        out = self.vals.get(self.graph.output[0].name)
        if isinstance(out, Value) and out.node in self.grids and not isinstance(self.nodes[out.node].op, QuantizedInput):
            # the output's DequantizeLinear runs in float32: one rounding, relative 2⁻²⁴, of a value within the grid's range
            g = self.grids[out.node]
            E = U * torch.maximum(g.lo.abs(), g.hi.abs()).numpy()
            out = self.add(Rounding(E, None, source=self.graph.output[0].name), [out], out.shape)
        if isinstance(out, Pending):
            self.node = out.onnx_node  # a refusal names the chain's last node
            out = self.alone(self, out)
        if not isinstance(out, Value):
            name = self.graph.output[0].name
            node = next((n for n in self.graph.node if name in n.output), None)
            if node is None:
                raise UnsupportedModel("the graph output is not computed from its input", what="an output that is a constant")
            self.node = node
            raise self.unsupported("its output, the graph's, is a constant, not computed from the graph's input",
                                   what="an output that is a constant")
        return Graph(self.input_shape, self.nodes, out.node).pruned()


Handler = Callable[[OnnxReader], None]  # reads the reader's current node: sets its outputs or raises UnsupportedModel
ConstantOp = Callable[[OnnxReader, list[Any]], list[np.ndarray]]  # the values of a node whose inputs are all constants


def _follow(r: OnnxReader, op: Op, inputs: Sequence[Value], flops: int | None) -> Float | None:
    fls = [v.fl for v in inputs]
    if any(f is None for f in fls):
        return None
    return follow(op, fls, flops, r.affine_info.get(len(r.nodes) - 1))
