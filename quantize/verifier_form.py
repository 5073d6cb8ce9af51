"""The verifiers' form of an exported graph: rewrites that keep its function and let the ONNX loaders of other
verifiers read it (`to_verifier_form`, called by `quantize.export.export_for_verifiers`). Which loaders read the
result is measured by benchmarks/peers/readers.py (onnx2pytorch, whose fork α,β-CROWN loads with; onnx2torch;
neuralsat; auto_LiRPA's convolutional path behind onnx2pytorch), recorded in benchmarks/peers/readers/.

- Opset 17 (`pipeline.opset.VERIFIERS_OPSET`, or the export's own where that is lower): the first with
  LayerNormalization as one op, the newest any ReLU graph of ours needs. Later opsets only renumber ops these graphs
  use (Reshape 19, Split 18, Constant 19), which onnx2torch 1.5.15 then refuses ("Converter is not implemented ...
  Reshape, version=19").
- A Constant node (onnxsim leaves one for attention's scale) becomes an initializer, so that the rank rewrite below
  sees it (and onnx2torch 1.5.15, which has no converter for Constant 19, reads it at any opset).
- BatchNormalization drops `training_mode` where it is 0, its default: onnx2pytorch 0.6.0 raises
  "NotImplementedError: Extraction of attribute training_mode not implemented", as α,β-CROWN's fork and neuralsat's
  copy of it do.
  The exporter writes it on every BatchNorm it could not fold into the Conv before it (a pre-activation block's,
  after a residual Add or beside a shortcut).
- The input normalization (Mul, Add by per-channel constants on the graph's input: y = s·x + t) becomes a Conv.
  Into the Conv that alone reads it when that Conv pads nothing: W'[o, i] = W[o, i]·s[i], b'[o] = b[o] + Σ W[o, i]·t[i]
  in float64, exact since every window sees normalized pixels only. Under zero padding that fold is not exact (the
  padded zeros would be normalized too: −mean/std, not 0), so there it becomes a 1×1 Conv of weight diag(s) and bias
  t, the same float32 numbers (the off-diagonal products are exact zeros). A free-standing constant on the input
  breaks auto_LiRPA's convolutional path twice over: a Mul by a constant below 4-D fails its assertion, and an Add
  of one, at any rank, fails when a later layer's bounds are needed for every unit (its patches concretize such a
  constant to an unflattened [1, C, H, W] and add it to a flat [1, C·H·W]); a Conv's bias is bounded by the Conv.
  (The Linear case is folded before the export, `quantize.export.fold_normalization`.)
- A constant operand of Add, Sub, Mul or Div takes the rank of the variable it meets ((C, 1, 1) against
  [N, C, H, W] becomes (1, C, 1, 1), a scalar (1, 1, 1, 1)): auto_LiRPA's convolutional path (its patches mode)
  multiplies only by 4-D constants and asserts so. A bias added to a MatMul by a constant stays 1-D: onnx2pytorch
  makes the two one Linear.
- A Linear on tokens, which onnxsim writes as Reshape [1, T, d] → [T, d] → Gemm, is a MatMul and Add on [1, T, d]
  (`token_gemms_to_matmuls`): auto_LiRPA takes a value's first axis for the batch, and its CROWN pass fails on [T, d].
- LayerNormalization is written in the ops it computes, ReduceMean → Sub → Mul (the square) → ReduceMean → Add ε →
  Sqrt → Div, then Mul γ and Add β: α,β-CROWN's loader (its fork of onnx2pytorch at the commit its `load_model.py`
  pins, fe7281b) has no LayerNormalization ("Conversion not implemented for op_type=LayerNormalization"), nor has
  neuralsat's copy of it. The project's own reader fuses the chain back into one LayerNorm
  (`analysis.verification.readers.norm.fuse_layer_norms`), so its bounds are those of the op.
- A Split becomes one Slice per output: auto_LiRPA traces onnx2pytorch's `torch.split` as `split_with_sizes`, whose
  outputs it miscounts ("symbolic for split_with_sizes produced an incorrect number of outputs"). Attention's unbind
  of q, k, v (Transpose → Split and Squeeze of axis 0) slices the Transpose's input instead, since auto_LiRPA keeps
  axis 0 for the batch ("Squeezing with axes == 0 is not allowed").
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.onnx_io import ExportError

ELEMENTWISE = ("Add", "Sub", "Mul", "Div")


class _Graph:
    """The graph's initializers by name and every tensor's consumers, kept current by the rewrites."""

    def __init__(self, proto: onnx.ModelProto):
        self.g = proto.graph
        self.init = {t.name: t for t in self.g.initializer}

    def consumers(self, name: str) -> list[onnx.NodeProto]:
        return [n for n in self.g.node if name in n.input]

    def is_output(self, name: str) -> bool:
        return any(o.name == name for o in self.g.output)

    def const(self, name: str) -> np.ndarray | None:
        return numpy_helper.to_array(self.init[name]) if name in self.init else None

    def set_const(self, name: str, value: np.ndarray) -> None:
        t = numpy_helper.from_array(np.ascontiguousarray(value), name)
        if name in self.init:
            self.init[name].CopyFrom(t)
        else:
            self.g.initializer.append(t)
            self.init[name] = self.g.initializer[-1]

    def fresh(self, base: str) -> str:
        taken = set(self.init) | {o for n in self.g.node for o in n.output} | {i.name for i in self.g.input}
        k = 0
        while f"{base}_{k}" in taken:
            k += 1
        return f"{base}_{k}"

    def drop_unused(self) -> None:
        outputs = {o.name for o in self.g.output}
        while dead := [n for n in self.g.node if not any(o in outputs or self.consumers(o) for o in n.output)]:
            for n in dead:  # a node whose outputs nothing reads (what a rewrite bypassed)
                self.g.node.remove(n)
        used = {i for n in self.g.node for i in n.input}
        for t in [t for t in self.g.initializer if t.name not in used]:
            self.g.initializer.remove(t)
            del self.init[t.name]
        for vi in [vi for vi in self.g.value_info if not any(vi.name in n.output for n in self.g.node)]:
            self.g.value_info.remove(vi)


def constants_to_initializers(g: _Graph) -> int:
    n = 0
    for node in [n for n in g.g.node if n.op_type == "Constant"]:
        attrs = {a.name: a for a in node.attribute}
        if set(attrs) != {"value"}:  # value_float(s)/value_int(s)/sparse: none of our exports writes them
            continue
        g.set_const(node.output[0], numpy_helper.to_array(attrs["value"].t))
        g.g.node.remove(node)
        n += 1
    return n


def drop_default_training_mode(g: _Graph) -> int:
    n = 0
    for node in g.g.node:
        if node.op_type != "BatchNormalization":
            continue
        for a in [a for a in node.attribute if a.name == "training_mode"]:
            if a.i != 0:
                raise ExportError(f"{node.name}: a BatchNormalization in training mode; export the model in eval mode")
            node.attribute.remove(a)
            n += 1
    return n


def _pads_nothing(node: onnx.NodeProto) -> bool:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    return auto == "VALID" or (auto == "NOTSET" and not any(attrs.get("pads", [])))


def normalization_into_conv(g: _Graph, input_shape: tuple[int, ...]) -> str | None:
    """The graph input's chain of Mul/Add by per-channel constants (y = s·x + t), as a Conv: folded into the Conv that
    alone reads it when that Conv pads nothing ("folded"), else one 1×1 Conv of weight diag(s) and bias t
    ("conv1x1"); None where there is no such chain (or its constants vary within a channel)."""
    name, chain = g.g.input[0].name, []
    scale, shift = np.ones(input_shape), np.zeros(input_shape)
    while not g.is_output(name) and len(users := g.consumers(name)) == 1:
        node = users[0]
        other = [i for i in node.input if i != name]
        c = g.const(other[0]) if node.op_type in ("Mul", "Add") and len(other) == 1 else None
        if c is None:
            break
        c = c.astype(np.float64)
        scale, shift = (scale * c, shift * c) if node.op_type == "Mul" else (scale, shift + c)
        chain.append(node)
        name = node.output[0]
    if not chain:
        return None
    s, t = np.broadcast_to(scale, input_shape)[0], np.broadcast_to(shift, input_shape)[0]  # [C, H, W]
    if not (np.all(s == s[:, :1, :1]) and np.all(t == t[:, :1, :1])):
        return None  # per pixel, not per channel: no single weight per input channel
    s, t = s[:, 0, 0], t[:, 0, 0]
    users = g.consumers(name)
    conv = users[0] if len(users) == 1 and not g.is_output(name) and users[0].op_type == "Conv" else None
    if conv is not None and conv.input[0] == name and _pads_nothing(conv) and _fold_into(g, conv, s, t):
        how = "folded"
    else:
        w, b = g.fresh("normalization_weight"), g.fresh("normalization_bias")
        g.set_const(w, (np.eye(len(s)) * s)[:, :, None, None].astype(np.float32))
        g.set_const(b, t.astype(np.float32))
        at = list(g.g.node).index(chain[0])
        g.g.node.insert(at, onnx.helper.make_node("Conv", [g.g.input[0].name, w, b], [name], name=g.fresh("normalization"),
                                                  kernel_shape=[1, 1]))
        how = "conv1x1"
    if how == "folded":
        conv.input[0] = g.g.input[0].name
    for n in chain:
        g.g.node.remove(n)
    return how


def _fold_into(g: _Graph, node: onnx.NodeProto, s: np.ndarray, t: np.ndarray) -> bool:
    """W'[o, i] = W[o, i]·s[i], b'[o] = b[o] + Σ W[o, i]·t[i] (float64, then the weight's dtype)."""
    w = g.const(node.input[1])
    has_bias = len(node.input) > 2 and bool(node.input[2])
    b = g.const(node.input[2]) if has_bias else np.zeros(w.shape[0], w.dtype) if w is not None else None
    if w is None or b is None or w.ndim != 4:
        return False
    groups = next((a.i for a in node.attribute if a.name == "group"), 1)
    out_c, in_per_group = w.shape[:2]
    # the input channel of weight [o, i]: group o // (out_c / groups), channel i within it
    chan = (np.arange(out_c)[:, None] // (out_c // groups)) * in_per_group + np.arange(in_per_group)[None, :]
    w64 = w.astype(np.float64)
    w_name, b_name = g.fresh(f"{node.input[1]}_normalized"), g.fresh(f"{node.input[2] if has_bias else node.name}_normalized")
    g.set_const(w_name, (w64 * s[chan][:, :, None, None]).astype(w.dtype))
    g.set_const(b_name, (b.astype(np.float64) + (w64 * t[chan][:, :, None, None]).sum(axis=(1, 2, 3))).astype(w.dtype))
    node.input[1] = w_name
    if has_bias:
        node.input[2] = b_name
    else:
        node.input.append(b_name)
    return True


def _replace(g: _Graph, node: onnx.NodeProto, nodes: list[onnx.NodeProto]) -> None:
    """`node` replaced by `nodes` at its place in the graph's order."""
    kept = list(g.g.node)
    at = kept.index(node)
    del g.g.node[:]
    g.g.node.extend(kept[:at] + nodes + kept[at + 1:])


def layer_norm_to_primitives(g: _Graph, proto: onnx.ModelProto) -> int:
    """Each LayerNormalization over the last axis written as ReduceMean → Sub → Mul → ReduceMean → Add ε → Sqrt →
    Div → Mul γ → Add β (opset 17's ReduceMean, axes an attribute), in float32 as onnxruntime computes the op."""
    inferred = onnx.shape_inference.infer_shapes(proto)
    rank = {vi.name: len(vi.type.tensor_type.shape.dim)
            for vi in [*inferred.graph.value_info, *inferred.graph.input] if vi.type.tensor_type.HasField("shape")}
    n = 0
    for node in [n for n in g.g.node if n.op_type == "LayerNormalization"]:
        x = node.input[0]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        axis = int(attrs.get("axis", -1))
        if x not in rank or axis not in (-1, rank[x] - 1) or any(node.output[1:]):
            raise ExportError(f"{node.name}: a LayerNormalization over axis {axis} of a rank-{rank.get(x, '?')} tensor "
                              "(or with its Mean/InvStdDev outputs read) has no primitive form here; normalize the last "
                              "axis (nn.LayerNorm)")
        names = {k: g.fresh(f"{node.name or 'ln'}_{k}") for k in ("mean", "centred", "square", "var", "eps", "var_eps",
                                                                   "std", "normed", "scaled")}
        g.set_const(names["eps"], np.full((1,) * rank[x], attrs.get("epsilon", 1e-5), np.float32))
        mean = dict(axes=[-1], keepdims=1)
        chain = [onnx.helper.make_node("ReduceMean", [x], [names["mean"]], f"{names['mean']}_op", **mean),
                 onnx.helper.make_node("Sub", [x, names["mean"]], [names["centred"]], f"{names['centred']}_op"),
                 onnx.helper.make_node("Mul", [names["centred"], names["centred"]], [names["square"]], f"{names['square']}_op"),
                 onnx.helper.make_node("ReduceMean", [names["square"]], [names["var"]], f"{names['var']}_op", **mean),
                 onnx.helper.make_node("Add", [names["var"], names["eps"]], [names["var_eps"]], f"{names['var_eps']}_op"),
                 onnx.helper.make_node("Sqrt", [names["var_eps"]], [names["std"]], f"{names['std']}_op"),
                 onnx.helper.make_node("Div", [names["centred"], names["std"]], [names["normed"]], f"{names['normed']}_op")]
        beta = node.input[2] if len(node.input) > 2 and node.input[2] else None
        scaled = names["scaled"] if beta else node.output[0]
        chain.append(onnx.helper.make_node("Mul", [names["normed"], node.input[1]], [scaled], f"{names['scaled']}_op"))
        if beta:
            chain.append(onnx.helper.make_node("Add", [scaled, beta], [node.output[0]], f"{node.output[0]}_op"))
        _replace(g, node, chain)
        n += 1
    return n


def _shapes(proto: onnx.ModelProto) -> dict[str, list[int]]:
    inferred = onnx.shape_inference.infer_shapes(proto)
    return {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in [*inferred.graph.value_info, *inferred.graph.input] if vi.type.tensor_type.HasField("shape")}


def _squeezed_axis(g: _Graph, node: onnx.NodeProto) -> list[int] | None:
    """A Squeeze's axes (an input from opset 13, an attribute before)."""
    if len(node.input) > 1:
        c = g.const(node.input[1])
        return None if c is None else [int(a) for a in np.asarray(c).reshape(-1)]
    return [int(a) for a in next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "axes"), [])]


def _last_axis_block(g: _Graph, shapes: dict[str, list[int]], name: str, k: int) -> tuple[str, int] | None:
    """(the Reshape's input, the block length m) where `name` is a Reshape that only splits its input's last axis and
    index j of its axis k is the block [j·m, (j + 1)·m) of that last axis; None otherwise."""
    node = next((p for p in g.g.node if name in p.output), None)
    if node is None or node.op_type != "Reshape" or node.input[0] not in shapes or name not in shapes:
        return None
    src, out = shapes[node.input[0]], shapes[name]
    if not (0 < k < len(out) and np.prod(src[:-1]) == np.prod(out[:k]) and src[-1] == int(np.prod(out[k:]))):
        return None
    return node.input[0], int(np.prod(out[k + 1:]))


def split_to_slices(g: _Graph, proto: onnx.ModelProto) -> int:
    """Each Split with constant sizes (an input, or the attribute before opset 13) as one Slice per output (starts,
    ends and axes as initializers). Attention's unbind of q, k and v, Transpose → Split on axis 0 → Squeeze of axis 0
    (the axis auto_LiRPA keeps for the batch: it refuses to squeeze it), becomes per part a Slice of the Transpose's
    input on the axis that the Transpose moves first, a Reshape without it and the Transpose of the other axes."""
    shapes = _shapes(proto)
    n = 0
    for node in [n for n in g.g.node if n.op_type == "Split"]:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        axis = int(attrs.get("axis", 0))
        sizes = g.const(node.input[1]) if len(node.input) > 1 and node.input[1] else attrs.get("split")
        if sizes is None:
            continue  # equal parts of an unknown length: left as it is
        ends = np.cumsum(np.asarray(sizes, np.int64))
        starts = ends - np.asarray(sizes, np.int64)
        src = next((p for p in g.g.node if node.input[0] in p.output), None)
        squeezes = [g.consumers(o) for o in node.output]
        unbind = (axis == 0 and src is not None and src.op_type == "Transpose" and len(g.consumers(node.input[0])) == 1
                  and src.input[0] in shapes and all(len(c) == 1 and c[0].op_type == "Squeeze" and _squeezed_axis(g, c[0]) == [0]
                                                     for c in squeezes) and set(sizes) == {1})
        made, gone = [], [node]
        for i, (out, s, e) in enumerate(zip(node.output, starts, ends)):
            if unbind:
                perm = list(next(onnx.helper.get_attribute_value(a) for a in src.attribute if a.name == "perm"))
                k, shape = perm[0], list(shapes[src.input[0]])
                # part i of axis k: a block of the last axis of the Reshape before it, where that Reshape only splits
                # its input's last axis (x·W of q, k and v side by side, as [B, T, 3, H, d])
                cut = _last_axis_block(g, shapes, src.input[0], k)
                names = [g.fresh(f"{out}_{x}") for x in ("starts", "ends", "axes", "sliced", "shape", "reshaped")]
                source, lo, hi, along = (cut[0], cut[1] * s, cut[1] * e, -1) if cut else (src.input[0], s, e, k)
                for name, v in zip(names[:3], (lo, hi, along)):
                    g.set_const(name, np.array([v], np.int64))
                g.set_const(names[4], np.array(shape[:k] + shape[k + 1:], np.int64))
                made += [onnx.helper.make_node("Slice", [source, *names[:3]], [names[3]], f"{out}_slice"),
                         onnx.helper.make_node("Reshape", [names[3], names[4]], [names[5]], f"{out}_reshape"),
                         onnx.helper.make_node("Transpose", [names[5]], [squeezes[i][0].output[0]], f"{out}_transpose",
                                               perm=[p - (p > k) for p in perm[1:]])]
                gone.append(squeezes[i][0])
            else:
                names = [g.fresh(f"{out}_{x}") for x in ("starts", "ends", "axes")]
                for name, v in zip(names, (s, e, axis)):
                    g.set_const(name, np.array([v], np.int64))
                made.append(onnx.helper.make_node("Slice", [node.input[0], *names], [out], f"{out}_slice"))
        if unbind:
            gone.append(src)
        _replace(g, node, made)
        for dead in gone[1:]:
            g.g.node.remove(dead)
        n += 1
    return n


def token_gemms_to_matmuls(g: _Graph, proto: onnx.ModelProto) -> int:
    """Each Gemm on a token matrix [T, d] that a Reshape made of [1, T, d] (how onnxsim writes a Linear on tokens) as
    MatMul by Wᵀ and Add b on [1, T, d] itself; what reads its output, a Reshape, a Slice of the last axis, a Relu, or
    another such Gemm, reads the [1, T, e] value (anything else through a Reshape back to [T, e]). auto_LiRPA takes a
    value's first axis for the batch: on [T, d] its CROWN pass fails (a shape mismatch of T·e against e)."""
    shapes = _shapes(proto)  # as exported: the [T, d] values stay 2-D here while their twins are made
    made = 0
    lifted: dict[str, str] = {}  # a [T, e] value → its [1, T, e] twin

    def three_d(name: str) -> tuple[str | None, list[onnx.NodeProto]]:
        """The [1, T, d] value of the token matrix `name`, and the Reshape that makes it where none exists."""
        if name in lifted:
            return lifted[name], []
        src = next((p for p in g.g.node if name in p.output), None)
        before = shapes.get(src.input[0], [None]) if src is not None and src.op_type == "Reshape" else [None]
        if before[0] != 1 or int(np.prod(before[1:])) != int(np.prod(shapes[name])):
            return None, []
        if before[1:] == shapes[name]:
            return src.input[0], []
        target, out = g.fresh(f"{name}_tokens_shape"), g.fresh(f"{name}_tokens")
        g.set_const(target, np.array([1, *shapes[name]], np.int64))
        return out, [onnx.helper.make_node("Reshape", [src.input[0], target], [out], f"{out}_op")]

    for node in list(g.g.node):
        if node.op_type != "Gemm" or len(shapes.get(node.input[0], [])) != 2 or shapes[node.input[0]][0] == 1:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        w, b = g.const(node.input[1]), g.const(node.input[2]) if len(node.input) > 2 else None
        x3, lift = three_d(node.input[0])
        if x3 is None or w is None or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            continue
        wt = w.T if attrs.get("transB", 0) else w
        names = {k: g.fresh(f"{node.output[0]}_{k}") for k in ("wt", "mm", "out3", "bias")}
        g.set_const(names["wt"], np.ascontiguousarray(wt))
        chain = lift + [onnx.helper.make_node("MatMul", [x3, names["wt"]], [names["mm"] if b is not None else names["out3"]], f"{names['mm']}_op")]
        if b is not None:
            g.set_const(names["bias"], b.reshape(-1))
            chain.append(onnx.helper.make_node("Add", [names["mm"], names["bias"]], [names["out3"]], f"{names['out3']}_op"))
        out, out3 = node.output[0], names["out3"]
        T, e = shapes[node.input[0]][0], wt.shape[1]
        for c in g.consumers(out):
            if c.op_type == "Reshape" or (c.op_type == "Slice" and len(c.input) > 3 and g.const(c.input[3]) is not None
                                          and list(g.const(c.input[3]).reshape(-1)) in ([-1], [1])):
                if c.op_type == "Slice":
                    axes = g.fresh(f"{c.output[0]}_axes3")
                    g.set_const(axes, np.array([-1], np.int64))
                    c.input[3] = axes
                c.input[list(c.input).index(out)] = out3
            elif c.op_type == "Relu" and all(r.op_type == "Gemm" for r in g.consumers(c.output[0])):
                c.input[0] = out3
                lifted[c.output[0]] = c.output[0]
            elif c.op_type == "Gemm" and c.input[0] == out:
                lifted[out] = out3
            else:
                back = g.fresh(f"{out}_back")
                if not any(n.output[0] == out for n in chain):
                    shape = g.fresh(f"{out}_shape2")
                    g.set_const(shape, np.array([T, e], np.int64))
                    chain.append(onnx.helper.make_node("Reshape", [out3, shape], [out], f"{back}_op"))
        _replace(g, node, chain)
        made += 1
    if made:  # shapes recorded for the 2-D values are stale: value_info is optional, and the checker infers it again
        del g.g.value_info[:]
    return made


def constants_at_full_rank(g: _Graph, proto: onnx.ModelProto) -> int:
    """Each constant operand of an elementwise op below its variable operand's rank, reshaped to that rank (a new
    initializer where the old one is shared)."""
    inferred = onnx.shape_inference.infer_shapes(proto)
    rank = {vi.name: len(vi.type.tensor_type.shape.dim)
            for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
            if vi.type.tensor_type.HasField("shape")}
    uses = Counter(i for n in g.g.node for i in n.input)
    n = 0
    for node in g.g.node:
        if node.op_type not in ELEMENTWISE or len(node.input) != 2:
            continue
        a, b = node.input
        k, var = (1, a) if b in g.init and a not in g.init else (0, b) if a in g.init and b not in g.init else (None, None)
        if k is None or var not in rank:
            continue
        c = g.const(node.input[k])
        if c.ndim >= rank[var]:
            continue
        src = next((p for p in g.g.node if var in p.output), None)
        if node.op_type == "Add" and c.ndim == 1 and src is not None and src.op_type == "MatMul" and src.input[1] in g.init:
            continue  # x·W + b: onnx2pytorch makes it one Linear, whose bias must stay 1-D
        shaped = c.reshape((1,) * (rank[var] - c.ndim) + c.shape)
        name = node.input[k] if uses[node.input[k]] == 1 else g.fresh(f"{node.input[k]}_rank{rank[var]}")
        g.set_const(name, shaped)
        node.input[k] = name
        n += 1
    return n


def to_verifier_form(proto: onnx.ModelProto, input_shape: tuple[int, ...]) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """The rewrites of the module docstring on a copy of a batch-1 graph with input [1, *input_shape]; returns it
    and what each rewrite changed (counts)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = _Graph(out)
    facts = {"constants_to_initializers": constants_to_initializers(g),
             "training_mode_dropped": drop_default_training_mode(g),
             "normalization": normalization_into_conv(g, (1, *input_shape)) if len(input_shape) == 3 else None}
    facts["layer_norms_written_out"] = layer_norm_to_primitives(g, out)
    facts["splits_as_slices"] = split_to_slices(g, out)
    facts["token_gemms_as_matmuls"] = token_gemms_to_matmuls(g, out)
    facts["constants_reshaped"] = constants_at_full_rank(g, out)
    g.drop_unused()
    if facts["normalization"]:
        out.doc_string = ("inputs in natural units (normalization: " + {"folded": "folded into the first Conv",
                          "conv1x1": "the first Conv, 1×1 with weight diag(1/std) and bias −mean/std"}[facts["normalization"]]
                          + "); output: logits")
    return out, facts


def signature(proto: onnx.ModelProto) -> str:
    """A digest of a graph's form, not its weights: the opset, and per node its op, attributes and the shapes of its
    constant inputs. Two exports of one architecture in one form share it; a change of the form changes it (the
    record of which loaders read the form, benchmarks/peers/readers/, is checked against it)."""
    import hashlib

    init = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    parts = [f"opset {max(o.version for o in proto.opset_import if o.domain in ('', 'ai.onnx'))}"]
    for n in proto.graph.node:
        attrs = sorted((a.name, repr(onnx.helper.get_attribute_value(a))) for a in n.attribute)
        parts.append(f"{n.op_type} {attrs} {[init.get(i) for i in n.input]}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
