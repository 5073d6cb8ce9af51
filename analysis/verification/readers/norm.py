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


def _constants(graph) -> dict[str, np.ndarray]:
    """The graph's initializers and Constant nodes' values (a tensor `value`) by name."""
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def fuse_layer_norms(model):
    """`model` with each LayerNorm written as its ops (x − mean(x), the mean of its square (Mul or Pow 2), + ε, Sqrt,
    Div, over the last axis: older exports' form, and the verifiers' form `quantize.verifier_form` writes) as one
    LayerNormalization with γ = 1 (the Mul by γ and Add of β after it stay as they are), so that it is bounded as the
    op (`layer_norm`), not as a product of separately bounded parts; `model` itself where there is none."""
    import onnx

    g = model.graph
    const = _constants(g)
    made = {o: n for n in g.node for o in n.output}
    uses: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            uses.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}

    def producer(name: str, op: str):
        n = made.get(name)
        return n if n is not None and n.op_type == op and name not in outputs else None

    def last_axis_mean(n) -> bool:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        axes = attrs.get("axes", const.get(n.input[1]) if len(n.input) > 1 else None)
        return axes is not None and list(np.asarray(axes).reshape(-1)) == [-1] and attrs.get("keepdims", 1) == 1

    def only_into(name: str, *nodes) -> bool:
        return name not in outputs and all(any(u is n for n in nodes) for u in uses.get(name, []))

    fused, drop = [], set()
    for div in [n for n in g.node if n.op_type == "Div" and len(n.input) == 2]:
        d, s = div.input
        sq_root = producer(s, "Sqrt")
        add = sq_root and producer(sq_root.input[0], "Add")
        if not add:
            continue
        var_name, eps_name = (add.input[0], add.input[1]) if add.input[1] in const else (add.input[1], add.input[0])
        eps = const.get(eps_name)
        var = producer(var_name, "ReduceMean")
        square = var and (producer(var.input[0], "Mul") or producer(var.input[0], "Pow"))
        sub = producer(d, "Sub")
        mean = sub and producer(sub.input[1], "ReduceMean")
        if not (eps is not None and eps.size and np.all(eps == eps.reshape(-1)[0]) and var and square and sub and mean
                and mean.input[0] == sub.input[0] and last_axis_mean(mean) and last_axis_mean(var)):
            continue
        if square.op_type == "Mul" and list(square.input) != [d, d]:
            continue
        if square.op_type == "Pow" and not (square.input[0] == d and np.all(const.get(square.input[1], np.nan) == 2)):
            continue
        if not (only_into(mean.output[0], sub) and only_into(d, square, div) and only_into(square.output[0], var)
                and only_into(var.output[0], add) and only_into(add.output[0], sq_root) and only_into(s, div)):
            continue
        gamma = f"{div.output[0]}_fused_layer_norm_gamma"
        fused.append((div, onnx.helper.make_node("LayerNormalization", [mean.input[0], gamma], [div.output[0]],
                                                 div.name or gamma, axis=-1, epsilon=float(eps.reshape(-1)[0])), gamma))
        drop |= {id(n) for n in (mean, sub, square, var, add, sq_root)}
    if not fused:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    by_div = {id(div): (ln, gamma) for div, ln, gamma in fused}
    nodes = []
    for n in g.node:
        if id(n) in by_div:
            ln, gamma = by_div[id(n)]
            nodes.append(ln)
            out.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(1, np.float32), gamma))
        elif id(n) not in drop:
            nodes.append(n)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
