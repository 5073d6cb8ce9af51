"""Affine ops on a variable: Gemm and MatMul by a constant (a `Linear`, or a `TokenLinear` on rows), Conv, the
elementwise Add/Sub/Mul/Div by a constant (a `Scale`) or of two variables (a `Sum`, or a `Product` with `Reciprocal`
for a divisor), Neg, ConvTranspose (a Conv over the input spread by its stride). In an int8 graph each affine node records what onnxruntime's rounding of it depends on."""

from __future__ import annotations

import numpy as np

from ..floats import follow
from ..ops.affine import Conv, Linear, Scale, Sum, TokenLinear
from ..ops.base import numel
from ..ops.curves import Reciprocal
from ..ops.gates import Gate
from ..ops.products import Product
from ..ops.shape import Concat, Select
from .attention import matmul_variables
from .gates import fold_gate, gate_patterns, lambda_of
from .pooling import image
from .reader import OnnxReader
from .smooth import erf_gelu
from .shape import padded
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
    if r.is_const(a):  # (a product of two constants is folded: `constants.CONSTANT_OPS`)
        return _constant_times_variable(r, a, w)
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


def _constant_times_variable(r: OnnxReader, a: str, w: str) -> None:
    """W·x for a constant matrix W and a variable x of shape (k,) or (k, m): a Linear on x's units (W ⊗ I_m for m
    columns, in x's row-major order)."""
    W, x = r.const(a).astype(np.float64), r.var(w)
    if W.ndim != 2 or len(x.shape) not in (1, 2) or x.shape[0] != W.shape[1] or a in r.const_scales:
        raise r.unsupported(f"a constant of shape {W.shape} times a variable of shape {x.shape}",
                            what="a MatMul of a constant by a variable", fix="write it as x·Wᵀ (a Linear)")
    m = x.shape[1] if len(x.shape) == 2 else 1
    out_shape = (W.shape[0],) + x.shape[1:]
    flat = Value(x.node, (numel(x.shape),), x.fl)
    out = on_rows(r, flat, np.kron(W, np.eye(m)), np.zeros(W.shape[0] * m), (W.shape[0] * m,), W.shape[1], None, False)
    r.set(Value(out.node, out_shape, out.fl))


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
    """A 2-d Conv; a 1-d one as a 2-d one over a height of 1 (the same units in the same order)."""
    x = r.var(r.node.input[0])
    w = r.const(r.node.input[1]).astype(np.float64)
    one_d = w.ndim == 3 and len(x.shape) == 3 and x.shape[0] == 1
    if one_d:
        x, w = Value(x.node, (1, x.shape[1], 1, x.shape[2]), x.fl), w[:, :, None, :]
    in_shape = image(r, x, "Conv")
    if w.ndim != 4:
        raise r.unsupported("only 1-d and 2-d convolutions are read", what=f"a {w.ndim - 2}-d convolution")
    b = r.const(r.node.input[2]).astype(np.float64) if len(r.node.input) > 2 and r.node.input[2] else np.zeros(w.shape[0])
    strides, dil = tuple(r.attr("strides", [1, 1])), tuple(r.attr("dilations", [1, 1]))
    if one_d:
        strides, dil = (1, *r.attr("strides", [1])), (1, *r.attr("dilations", [1]))
    pads = _conv_pads(r, in_shape[1:], w.shape[2:], strides, dil)
    if one_d and r.attr("pads") is not None:
        pads = [0, pads[0], 0, pads[1]]
    if pads[0] != pads[2] or pads[1] != pads[3]:  # the asymmetric part as a zero Pad of the input (TF's SAME)
        low = [min(pads[0], pads[2]), min(pads[1], pads[3])]
        x = padded(r, x, [0, 0, pads[0] - low[0], pads[1] - low[1]], [0, 0, pads[2] - low[0], pads[3] - low[1]])
        in_shape, pads = x.shape[1:], low * 2
    conv = Conv(w, b, in_shape, strides, (pads[0], pads[1]), dil, r.attr("group", 1))
    out = r.add(conv, [x], (1,) + conv.out_shape)
    ws = r.const_scales.get(r.node.input[1])
    per_unit = None if ws is None else np.repeat(ws.reshape(ws.shape[0], -1).max(1), numel(conv.out_shape[1:]))
    bias_name = r.node.input[2] if len(r.node.input) > 2 else ""
    record_affine(r, out, x, numel(w.shape[1:]), per_unit, bool(bias_name) and bias_name in r.const_scales)
    r.set(Value(out.node, (1, conv.out_shape[0], conv.out_shape[2]), out.fl) if one_d else out)


def _conv_pads(r: OnnxReader, size: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
               dil: tuple[int, ...]) -> list[int]:
    """A Conv's pads (top, left, bottom, right): explicit, or what auto_pad makes of them (SAME: out = ⌈in/stride⌉)."""
    auto = r.attr("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        return [int(p) for p in r.attr("pads", [0, 0, 0, 0])]
    if auto == "VALID":
        return [0, 0, 0, 0]
    total = [max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0) for n, k, s, d in zip(size, kernel, strides, dil)]
    small = [t // 2 for t in total]
    big = [t - t // 2 for t in total]
    return small + big if auto == "SAME_UPPER" else big + small


def conv_transpose(r: OnnxReader) -> None:
    """ConvTranspose as a Conv with its kernel flipped and its channels swapped, over the input spread out by the
    stride (zeros between its units) and padded by (k − 1)·d − pads, a `Select` of x and a constant 0."""
    x = r.var(r.node.input[0])
    c, h, wd = image(r, x, "ConvTranspose")
    w = r.const(r.node.input[1]).astype(np.float64)
    if w.ndim != 4:
        raise r.unsupported("only 2-d transposed convolutions are read", what=f"a {w.ndim - 2}-d ConvTranspose")
    g = int(r.attr("group", 1))
    if w.shape[0] != c or c % g:
        raise r.unsupported(f"a weight of shape {w.shape} on {c} channels in {g} groups",
                            what=f"a ConvTranspose weight {w.shape} that does not fit {c} channels")
    cout = w.shape[1] * g
    b = r.const(r.node.input[2]).astype(np.float64) if len(r.node.input) > 2 and r.node.input[2] else np.zeros(cout)
    k, s = w.shape[2:], [int(v) for v in r.attr("strides", [1, 1])]
    d, extra = [int(v) for v in r.attr("dilations", [1, 1])], [int(v) for v in r.attr("output_padding", [0, 0])]
    auto = r.attr("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    target = r.attr("output_shape", None)
    if target is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        out = [int(v) for v in target][-2:] if target is not None else [h * s[0], wd * s[1]]
        total = [s[i] * (n - 1) + extra[i] + (k[i] - 1) * d[i] + 1 - out[i] for i, n in enumerate((h, wd))]
        upper = auto == "SAME_UPPER"
        pads = [t // 2 if upper else t - t // 2 for t in total] + [t - t // 2 if upper else t // 2 for t in total]
    else:
        pads = [0, 0, 0, 0] if auto == "VALID" else [int(p) for p in r.attr("pads", [0, 0, 0, 0])]
    spread = np.full((c, s[0] * (h - 1) + 1, s[1] * (wd - 1) + 1), -1)
    spread[:, ::s[0], ::s[1]] = np.arange(c * h * wd).reshape(c, h, wd)
    full = [(k[i] - 1) * d[i] for i in range(2)]
    index = spread
    for i in range(2):  # pad (or crop) each spatial axis by (k − 1)·d − pads, the output padding at its end
        lo, hi = full[i] - pads[i], full[i] - pads[i + 2] + extra[i]
        index = np.moveaxis(index, i + 1, 0)
        index = index[max(-lo, 0): index.shape[0] - max(-hi, 0)]
        index = np.moveaxis(np.pad(index, [(max(lo, 0), max(hi, 0))] + [(0, 0)] * 2, constant_values=-1), 0, i + 1)
    if min(index.shape[1:]) < (k[0] - 1) * d[0] + 1 or index.shape[2] < (k[1] - 1) * d[1] + 1:
        raise r.unsupported(f"pads {pads} that leave no output", what="a ConvTranspose with no output")
    n = numel(x.shape)
    both = r.add(Concat(((n,), (1,)), 0, (None, np.zeros(1))), [x], (n + 1,))
    z = r.add(Select(np.where(index < 0, n, index).reshape(-1), n + 1), [both], (1, *index.shape))
    ci, co = c // g, cout // g  # per group: W'[o, i] = flip(W[i, o])
    flipped = np.concatenate([w[j * ci:(j + 1) * ci].transpose(1, 0, 2, 3) for j in range(g)])[:, :, ::-1, ::-1]
    conv = Conv(np.ascontiguousarray(flipped), b, index.shape, (1, 1), (0, 0), tuple(d), g)
    r.set(r.add(conv, [z], (1,) + conv.out_shape))
