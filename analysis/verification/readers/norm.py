"""Normalization: BatchNormalization (a per-channel `Scale`) and LayerNormalization as centring, its variance
(`Variance`, bounded from the input's box as a whole), Rsqrt and a `Product`."""

from __future__ import annotations

import numpy as np

from ..floats import batchnorm_float, layer_norm_float
from ..ops.affine import Scale, TokenLinear
from ..ops.base import numel
from ..ops.curves import Rsqrt
from ..ops.norm import Variance
from ..ops.products import Product
from ..ops.shape import Concat, Select
from .reader import OnnxReader
from .values import Value


def batchnorm(r: OnnxReader) -> None:
    x = r.var(r.node.input[0])
    scale, bias, mean, var = (r.const(i).astype(np.float64) for i in r.node.input[1:5])
    a = scale / np.sqrt(var + r.attr("epsilon", 1e-5))
    per_channel = lambda v: np.broadcast_to(v.reshape(-1, *([1] * (len(x.shape) - 2))), x.shape).reshape(-1)  # noqa: E731
    out = r.add(Scale(per_channel(a), per_channel(bias - mean * a)), [x], x.shape, flops=0)
    if r.int8:
        out.fl = batchnorm_float(x.fl, per_channel(a), per_channel(mean), per_channel(bias))
    r.set(out)


def layer_norm(r: OnnxReader) -> None:
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
