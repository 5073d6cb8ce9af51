"""The verifiers' form of an exported graph: rewrites that keep its function and let the ONNX loaders of other
verifiers read it (`to_verifier_form`, called by `quantize.export.export_for_verifiers`). Which loaders read the
result is measured by benchmarks/peers/readers.py (onnx2pytorch, whose fork α,β-CROWN loads with; onnx2torch;
neuralsat; auto_LiRPA's convolutional path behind onnx2pytorch), recorded in benchmarks/peers/readers/.

- Opset 17 (`OPSET`, or the export's own where that is lower): the first with LayerNormalization as one op, the
  newest any ReLU graph of ours needs. Later opsets only renumber ops these graphs use (Reshape 19, Split 18,
  Constant 19), which onnx2torch 1.5.15 then refuses ("Converter is not implemented ... Reshape, version=19").
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
  multiplies only by 4-D constants and asserts so.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.onnx_io import ExportError

OPSET = 17
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
