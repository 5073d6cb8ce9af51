"""Data movement on a variable: Identity/Dropout/Cast, Flatten/Reshape/Squeeze/Unsqueeze (a new shape for the same
units), Transpose (a `Permute`), Gather, Slice, Split, Expand, Tile, Where on a constant condition (a `Select`),
Concat with constant inputs such as a class token, Pad (constant pads as a constant part of a `Concat`), Resize and
Upsample in nearest mode; Shape and Size of a variable are constants."""

from __future__ import annotations

import numpy as np

from ..ops.base import numel
from ..ops.shape import Concat, Permute, Select
from .constants import reshape_target, slice_args, slice_index, split_parts
from .reader import OnnxReader
from .values import Value


def identity(r: OnnxReader) -> None:
    if r.node.op_type == "Cast" and r.attr("to") not in (1, 10, 11, 16):  # float, float16, double, bfloat16
        raise r.unsupported("a cast of a variable to a non-float type", what="a cast to a non-float type")
    r.set(r.vals.get(r.node.input[0]) or r.var(r.node.input[0]))


def shape_of(r: OnnxReader) -> None:
    shape = np.array(r.var(r.node.input[0]).shape, dtype=np.int64)
    start, end = r.attr("start", 0), r.attr("end", None)
    r.consts[r.node.output[0]] = shape[start:end]


def size_of(r: OnnxReader) -> None:
    r.consts[r.node.output[0]] = np.array(numel(r.var(r.node.input[0]).shape), dtype=np.int64)


def flatten(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    axis = r.attr("axis", 1)
    axis = axis + len(x.shape) if axis < 0 else axis
    r.set(Value(x.node, (numel(x.shape[:axis]), numel(x.shape[axis:])), x.fl))


def reshape(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    target = reshape_target(r.const(r.node.input[1]), x.shape, r.attr("allowzero", 0))
    if numel(tuple(target)) != numel(x.shape):
        raise r.unsupported(f"a reshape of {x.shape} to {target}", what=f"a reshape of {x.shape} to {target}")
    r.set(Value(x.node, tuple(target), x.fl))


def squeeze(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    axes = r.const(r.node.input[1]) if len(r.node.input) > 1 and r.node.input[1] else r.attr("axes", None)
    probe = np.empty(x.shape, dtype=np.int8)
    if r.node.op_type == "Unsqueeze":
        rank = len(x.shape) + len(np.asarray(axes).reshape(-1))
        shape = np.expand_dims(probe, tuple(sorted(int(a) + rank if int(a) < 0 else int(a) for a in np.asarray(axes).reshape(-1)))).shape
    else:
        shape = np.squeeze(probe, None if axes is None else tuple(int(a) for a in np.asarray(axes).reshape(-1))).shape
    r.set(Value(x.node, tuple(shape), x.fl))


def transpose(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    perm = list(r.attr("perm", list(range(len(x.shape)))[::-1]))
    index = np.transpose(positions(x), perm)
    moved = [d for d in range(len(perm)) if x.shape[perm[d]] > 1]
    if [perm[d] for d in moved] == sorted(perm[d] for d in moved):  # only axes of size 1 move: the same order of units
        return r.set(Value(x.node, index.shape, x.fl))
    r.set(r.add(Permute(index.reshape(-1)), [x], index.shape))


def concat(r: OnnxReader) -> None:
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


def take(r: OnnxReader, x: Value, index: np.ndarray) -> Value:
    """The units `index` (an array of x's flat positions, any shape) of x, shaped like `index`."""
    flat = np.asarray(index).reshape(-1)
    if flat.size == numel(x.shape) and np.array_equal(flat, np.arange(flat.size)):
        return Value(x.node, tuple(np.shape(index)), x.fl)
    return r.add(Select(flat, numel(x.shape)), [x], np.shape(index))


def positions(x: Value) -> np.ndarray:
    return np.arange(numel(x.shape)).reshape(x.shape)


def gather(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    if not r.is_const(r.node.input[1]):
        raise r.unsupported("indices that are a variable", what="Gather with variable indices")
    axis = r.axis(r.attr("axis", 0), len(x.shape))
    idx = np.asarray(r.const(r.node.input[1])).astype(np.int64)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    r.set(take(r, x, np.take(positions(x), idx, axis=axis)))


def slice_(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    args = [r.const(i) if i else None for i in r.node.input[1:]]
    r.set(take(r, x, slice_index(positions(x), *slice_args(r, args))))


def split(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    args = [None] + [r.const(i) if i else None for i in r.node.input[1:]]
    for k, part in enumerate(split_parts(r, [positions(x)] + args[1:])):
        r.set(take(r, x, part), k)


def expand(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    target = tuple(int(d) for d in r.const(r.node.input[1]))
    r.set(r.expand(x, r.broadcast(x.shape, target)))


def tile(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    r.set(take(r, x, np.tile(positions(x), [int(d) for d in r.const(r.node.input[1])])))


def where(r: OnnxReader) -> None:
    cname, a, b = r.node.input
    if not r.is_const(cname):
        raise r.unsupported("a condition that is a variable", what="Where on a variable condition")
    cond = np.asarray(r.const(cname), dtype=bool)
    parts = [r.vals.get(n) if not r.is_const(n) else np.asarray(r.const(n), dtype=np.float64) for n in (a, b)]
    shapes = [p.shape if isinstance(p, Value) else np.shape(p) for p in parts]
    shape = r.broadcast(cond.shape, *shapes)
    n = numel(shape)
    cond = np.broadcast_to(cond, shape).reshape(-1)
    vals = [r.expand(r.var(name), shape) if not r.is_const(name) else None for name in (a, b)]
    consts = tuple(None if v is not None else np.broadcast_to(p, shape).reshape(-1) for v, p in zip(vals, parts))
    both = r.add(Concat(((n,), (n,)), 0, consts), [v for v in vals if v is not None], (2 * n,))
    r.set(r.add(Select(np.where(cond, np.arange(n), n + np.arange(n)), 2 * n), [both], shape))


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def padded(r: OnnxReader, x: Value, begins: list[int], ends: list[int], mode: str = "constant", value: float = 0.0) -> Value:
    """x padded by `begins`/`ends` units per axis (negative: cropped): in constant mode the padding is `value`, the
    constant part of a `Concat` that a `Select` places; reflect, edge and wrap pick units of x (numpy's modes, as
    ONNX defines them). No padding: x itself."""
    if not any(begins) and not any(ends):
        return x
    pos = positions(x)
    pos = pos[tuple(slice(max(-b, 0), d - max(-e, 0)) for b, e, d in zip(begins, ends, x.shape))]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends)]
    if min(pos.shape, default=1) < 1:
        raise r.unsupported(f"pads {begins + ends} that crop a tensor of shape {x.shape} to nothing",
                            what=f"a Pad that crops shape {x.shape} to nothing")
    if mode != "constant":
        return take(r, x, np.pad(pos, widths, mode=mode))
    index = np.pad(pos, widths, constant_values=-1)
    n = numel(x.shape)
    if not (index < 0).any():
        return take(r, x, index)
    both = r.add(Concat(((n,), (1,)), 0, (None, np.array([float(value)]))), [x], (n + 1,))
    return r.add(Select(np.where(index < 0, n, index).reshape(-1), n + 1), [both], index.shape)


def pad(r: OnnxReader) -> None:
    """Pad in any mode, of any opset (pads and value as attributes before 11, as inputs from it on, axes from 18)."""
    x = r.var(r.node.input[0])
    rank = len(x.shape)
    mode = _text(r.attr("mode", "constant"))
    inputs = list(r.node.input) + [""] * 3
    if r.opset < 11:
        pads, value, axes = r.attr("pads"), float(r.attr("value", 0.0)), None
    else:
        pads = r.const(inputs[1])
        value = float(np.asarray(r.const(inputs[2])).reshape(-1)[0]) if inputs[2] else 0.0
        axes = r.const(inputs[3]) if inputs[3] else None
    axes = list(range(rank)) if axes is None else [r.axis(a, rank) for a in np.asarray(axes).reshape(-1)]
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise r.unsupported(f"{len(pads)} pads for {len(axes)} axes", what=f"a Pad of {len(pads)} pads on {len(axes)} axes")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise r.unsupported(f"mode {mode!r}", what=f"a Pad in mode {mode!r}", fix="use mode constant, reflect, edge or wrap")
    begins, ends = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begins[a], ends[a] = pads[k], pads[len(axes) + k]
    r.set(padded(r, x, begins, ends, mode, value))


def resize(r: OnnxReader) -> None:
    """Resize (and the older Upsample) in nearest mode: each output unit is a unit of x, which onnx's reference
    implementation of this very node, run on x's flat positions, says (every coordinate mode and rounding of it)."""
    x = r.var(r.node.input[0])
    mode = _text(r.attr("mode", "nearest"))
    if mode != "nearest":
        raise r.unsupported(f"mode {mode!r}", what=f"a {r.node.op_type} in mode {mode!r}", fix="use mode='nearest'")
    if len(r.node.output) > 1:
        raise r.unsupported("more than one output", what=f"a {r.node.op_type} with more than one output")
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    inits = [onnx.numpy_helper.from_array(np.asarray(r.const(i)), i) for i in r.node.input[1:] if i]
    node = helper.make_node(r.node.op_type, ["x", *r.node.input[1:]], ["y"])
    node.attribute.extend(r.node.attribute)
    graph = helper.make_graph([node], "moves", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", r.opset)])
    try:
        moved = np.asarray(ReferenceEvaluator(model).run(None, {"x": positions(x).astype(np.float64)})[0])
    except Exception as e:  # noqa: BLE001 - the reference's own refusal of this node's form, said in one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise r.unsupported(f"onnx's reference implementation does not run this form ({first})",
                            what=f"a {r.node.op_type} form the reference does not run") from None
    index = moved.astype(np.int64)
    if not np.array_equal(index, moved) or index.size == 0:
        raise r.unsupported("an output that is not a unit of its input", what=f"a {r.node.op_type} that is not a selection")
    r.set(take(r, x, index))
