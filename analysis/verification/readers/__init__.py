"""Reading models into a `graph.Graph`: ONNX graphs through a table from op type to handler (`TABLE`), torch modules
through their ONNX export (so anything the exporter writes in ops listed here can be verified).

The package: `reader` is the driver (`OnnxReader` walks the nodes, folds constant ones, hands each other node to its
op's handler and refuses in one line); `values` the values a tensor takes; `constants` the numpy folding of constant
subgraphs (shape arithmetic, weights behind Cast/Transpose/DequantizeLinear, masks); one module per op family:
`affine` (Gemm, MatMul by a constant, Conv, elementwise arithmetic), `activations` (Relu, Clip, LeakyRelu,
PRelu, Abs, Max/Min, HardSigmoid, HardSwish), `gates` (the smooth
gates' export patterns), `smooth` (Sigmoid, Tanh, Softplus, Elu, Selu, Softsign, Erf read alone; Mish; Erf-written GELU), `attention` (products of variables, Softmax, Exp/Sqrt/Reciprocal/Pow), `norm`
(BatchNormalization, LayerNormalization), `pooling` (average and max pooling, ReduceMean/ReduceSum), `shape` (data
movement), `qdq` (int8 QuantizeLinear/DequantizeLinear). Adding an op is one handler in its family's module and one
entry in `TABLE`.

The ONNX reader takes one float input (a leading batch axis of 1 or symbolic, or none) and one output, and reads the
graph at batch size 1 with concrete shapes: every tensor keeps its full ONNX shape (the batch axis as 1), so a
Reshape that folds the batch axis into the tokens, a Transpose that moves it, or a Shape → Gather → Equal → Where
chain on the batch size (what nn.MultiheadAttention exports) are read like any other.

An int8 QDQ graph (`quantized` says which execution the reading covers) is read by the same handlers; the reader then
also follows, for every float32 value between a DequantizeLinear and the next QuantizeLinear, how far onnxruntime's
float32 value may be from the graph's exact one (`Float`), so a QuantizeLinear of a residual Add, a BatchNorm, a
ReLU or an average is read as a rounding of that value like one of a Gemm or a Conv. The input's own normalization
(Mul/Add by constants before the first QuantizeLinear) is folded into the first quantization, which stays exact.

What is not read raises `UnsupportedModel`, one line: "unsupported ONNX op X (node N); the verifier reads …" for an
op type no handler reads, "X (node N) is not read: <the form met>; <the fix>" for a handled op in a form it does not
take, with the node, the op, the form and the fix as the exception's fields. For a torch module the message names
the module path. `supported_ops()` is the engine's own list.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pipeline.opset import OPSET

from ..graph import Graph
from ..ops.base import UnsupportedModel
from . import activations, affine, attention, norm, pooling, qdq, shape, smooth
from .constants import CONSTANT_OPS
from .gates import gate_op
from .reader import Handler, OnnxReader, gate_patterns, ops_read

__all__ = ["CONSTANT_OPS", "HANDLERS", "TABLE", "OnnxReader", "from_onnx", "from_torch", "gate_patterns", "module_path",
           "read", "readable_ops", "supported_ops"]

# op type → (its handler, the form it reads, for `supported_ops`): one entry per op read on a variable
TABLE: dict[str, tuple[Handler, str]] = {
    "Identity": (shape.identity, ""),
    "Dropout": (shape.identity, ""),
    "Cast": (shape.identity, ""),
    "Shape": (shape.shape_of, ""),
    "Size": (shape.size_of, ""),
    "Gemm": (affine.gemm, "x·Wᵀ + b, W constant"),
    "MatMul": (affine.matmul, "x·W or W·x with W constant, or a product of two variables"),
    "Add": (affine.arith, "a constant or another variable (broadcast)"),
    "Sub": (affine.arith, "a constant or another variable (broadcast)"),
    "Mul": (affine.arith, "a constant, another variable, or a gate x·g(λx)"),
    "Div": (affine.arith, "by a constant or a variable provably positive on the box"),
    "Neg": (affine.neg, ""),
    "Relu": (activations.relu, ""),
    "Clip": (activations.clip, "any bounds (ReLUs)"),
    "LeakyRelu": (activations.leaky_relu, "a·x + (1 − a)·ReLU(x)"),
    "PRelu": (activations.prelu, "a constant slope (a·x + (1 − a)·ReLU(x))"),
    "Abs": (activations.abs_, "2·ReLU(x) − x"),
    "Max": (activations.max_min, "variables and constants (b + ReLU(a − b))"),
    "Min": (activations.max_min, "variables and constants (a − ReLU(a − b))"),
    "HardSigmoid": (activations.hard_sigmoid, "a clamp of α·x + β to [0, 1] (ReLUs)"),
    "HardSwish": (activations.hard_swish, ""),
    "Sqrt": (attention.curve, ""),
    "Reciprocal": (attention.curve, ""),
    "Exp": (attention.curve, ""),
    "Pow": (attention.power, "exponents 3, 2, 0.5, -0.5, -1, 1"),
    "Softmax": (attention.softmax, "any axis"),
    "LayerNormalization": (norm.layer_norm, "its first output"),
    "ReduceMean": (pooling.reduce, ""),
    "ReduceSum": (pooling.reduce, ""),
    "Gather": (shape.gather, "constant indices"),
    "Slice": (shape.slice_, ""),
    "Split": (shape.split, ""),
    "Expand": (shape.expand, ""),
    "Tile": (shape.tile, ""),
    "Where": (shape.where, "a constant condition"),
    "QuantizeLinear": (qdq.quantize, "int8/uint8, read with its DequantizeLinear"),
    "DequantizeLinear": (qdq.dequantize, "of its own QuantizeLinear"),
    "Conv": (affine.conv, "2-d, any padding"),
    "ConvTranspose": (affine.conv_transpose, "2-d (a Conv over the input spread by the stride)"),
    "AveragePool": (pooling.avgpool, "symmetric padding counted in the average"),
    "GlobalAveragePool": (pooling.avgpool, ""),
    "MaxPool": (pooling.maxpool, "2-d, explicit pads, ceil_mode=False (a tree of ReLUs)"),
    "GlobalMaxPool": (pooling.maxpool, "2-d (a tree of ReLUs)"),
    "BatchNormalization": (norm.batchnorm, ""),
    "Flatten": (shape.flatten, ""),
    "Reshape": (shape.reshape, ""),
    "Squeeze": (shape.squeeze, ""),
    "Unsqueeze": (shape.squeeze, ""),
    "Transpose": (shape.transpose, ""),
    "Concat": (shape.concat, "variables and constants"),
    "Elu": (smooth.standalone, ""),
    "Selu": (smooth.standalone, ""),
    "Softsign": (smooth.standalone, ""),
    "Tanh": (smooth.standalone, ""),
    "Erf": (smooth.standalone, ""),
    "Softplus": (smooth.standalone, ""),
    "Sigmoid": (smooth.standalone, ""),
    "Mish": (smooth.mish, ""),
    "Pad": (shape.pad, "constant, reflect, edge or wrap mode; a Pad of nothing disappears"),
    "Resize": (shape.resize, "nearest mode"),
    "Upsample": (shape.resize, "nearest mode"),
}
HANDLERS: dict[str, Handler] = {op: handler for op, (handler, _) in TABLE.items()}


def supported_ops() -> dict[str, str]:
    """The ONNX op types the reader reads on a variable (the engine's own list: the table's and the gate families'
    patterns, `readable_ops`), each with the form it takes; any op also folds when all its inputs are constants
    (`CONSTANT_OPS`)."""
    forms = {op: form for op, (_, form) in TABLE.items() if form}
    for ops, fam in gate_patterns().items():
        for op in ops:
            forms.setdefault(op, f"inside a gate x·g(λx) ({' → '.join(ops)})")
    return {op: forms.get(op, "") for op in readable_ops()}


def readable_ops() -> list[str]:
    """Every op type the reader reads (the table's and the gate patterns')."""
    return ops_read(HANDLERS)


def from_onnx(model: Any) -> Graph:
    """A Graph from an ONNX path, bytes or ModelProto (one float input, one output)."""
    import onnx

    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    elif isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    model = norm.fuse_layer_norms(model)  # a LayerNorm written as its ops is bounded as the op
    reader = OnnxReader(model, HANDLERS, CONSTANT_OPS, gate_op, smooth.standalone, smooth.chain_alone)
    graph = reader.read()
    if reader.sixteen_bit:
        _refuse_unbounded_rewrites(model)
    return graph


def _refuse_unbounded_rewrites(model: Any) -> None:
    """A 16-bit QDQ graph runs unfused, except where onnxruntime's CPU optimizer rewrites DequantizeLinear → MatMul (a
    transformer's Linear on its tokens, even written as a Gemm) as MatMulNBits, which by default
    (`session.qdq_matmulnbits_accuracy_level` 4) computes with its input requantized to int8 per block: a rounding not
    bounded here. Asked of onnxruntime itself,
    from the graph it would run; refused in one line with the fix."""
    import tempfile

    import onnx
    import onnxruntime as ort

    from pipeline.onnx_io import session_options  # the settings every session of the pipeline runs with

    with tempfile.TemporaryDirectory() as d:
        optimized = Path(d) / "optimized.onnx"
        ort.InferenceSession(model.SerializeToString(), session_options(1, optimized), providers=["CPUExecutionProvider"])
        nbits = [n.name for n in onnx.load(str(optimized)).graph.node if n.op_type == "MatMulNBits"]
    if nbits:
        raise UnsupportedModel(
            f"MatMulNBits ({len(nbits)} node(s) onnxruntime makes of DequantizeLinear → MatMul in this 16-bit graph, e.g. "
            f"'{nbits[0]}') is not read: it computes with its input requantized to int8 per block, a rounding not "
            "bounded here; quantize with quantize.activation_type int8",
            node=nbits[0], op="MatMulNBits", what="a MatMul on quantized weights in a 16-bit graph",
            fix="quantize with quantize.activation_type int8")


def module_path(onnx_node_name: str) -> str:
    """The torch module an exported ONNX node came from. The exporter names nodes by scope, '/net/net.2/fc/Gemm':
    a child of a Sequential is named by its full path ('net.2'), other children by their attribute ('fc')."""
    parts = [p for p in onnx_node_name.split("/") if p][:-1]
    path = ""
    for p in parts:
        path = p if not path or p.startswith(path + ".") else f"{path}.{p}"
    return path or "(the model itself)"


def _embedding_of_input(m: torch.nn.Module, shape: tuple[int, ...]) -> str | None:
    """The nn.Embedding the model's own input is looked up in, by one watched forward; None when none is (a wrapper
    that passes `inputs_embeds` holds an embedding it never calls)."""
    embeddings = {mod: name for name, mod in m.named_modules() if isinstance(mod, torch.nn.Embedding)}
    if not embeddings:
        return None
    x = torch.zeros(1, *shape)
    hit: list[str] = []

    def watch(mod: torch.nn.Module, args: tuple) -> None:
        if args and args[0] is x:
            hit.append(embeddings[mod])

    hooks = [mod.register_forward_pre_hook(watch) for mod in embeddings]
    try:
        with torch.no_grad():
            m(x)
    except Exception:  # noqa: BLE001 - an embedding fed floats raises; the hook has seen it by then
        pass
    finally:
        for h in hooks:
            h.remove()
    return hit[0] if hit else None


def from_torch(model: torch.nn.Module, input_shape: Sequence[int]) -> Graph:
    """A Graph from a torch module (eval semantics) through its ONNX export (`pipeline.onnx_io.to_onnx`, fixed batch
    1, the pipeline's opset). `input_shape` excludes the batch axis. A module the exporter cannot write, or that exports to an op
    no handler reads, raises UnsupportedModel naming the op and the module path."""
    from pipeline.onnx_io import to_onnx  # the exporter (torch.onnx, onnxsim), imported on first use

    shape = tuple(int(d) for d in input_shape)
    m = copy.deepcopy(model).float().cpu().eval()
    looked_up = _embedding_of_input(m, shape)
    if looked_up is not None:  # its input is token ids: no float box to bound
        fix = "verify the model from its embedding on (a module that takes the embedded tokens as its input)"
        raise UnsupportedModel(f"{type(model).__name__} takes token ids (its input goes into the nn.Embedding "
                               f"'{looked_up}'): the verifier's properties are boxes over a float input; {fix}",
                               what="an integer input (token ids into an nn.Embedding)", fix=fix)
    try:
        proto, _ = to_onnx(m, torch.zeros(1, *shape), opset=OPSET, simplify=True, dynamic_batch=False)
    except Exception as e:  # the exporter's own errors are long; the first line says what failed
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UnsupportedModel(f"{type(model).__name__} could not be exported to ONNX for verification: {first[:300]}",
                               what="a module the ONNX exporter cannot write", fix=None) from None
    try:
        return from_onnx(proto)
    except UnsupportedModel as e:
        node = getattr(e, "onnx_node", None)
        if node is None:
            raise
        where = module_path(node.name)
        why = getattr(e, "why", "")
        if node.op_type in readable_ops():
            msg = f"{type(model).__name__}: {node.op_type} in module '{where}' is not read: {why}"
        else:
            msg = f"{type(model).__name__}: unsupported op {node.op_type} in module '{where}'; the verifier reads {', '.join(readable_ops())}"
        raise UnsupportedModel(msg, node=where, op=node.op_type, what=e.what, fix=e.fix) from None


def read(model: Any, input_shape: Sequence[int] | None = None) -> Graph:
    """A Graph from a Graph, an nn.Module (needs `input_shape`), or an ONNX path/bytes/ModelProto."""
    if isinstance(model, Graph):
        return model
    if isinstance(model, torch.nn.Module):
        if input_shape is None:
            raise ValueError("reading a torch model needs its input_shape (without the batch axis)")
        return from_torch(model, input_shape)
    return from_onnx(model)
