"""int8 QDQ graphs (`quantized` says which execution the reading covers): a QuantizeLinear of a variable is read
with the DequantizeLinear of the same grid as the pair's relaxation, a rounding and a clamp; a dequantized constant
records its scale, which decides the runtime's bias rounding."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.numerics import U

from ..floats import Float
from ..ops.base import as_tensor
from ..ops.relu import ReLU
from ..ops.rounding import QuantizedInput, Rounding
from .activations import clamp
from .reader import OnnxReader
from .values import Grid, QValue, Value

WEIGHT_RANGE = (-64, 64)  # 7-bit weights as reduce_range makes them: a pair of products 2·255·64 = 32640 fits int16 (`quantized`)


def dequantize_const(r: OnnxReader, args: list[Any]) -> np.ndarray:
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


def _quant_params(r: OnnxReader, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(scale, zero point) per unit of a tensor of `shape`, and the integer range, of a Q/DQ node."""
    import onnx

    from ..quantized import INT_RANGES, fusable

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


def quantize(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    scale, zero, qmin, qmax = _quant_params(r, x.shape)
    r.set(QValue(x, scale, zero, qmin, qmax, r.node))


def dequantize(r: OnnxReader) -> None:
    """DequantizeLinear of a QuantizeLinear on the same grid: the pair's relaxation (`quantized` derives it)."""
    from ..quantized import exact_error, float_error, fusable, int32_safe, requant_error

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
        out = clamp(r, noisy, lo, hi)
    r.grids[out.node] = Grid(q.scale, q.zero, qmin, qmax, as_tensor(lo), as_tensor(hi))
    # the dequantized value: a grid point in [lo, hi]; onnxruntime's float32 DequantizeLinear rounds it once
    r.set(Value(out.node, x.shape, Float(U * np.maximum(np.abs(lo), np.abs(hi)), lo.copy(), hi.copy()) if r.int8 else None))
