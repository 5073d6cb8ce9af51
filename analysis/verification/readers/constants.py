"""Constant folding: an op whose inputs are all constants (shape arithmetic, weights behind Cast/Transpose/
DequantizeLinear, masks, a product of constant matrices: a controller evaluated at a fixed point) is evaluated with
numpy (`CONSTANT_OPS`), and so are the index arrays the shape handlers gather with (`slice_index`, `split_parts`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops.base import numel
from .qdq import dequantize_const
from .reader import ConstantOp, OnnxReader


def reshape_target(target: np.ndarray, shape: tuple[int, ...], allowzero: int) -> list[int]:
    t = [int(d) for d in target]
    t = [shape[i] if d == 0 and not allowzero else d for i, d in enumerate(t)]
    if -1 in t:
        known = int(np.prod([d for d in t if d != -1]))
        t[t.index(-1)] = numel(shape) // max(known, 1)
    return t


def slice_args(r: OnnxReader, args: list[Any]) -> list[Any]:
    """(starts, ends, axes, steps) of a Slice node whose inputs after the data are `args`: attributes before opset 10,
    inputs from it on."""
    if r.opset < 10:
        return [r.attr("starts"), r.attr("ends"), r.attr("axes", None), None]
    return list(args) + [None] * (4 - len(args))


def slice_index(x: np.ndarray, starts, ends, axes=None, steps=None) -> np.ndarray:
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    idx = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = int(a) + x.ndim if int(a) < 0 else int(a)
        idx[a] = slice(int(s), int(e), int(st))
    return x[tuple(idx)]


def axes_of(r: OnnxReader, args: list[Any], rank: int, index: int = 1) -> tuple[int, ...] | None:
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


def split_parts(r: OnnxReader, args: list[Any]) -> list[np.ndarray]:
    x = args[0]
    axis = int(r.attr("axis", 0))
    sizes = _split_sizes(r, args, x.shape[axis])
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def _softmax_np(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _reduce(fn):
    def run(r: OnnxReader, a: list[Any]) -> list[np.ndarray]:
        axes = axes_of(r, a, np.ndim(a[0]))
        if axes is None and r.attr("noop_with_empty_axes", 0):
            return [a[0]]
        return [fn(a[0], axis=axes, keepdims=bool(r.attr("keepdims", 1)))]
    return run


CONSTANT_OPS: dict[str, ConstantOp] = {
    "Identity": lambda r, a: [a[0]],
    "Cast": lambda r, a: [a[0].astype({1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64}
                                      .get(r.attr("to"), a[0].dtype))],
    "Reshape": lambda r, a: [a[0].reshape(reshape_target(a[1], a[0].shape, r.attr("allowzero", 0)))],
    "Transpose": lambda r, a: [np.transpose(a[0], r.attr("perm", None))],
    "Unsqueeze": lambda r, a: [np.expand_dims(a[0], tuple(sorted(axes_of(r, a, np.ndim(a[0]) + len(np.asarray(a[1] if len(a) > 1 and a[1] is not None else r.attr("axes")).reshape(-1))))))],
    "Squeeze": lambda r, a: [np.squeeze(a[0], axes_of(r, a, np.ndim(a[0])))],
    "Concat": lambda r, a: [np.concatenate(a, axis=r.attr("axis"))],
    "Gather": lambda r, a: [np.take(a[0], a[1], axis=r.attr("axis", 0))],
    "Slice": lambda r, a: [slice_index(a[0], *slice_args(r, a[1:]))],
    "Split": split_parts,
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
    "DequantizeLinear": lambda r, a: [dequantize_const(r, a)],
    "MatMul": lambda r, a: [np.matmul(a[0], a[1])],
    "Gemm": lambda r, a: [_gemm(r, a)],
}


def _gemm(r: OnnxReader, a: list[Any]) -> np.ndarray:
    """alpha·A'·B' + beta·C, A' and B' transposed where transA and transB say."""
    A = a[0].T if r.attr("transA", 0) else a[0]
    B = a[1].T if r.attr("transB", 0) else a[1]
    y = r.attr("alpha", 1.0) * (A @ B)
    return y + r.attr("beta", 1.0) * a[2] if len(a) > 2 and a[2] is not None else y


def _constant_of_shape_value(r: OnnxReader) -> Any:
    from onnx import numpy_helper

    v = r.attr("value", None)
    return numpy_helper.to_array(v).reshape(-1)[0] if v is not None else np.float32(0)
