"""Affine ops on a variable: Gemm and MatMul by a constant (a `Linear`, or a `TokenLinear` on rows), Conv, the
elementwise Add/Sub/Mul/Div by a constant (a `Scale`) or of two variables (a `Sum`, or a `Product` with `Reciprocal`
for a divisor), Neg. In an int8 graph each affine node records what onnxruntime's rounding of it depends on."""

from __future__ import annotations

import numpy as np

from ..floats import follow
from ..ops.affine import Conv, Linear, Scale, Sum, TokenLinear
from ..ops.base import numel
from ..ops.curves import Reciprocal
from ..ops.gates import Gate
from ..ops.products import Product
from ..ops.shape import Concat
from .attention import matmul_variables
from .gates import fold_gate, gate_patterns, lambda_of
from .pooling import image
from .reader import OnnxReader
from .smooth import erf_gelu
from .values import Pending, Value


def on_rows(r: OnnxReader, x: Value, W: np.ndarray, b: np.ndarray, out_shape: tuple[int, ...], terms: int,
             w_scale: np.ndarray | None, int_bias: bool) -> Value:
    """y = W x + b on each row of x (its last axis): a Linear for one row, a TokenLinear for several."""
    rows = numel(x.shape[:-1])
    op = Linear(W, b) if rows == 1 else TokenLinear(W, b, rows)
    out = r.add(op, [x], out_shape)
    if w_scale is not None:
        w_scale = np.tile(np.asarray(w_scale, dtype=np.float64).reshape(-1), rows)
    record_affine(r, out, x, terms, w_scale, int_bias)
    return out


def gemm(r: OnnxReader) -> None:
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
    r.set(on_rows(r, x, r.attr("alpha", 1.0) * W, bias, (x.shape[0], W.shape[0]), W.shape[1], w_scale,
                   bool(c) and c in r.const_scales))


def record_affine(r: OnnxReader, out: Value, x: Value, terms: int, w_scale: np.ndarray | None, int_bias: bool) -> None:
    """What the runtime's rounding of this affine node depends on, for a QuantizeLinear that may read it."""
    from ..quantized import fusable

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


def matmul(r: OnnxReader) -> None:
    a, w = r.node.input
    if r.is_const(a) and r.is_const(w):
        return
    if r.is_const(a):
        raise r.unsupported("a constant times a variable (W·x) is not read", what="a MatMul of a constant by a variable",
                            fix="write it as x·Wᵀ (a Linear)")
    x = r.var(a)
    if not r.is_const(w):
        return matmul_variables(r, x, r.var(w))
    W = r.const(w).astype(np.float64)
    if W.ndim != 2 or len(x.shape) < 1 or x.shape[-1] != W.shape[0]:
        raise r.unsupported(f"only x·W with W a constant 2-d matrix is read (x {x.shape}, W {W.shape})",
                            what=f"a MatMul of shape {x.shape} by a constant of shape {W.shape}")
    ws = r.const_scales.get(w)
    r.set(on_rows(r, x, W.T, np.zeros(W.shape[1]), x.shape[:-1] + (W.shape[1],), W.shape[0],
                   None if ws is None else ws.max(0), False))


def arith(r: OnnxReader) -> None:
    op = r.node.op_type
    a, b = r.node.input
    if not r.is_const(a) and not r.is_const(b):
        return _two_variables(r, op, a, b)
    var_first = not r.is_const(a)
    x = r.var(a if var_first else b)
    c = np.asarray(r.const(b if var_first else a), dtype=np.float64)
    shape = r.broadcast(x.shape, c.shape)
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
    if op in ("Mul", "Div") and (folded := fold_gate(r, x, scale)) is not None:
        return r.set(folded)
    r.set(r.add(Scale(scale, shift), [x], shape, flops=2 if op == "Div" else 1))


def _two_variables(r: OnnxReader, op: str, a: str, b: str) -> None:
    if op == "Mul":
        va, vb = r.vals.get(a), r.vals.get(b)
        pend, other = (va, vb) if isinstance(va, Pending) else (vb, va)
        fam = gate_patterns().get(pend.ops) if isinstance(pend, Pending) else None
        if fam is not None and not fam.onnx.whole and isinstance(other, Value):
            lam = lambda_of(r, pend.arg, other)
            if lam is not None:
                r.set(r.add(Gate(fam.name, lam, source=r.node.name), [other], other.shape))
                return
        if isinstance(va, Value) and isinstance(vb, Value) and (gelu := erf_gelu(r, va, vb) or erf_gelu(r, vb, va)):
            return r.set(gelu)
    x, y = r.var(a), r.var(b)
    shape = r.broadcast(x.shape, y.shape)
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


def neg(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    r.set(r.add(Scale(-np.ones(numel(x.shape)), np.zeros(numel(x.shape))), [x], x.shape, flops=0))


def conv(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    in_shape = image(r, x, "Conv")
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
    record_affine(r, out, x, numel(w.shape[1:]), per_unit, bool(bias_name) and bias_name in r.const_scales)
    r.set(out)
