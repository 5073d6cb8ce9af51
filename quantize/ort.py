"""The one onnxruntime helper (export, int8, sparsity and verify stages): sessions, batched and flat
inference, accuracy, latency and the op types of onnxruntime's optimized graph.

Timing method: one intra-op and one inter-op thread, thread spinning off (a spinning pool burns a
core between runs and flatters small batches), sequential execution, warm-up runs first, then
`repeats` timed `session.run` calls on one fixed batch of validation inputs. All models of a stage
are timed round-robin, one call each per round. The calls are cut into `blocks` consecutive blocks
and the smallest block median is reported (`block_median`): the median of the least disturbed
stretch, since on a shared machine load can last longer than half the run. The overall median and
p10/p90 are recorded beside it.
"""

from __future__ import annotations

import platform
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

# Sessions, flat and batched inference and the graphs' input/output names live with the exporter (`pipeline.onnx_io`).
from pipeline.onnx_io import INFER_BATCH, INPUT, OUTPUT, as_input, forward_flat, infer, io_names, session, session_options  # noqa: F401

# Ops that compute on integer tensors in onnxruntime's optimized graph (com.microsoft and ONNX).
INTEGER_OPS = frozenset({
    "QGemm", "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul",
    "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool",
    "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSoftmax", "QLinearReduceMean", "QLinearWhere",
})
BOUNDARY_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})  # float <-> int8 at the graph's edges
# Data movement only: they run on whatever type flows through (int8 between Q/DQ).
LAYOUT_OPS = frozenset({"Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "MaxPool"})


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float((logits.argmax(-1) == np.asarray(y)).mean())


def block_median(t: np.ndarray, blocks: int) -> float:
    """Median of each of `blocks` consecutive blocks of timings; the smallest of them.

    A median alone does not survive load that lasts longer than half the run (two cores shared with
    other jobs): fp32 and int8 then slow down by different factors. The quietest block's median is
    the machine's own speed; the overall median and p10/p90 are kept beside it to show the load.
    """
    return float(min(np.median(chunk) for chunk in np.array_split(t, max(1, min(blocks, len(t))))))


def speed_table(paths: dict[Any, Path], sample: np.ndarray, batch: int, repeats: int, threads: int = 1,
                blocks: int = 10, warmup: int = 5) -> dict[Any, dict[str, float]]:
    """Latency at batch 1 (ms) and throughput at `batch` (samples/s) of several models, timed
    round-robin (one call of each per round, so load from elsewhere falls on all of them alike).
    Headline numbers are `block_median`s; batch 1 gets 4x the repeats (it is cheap)."""
    sessions = {k: session(p, threads) for k, p in paths.items()}
    out: dict[Any, dict[str, float]] = {k: {} for k in paths}
    for b, reps in ((1, 4 * repeats), (batch, repeats)):
        feed = {INPUT: as_input(_tile(sample, b))}
        for s in sessions.values():
            for _ in range(warmup):
                s.run([OUTPUT], feed)
        times = {k: np.empty(reps) for k in sessions}
        for i in range(reps):
            for k, s in sessions.items():
                t0 = time.perf_counter()
                s.run([OUTPUT], feed)
                times[k][i] = time.perf_counter() - t0
        for k, t in times.items():
            head = block_median(t, blocks) * 1e3
            med, p10, p90 = (float(v) * 1e3 for v in np.percentile(t, [50, 10, 90]))
            key = "latency_b1" if b == 1 else f"batch{b}"
            out[k].update({f"{key}_ms": head, f"{key}_median_all_ms": med, f"{key}_p10_ms": p10, f"{key}_p90_ms": p90})
            if b != 1:
                out[k][f"throughput_b{b}"] = b / (head / 1e3)
    return out


def speed(path: Path, sample: np.ndarray, batch: int, repeats: int, threads: int = 1, blocks: int = 10) -> dict[str, float]:
    """speed_table for one model."""
    return speed_table({0: path}, sample, batch, repeats, threads, blocks)[0]


def _tile(x: np.ndarray, n: int) -> np.ndarray:
    reps = -(-n // len(x))
    return np.concatenate([x] * reps)[:n]


def op_counts(model: onnx.ModelProto | Path | str) -> dict[str, int]:
    """Op types of a graph (top level), sorted by count."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    return dict(Counter(n.op_type for n in model.graph.node).most_common())


def optimized_op_counts(path: Path, threads: int = 1) -> dict[str, int]:
    """Op types of the graph onnxruntime actually runs (ORT_ENABLE_ALL, CPU), via optimized_model_filepath.

    The saved graph is specific to this CPU (it may hold NCHWc layouts), so it is counted and dropped.
    """
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "optimized.onnx"
        session(path, threads, optimized_path=out)
        return op_counts(out)


def float_ops(counts: dict[str, int]) -> dict[str, int]:
    """Ops in an optimized graph that compute on float tensors (neither integer, Q/DQ nor data movement)."""
    return {op: n for op, n in counts.items() if op not in INTEGER_OPS | BOUNDARY_OPS | LAYOUT_OPS}


def integer_only(counts: dict[str, int]) -> bool:
    """True when every compute op is integer: float appears only at the Quantize/Dequantize boundary."""
    return not float_ops(counts) and any(op in INTEGER_OPS for op in counts)


def file_bytes(path: Path) -> int:
    return Path(path).stat().st_size


def file_facts(path: Path, threads: int = 1) -> dict[str, Any]:
    """A model file's size and op counts, raw and as onnxruntime optimizes them, with the float ops left and whether
    it runs integer-only: what the int8 stage and `api.quantize` report for each precision."""
    counts = optimized_op_counts(path, threads)
    return {"bytes": file_bytes(path), "ops": op_counts(path), "optimized_ops": counts, "float_ops": float_ops(counts),
            "integer_only": integer_only(counts)}


def describe_speed_setup(threads: int = 1) -> dict[str, Any]:
    return {"intra_op_threads": threads, "inter_op_threads": 1, "spinning": False, "execution_mode": "sequential",
            "graph_optimization_level": "ORT_ENABLE_ALL", "provider": "CPUExecutionProvider",
            "statistic": "smallest median over consecutive blocks of session.run calls on one fixed batch of validation "
                         "inputs, after warm-up (overall median and p10/p90 recorded too)",
            "schedule": "all models round-robin, one call each per round"}


def cpu_name() -> str:
    """The CPU model and its int8-relevant SIMD flags (AVX-512 VNNI / AVX-VNNI / AMX decide int8 speed)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("", platform.machine(), platform.processor()):
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return f"{name} ({', '.join(simd) or 'no AVX2'})"
