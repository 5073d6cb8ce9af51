"""ONNX in and out, the one place: the torch → ONNX exporter (`to_onnx`, `check_graph`), onnxruntime sessions and flat
inference (`session`, `forward_flat`), and the names every exported graph gives its input and output. The export
library (`quantize/export.py`), the onnxruntime helper (`quantize/ort.py`) and the verification engine (which reads a
torch model through its export and replays counterexamples in onnxruntime) all use these.

Decisions (see also `quantize/export.py` and docs/architecture.md, "Pitfalls"): the TorchScript exporter
(`dynamo=False`; the dynamo one needs onnxscript for graphs this simple), onnxsim, `onnx.checker` with full_check,
one self-contained file; nn.MultiheadAttention traced with its fused eval-mode fast path off (`mha_fastpath`).
Sessions: the CPU provider, one intra-op and one inter-op thread by default, no thread spinning, sequential.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from .devices import cpu_model
from .errors import PipelineError

INFER_BATCH = 2048  # inputs per onnxruntime call where a caller names no batch size
INPUT = "input"  # graph input and output names every exported model uses
OUTPUT = "logits"


class ExportError(PipelineError):
    pass


@contextlib.contextmanager
def mha_fastpath(enabled: bool) -> Iterator[None]:
    """nn.MultiheadAttention's fused eval-mode fast path on or off for a block, restored afterwards: the
    TorchScript exporter has no symbolic for the fused op (`aten::_native_multi_head_attention`), while
    the unfused path exports as MatMul/Softmax and computes the same function."""
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


def to_onnx(model: nn.Module, example: torch.Tensor, opset: int, simplify: bool = True,
            metadata: dict[str, str] | None = None, dynamic_batch: bool = True) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Trace `model` (eval mode, CPU) to an ONNX ModelProto; onnxsim; checks. The batch axis is symbolic
    unless `dynamic_batch=False` (verifiers want a fixed batch of 1: pass a batch-1 example).

    Returns the model and facts about it (node counts before and after onnxsim).
    """
    model = cpu_model(model).eval()  # the caller's model stays where it is
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad(), mha_fastpath(False):
        # Expected and harmless here: the legacy-exporter deprecation notice, and tracer notes about
        # λ being a constant / the frozen flag being read once (both are fixed in an exported model).
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", message=".*feature will be removed.*")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch.onnx.export(model, (example.cpu(),), buf, dynamo=False, opset_version=opset,
                          input_names=[INPUT], output_names=[OUTPUT], do_constant_folding=True,
                          dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}} if dynamic_batch else None)
    proto = onnx.load_from_string(buf.getvalue())
    facts: dict[str, Any] = {"nodes_traced": len(proto.graph.node)}
    if simplify:
        from onnxsim import simplify as onnxsim_simplify

        simplified, ok = onnxsim_simplify(proto)
        if not ok:
            raise ExportError("onnxsim could not validate the simplified graph; rerun with export.simplify=false")
        proto = simplified
    facts["nodes"] = len(proto.graph.node)
    for key, value in (metadata or {}).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.doc_string = "inputs in natural units (normalization is the graph's first Mul/Add or folded into its first Gemm); output: logits"
    check_graph(proto, dynamic_batch)
    return proto, facts


def check_graph(proto: onnx.ModelProto, dynamic_batch: bool = True) -> None:
    """Full ONNX check, single file, and (unless fixed on purpose) a symbolic batch dimension on input and output."""
    onnx.checker.check_model(proto, full_check=True)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        raise ExportError("exported graph refers to external data; it must be one self-contained file")
    for vi in (proto.graph.input[0], proto.graph.output[0]) if dynamic_batch else ():
        dim0 = vi.type.tensor_type.shape.dim[0]
        if not dim0.dim_param:
            raise ExportError(f"{vi.name}: batch axis is fixed at {dim0.dim_value}, expected a symbolic 'batch'")


def session_options(threads: int = 1, optimized_path: Path | None = None,
                    level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = level
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3  # the "optimized model is hardware specific" warning is expected here
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    return so


def session(path: Path | str, threads: int = 1, optimized_path: Path | None = None) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), session_options(threads, optimized_path), providers=["CPUExecutionProvider"])


def as_input(x: np.ndarray) -> np.ndarray:
    """Float inputs as contiguous float32; integer inputs (token ids) keep their int64 type."""
    x = np.asarray(x)
    return np.ascontiguousarray(x, dtype=np.float32 if np.issubdtype(x.dtype, np.floating) else np.int64)


def io_names(sess: ort.InferenceSession) -> tuple[str, str]:
    """The graph's first input and first output (ours are INPUT/OUTPUT; a VNN-COMP model names its own)."""
    return sess.get_inputs()[0].name, sess.get_outputs()[0].name


def infer(sess: ort.InferenceSession, x: np.ndarray, batch_size: int = INFER_BATCH) -> np.ndarray:
    """Logits for all of x ([N, ...]), in batches; shape [N, K] (or [N, T, V] for a language model)."""
    x = as_input(x)
    inp, out = io_names(sess)
    fixed = sess.get_inputs()[0].shape[0]
    if isinstance(fixed, int) and fixed > 0:  # a fixed-batch graph (verifier exports take one input at a time)
        batch_size = fixed
    return np.concatenate([sess.run([out], {inp: x[i:i + batch_size]})[0] for i in range(0, len(x), batch_size)])


def forward_flat(sess: ort.InferenceSession | Path | str, x: np.ndarray) -> np.ndarray:
    """One flat input (C-order, as VNN-LIB numbers X_i) through a model; the flat float64 output.

    The input is reshaped to the graph's declared input shape (a free dimension counts as 1) and cast to
    its element type, so fixed-batch verifier graphs and our dynamic-batch ones both work.
    """
    return forward_many(sess, np.asarray(x).reshape(1, -1))[0]


def forward_many(sess: ort.InferenceSession | Path | str, xs: np.ndarray) -> np.ndarray:
    """`forward_flat` for each row of xs ([B, inputs]): [B, outputs] float64. One call when the graph's first
    dimension is free (ours), one call per row when it is fixed (a verifier's batch-1 graph)."""
    if not isinstance(sess, ort.InferenceSession):
        sess = session(sess)
    meta, out = sess.get_inputs()[0], io_names(sess)[1]
    dtype = np.float64 if meta.type == "tensor(double)" else np.float32
    xs = np.asarray(xs, dtype=np.float64).reshape(len(xs), -1)
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in meta.shape]
    if meta.shape and not (isinstance(meta.shape[0], int) and meta.shape[0] > 0):  # a free first dimension: one call
        y = sess.run([out], {meta.name: xs.reshape(len(xs), *shape[1:]).astype(dtype)})[0]
        return np.asarray(y, dtype=np.float64).reshape(len(xs), -1)
    # a fixed shape (a verifier's batch-1 graph, or one without a batch dimension): a row at a time, as declared
    return np.stack([np.asarray(sess.run([out], {meta.name: x.reshape(shape).astype(dtype)})[0], dtype=np.float64)
                     .reshape(-1) for x in xs])
