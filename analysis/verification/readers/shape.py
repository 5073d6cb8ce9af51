"""Data movement on a variable: Identity/Dropout/Cast, Flatten/Reshape/Squeeze/Unsqueeze (a new shape for the same
units), Transpose (a `Permute`), Gather, Slice, Split, Expand, Tile, Where on a constant condition (a `Select`),
Concat with constant inputs such as a class token; Shape and Size of a variable are constants."""

from __future__ import annotations

import numpy as np

from ..ops.base import numel
from ..ops.shape import Concat, Permute, Select
from .constants import reshape_target, slice_index, split_parts
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
    r.set(take(r, x, slice_index(positions(x), *args)))


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
