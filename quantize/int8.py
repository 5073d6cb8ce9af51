"""The int8 stage: onnxruntime static quantization of every exported model, and what it buys.

Recipe (onnxruntime's, nothing custom in the arithmetic): `quant_pre_process` (shape inference and
basic graph optimization), then `quantize_static` in QDQ format with per-channel int8 weights and
per-tensor activations calibrated on `quantize.calibration_samples` training examples through a
`CalibrationDataReader` (MinMax, Entropy or Percentile; Entropy needs a finer histogram than
quantize_static gives it, see `_entropy_ranges`). Only the linear layers (Gemm, Conv, MatMul),
ReLU and data movement are quantized: elementwise float ops (λ-GELU's Mul → Gelu → Div, plain Gelu)
stay float between DequantizeLinear and QuantizeLinear, which is what onnxruntime does with them anyway.
Biases stay fp32 in the file (`quantize.quantize_bias=false`): onnxruntime quantizes them to int32
when it fuses QGemm/QLinearConv, so the runtime graph and outputs are those of an int32-bias file,
which would also store a float scale and an int32 zero point per output channel.

Deployment vs verification: by default ReLUs are removed (`QDQKeepRemovableActivations=False`):
the QuantizeLinear after Gemm/Conv clips at its zero point, which is ReLU exactly, and onnxruntime
then runs Q → QGemm/QLinearConv ... → DQ with no float op in between. The verify stage verifies this
file itself (the "-int8" rows): its reader relaxes every Q/DQ pair soundly for onnxruntime's kernels
(`analysis/verification/quantized.py`). Weights are 7-bit by default (`quantize.reduce_range`): on an
x86 CPU without VNNI onnxruntime's u8s8 kernels add products in pairs in int16 with saturation, and
with 8-bit weights the outputs were measured outside every bound (the int8 tests show it).

Input normalization: an MLP's `Normalize` (x·scale + shift) is folded into its first Linear before
quantization (W' = W·diag(scale), b' = b + W·shift; exact algebra, checked in fp32), so the int8 MLP
takes natural-unit inputs and its QuantizeLinear sees raw pixels (scale 1/255 on [0, 1]: lossless for
8-bit images). A CNN cannot fold it (zero padding is not zero after the shift): its Mul/Add stay float
on the input and the report says so.

Writes `quantize/<variant>/<form>/model.int8.onnx` (and `model.fp32.onnx` when the fold changed the
graph), `quantize/sqnr.csv` (per-tensor SQNR fp32 vs int8, activations and weights) and
`quantize/quantize.json`.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
import torch
from onnxruntime import quantization as q

from pipeline import checkpoint, render
from pipeline.config import Config
from pipeline.data import dataset_for
from pipeline.evaluate import score
from pipeline.atomic_io import atomic_path, atomic_write_csv, atomic_write_json
from pipeline.rundir import RunDir

from . import export as export_mod
from . import ort as ort_util

QUANTIZED_OPS = ["Conv", "Gemm", "MatMul", "Relu", "Flatten", "Reshape", "MaxPool"]
CALIBRATION_BATCH = 128
ENTROPY_BINS = 1024  # histogram bins over [-max|x|, max|x|] for the KL search (onnxruntime's default 128 leaves no choice)


class ArrayReader(q.CalibrationDataReader):
    """Calibration (and SQNR) inputs from an array: {input: batch} dicts, restartable."""

    def __init__(self, x: np.ndarray, batch: int = CALIBRATION_BATCH):
        self.x = ort_util.as_input(x)
        self.batch = batch
        self._it: Iterator[dict[str, np.ndarray]] | None = None
        self.rewind()

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter([{ort_util.INPUT: self.x[i:i + self.batch]} for i in range(0, len(self.x), self.batch)])

    def __len__(self) -> int:
        return math.ceil(len(self.x) / self.batch)


def calibration_samples(cfg: Config, x: torch.Tensor) -> np.ndarray:
    """`quantize.calibration_samples` training examples, drawn without replacement with the run's seed."""
    n = min(cfg.quantize.calibration_samples, len(x))
    idx = torch.randperm(len(x), generator=torch.Generator().manual_seed(cfg.seed))[:n]
    return x[idx].numpy()


# ---------------------------------------------------------------------------------------------
# Quantization and its checks


def quantize_file(src: Path, dst: Path, calib: np.ndarray, cfg: Config, workdir: Path) -> Path:
    """quant_pre_process + quantize_static (QDQ, per-channel int8 weights); returns the pre-processed fp32 path."""
    qcfg = cfg.quantize
    pre = workdir / f"{dst.stem}.pre.onnx"
    q.quant_pre_process(str(src), str(pre))
    methods = {"minmax": q.CalibrationMethod.MinMax, "entropy": q.CalibrationMethod.Entropy,
               "percentile": q.CalibrationMethod.Percentile}
    act_type = {"int8": q.QuantType.QInt8, "uint8": q.QuantType.QUInt8}[qcfg.activation_type]
    # The histogram calibrators print progress to stdout; the stage reports its own.
    with atomic_path(dst) as tmp, contextlib.redirect_stdout(io.StringIO()):
        cache = _entropy_ranges(pre, calib, workdir) if qcfg.calibration_method == "entropy" else None
        q.quantize_static(str(pre), str(tmp), ArrayReader(calib), quant_format=q.QuantFormat.QDQ,
                          calibration_cache_path=cache,
                          op_types_to_quantize=QUANTIZED_OPS, per_channel=qcfg.per_channel, reduce_range=qcfg.reduce_range,
                          weight_type=q.QuantType.QInt8, activation_type=act_type,
                          calibrate_method=methods[qcfg.calibration_method],
                          extra_options={"QDQKeepRemovableActivations": qcfg.keep_activations,
                                         "QuantizeBias": qcfg.quantize_bias})
    return pre


def _entropy_ranges(model: Path, calib: np.ndarray, workdir: Path) -> Path:
    """Entropy (KL) calibration with a histogram fine enough to choose from, saved as a calibration cache.

    quantize_static builds its entropy calibrator with 128 histogram bins and 128 quantized bins, so
    the KL search has one candidate, the full range, and "entropy" silently equals MinMax. It passes
    no option to change that, hence this calibrator built by hand with ENTROPY_BINS bins.
    """
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

    calibrator = create_calibrator(model, QUANTIZED_OPS, augmented_model_path=str(workdir / "entropy_aug.onnx"),
                                   calibrate_method=q.CalibrationMethod.Entropy,
                                   extra_options={"num_bins": ENTROPY_BINS, "num_quantized_bins": 128})
    calibrator.collect_data(ArrayReader(calib))
    cache = workdir / "entropy_ranges.json"
    save_tensors_data(calibrator.compute_data(), cache)
    return cache


def sqnr_rows(float_path: Path, int8_path: Path, x: np.ndarray, workdir: Path) -> list[dict[str, Any]]:
    """Per-tensor SQNR in dB of the int8 graph against the fp32 graph it was made from, on the same inputs
    (onnxruntime's qdq_loss_debug), in graph order: activations (the float tensor vs the int8 graph's
    dequantized copy, so the error accumulated up to that tensor), then weights (float vs dequantized int8).

    onnxruntime's per-tensor "qdq_err" (the rounding at one tensor alone) is left out on purpose: where a
    ReLU was absorbed into the QuantizeLinear, its "input" is the pre-ReLU Gemm output, so that number
    measures the ReLU, not the quantization.
    """
    from onnxruntime.quantization import qdq_loss_debug as dbg

    aug_f, aug_q = workdir / "aug_fp32.onnx", workdir / "aug_int8.onnx"
    dbg.modify_model_output_intermediate_tensors(str(float_path), str(aug_f))
    dbg.modify_model_output_intermediate_tensors(str(int8_path), str(aug_q))
    acts_f = dbg.collect_activations(str(aug_f), ArrayReader(x))
    acts_q = dbg.collect_activations(str(aug_q), ArrayReader(x))
    graph = onnx.load(str(float_path)).graph
    order = {name: i for i, name in enumerate(o for n in graph.node for o in n.output)}
    worder = {t.name: i for i, t in enumerate(graph.initializer)}
    act_err = dbg.compute_activation_error(dbg.create_activation_matching(acts_q, acts_f))
    w_err = dbg.compute_weight_error(dbg.create_weight_matching(str(float_path), str(int8_path)))
    rows = [{"tensor": n, "kind": "activation", "sqnr_db": _db(act_err[n]["xmodel_err"])}
            for n in sorted(act_err, key=lambda n: order.get(n, len(order)))]
    rows += [{"tensor": n, "kind": "weight", "sqnr_db": _db(w_err[n])} for n in sorted(w_err, key=lambda n: worder.get(n, len(worder)))]
    return rows


def _db(v: float) -> float | str:
    """A finite SQNR as float; a lossless tensor (no noise) as "inf" so the JSON/CSV stays valid."""
    v = float(v)
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def _evaluate(path: Path, ds, cfg: Config) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The data's metric (accuracy, or perplexity for a language model) on the full validation and test
    sets, file size and op counts (raw, and as onnxruntime runs it)."""
    threads, metric = cfg.quantize.threads, ds.info.metric
    sess = ort_util.session(path, threads)
    logits = {split: ort_util.infer(sess, getattr(ds, split).x.numpy(), cfg.data.eval_batch_size) for split in ("val", "test")}
    counts = ort_util.optimized_op_counts(path, threads)
    facts = {f"{split}_{metric}": score(torch.from_numpy(logits[split]), getattr(ds, split).y, metric)["metric"]
             for split in ("val", "test")}
    facts.update({"bytes": ort_util.file_bytes(path), "ops": ort_util.op_counts(path), "optimized_ops": counts,
                  "float_ops": ort_util.float_ops(counts), "integer_only": ort_util.integer_only(counts)})
    return facts, logits


def quantize_one(cfg: Config, run: RunDir, ds, variant: str, form: str, entry: dict[str, Any], calib: np.ndarray,
                 workdir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Quantize one exported model and evaluate both precisions (timing comes later, for all models at once)."""
    qcfg = cfg.quantize
    fp32_path = run.path / entry["path"]
    out_dir = run.file("quantize", variant, form)
    src, normalization = fp32_path, "float prologue (Mul, Add on the input)"
    fold_check: dict[str, float] = {}
    if qcfg.fold_normalization:
        model, payload = checkpoint.load_model(run.path / entry["source"])
        folded = export_mod.fold_normalization(model, tuple(payload["spec"]["input_shape"]))
        if folded is not None:
            xval = ds.val.x[:cfg.export.check_samples]
            proto, _ = export_mod.to_onnx(folded, xval[:2], cfg.export.opset, cfg.export.simplify,
                                          export_mod.metadata_for(payload, variant, form, ds.info))
            src = out_dir / "model.fp32.onnx"
            export_mod.save(proto, src)
            fold_check = export_mod.compare(src, model, xval, cfg.export.atol, cfg.export.rtol, qcfg.threads)
            normalization = f"folded into {list(folded._modules)[1]}"
    int8_path = out_dir / "model.int8.onnx"
    pre = quantize_file(src, int8_path, calib, cfg, workdir)

    fp32, fp32_logits = _evaluate(fp32_path, ds, cfg)
    int8, int8_logits = _evaluate(int8_path, ds, cfg)
    rows = sqnr_rows(pre, int8_path, ds.val.x[:qcfg.sqnr_samples].numpy(), workdir)
    act_sqnr = [r["sqnr_db"] for r in rows if r["kind"] == "activation" and isinstance(r["sqnr_db"], float)]
    result = {
        "fp32_path": entry["path"], "int8_path": str(int8_path.relative_to(run.path)),
        "quantized_from": str(src.relative_to(run.path)), "normalization": normalization,
        **({"fold_check": fold_check} if fold_check else {}),
        "fp32": fp32, "int8": int8,
        **_changes(fp32, int8, ds.info.metric),
        "test_argmax_agreement": float((fp32_logits["test"].argmax(-1) == int8_logits["test"].argmax(-1)).mean()),
        "test_max_logit_change": float(np.abs(fp32_logits["test"] - int8_logits["test"]).max()),
        "size_ratio": fp32["bytes"] / int8["bytes"],
        "output_sqnr_db": next((r["sqnr_db"] for r in rows if r["tensor"] == ort_util.OUTPUT and r["kind"] == "activation"), None),
        "min_activation_sqnr_db": min(act_sqnr) if act_sqnr else None,
    }
    return result, [{"variant": variant, "form": form, **r} for r in rows]


def _changes(fp32: dict[str, Any], int8: dict[str, Any], metric: str) -> dict[str, float]:
    """int8 − fp32 in the metric's units; for accuracy also the drop in points (fp32 − int8, ×100)."""
    out = {f"{s}_change": int8[f"{s}_{metric}"] - fp32[f"{s}_{metric}"] for s in ("val", "test")}
    if metric == "accuracy":
        out.update({f"{s}_drop_pt": -100 * out[f"{s}_change"] for s in ("val", "test")})
    return out


def add_speed(cfg: Config, run: RunDir, ds, models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Latency and throughput of every fp32 and int8 model, timed round-robin in one window so that
    load from other processes hits them alike; adds speedups and returns the cross-model comparisons."""
    qcfg = cfg.quantize
    b = qcfg.throughput_batch
    tb = f"throughput_b{b}"
    paths = {(v, f, p): run.path / e[f"{p}_path"] for v, forms in models.items() for f, e in forms.items() for p in ("fp32", "int8")}
    table = ort_util.speed_table(paths, ds.val.x[:b].numpy(), b, qcfg.repeats, qcfg.threads, qcfg.timing_blocks)
    for (v, f, p), speed in table.items():
        models[v][f][p].update(speed)
    comparisons: dict[str, Any] = {}
    for v, forms in models.items():
        for e in forms.values():
            e["speedup_b1"] = e["fp32"]["latency_b1_ms"] / e["int8"]["latency_b1_ms"]
            e[f"speedup_b{b}"] = e["int8"][tb] / e["fp32"][tb]
        if "smooth" in forms and "relu" in forms:
            comparisons[v] = {f"int8_relu_vs_int8_smooth_{tb}": forms["relu"]["int8"][tb] / forms["smooth"]["int8"][tb],
                              f"int8_relu_vs_fp32_smooth_{tb}": forms["relu"]["int8"][tb] / forms["smooth"]["fp32"][tb]}
    return comparisons


def run_int8(cfg: Config, run: RunDir) -> dict[str, Any]:
    qcfg = cfg.quantize
    ds = dataset_for(cfg)
    exported = json.loads(run.file("export", "export.json").read_text())["models"]
    calib = calibration_samples(cfg, ds.train.x)
    models: dict[str, dict[str, Any]] = {}
    sqnr: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="int8-") as tmp:
        for variant, forms in exported.items():
            for form, entry in forms.items():
                work = Path(tmp) / variant / form
                work.mkdir(parents=True)
                models.setdefault(variant, {})[form], rows = quantize_one(cfg, run, ds, variant, form, entry, calib, work)
                sqnr += rows
    atomic_write_csv(run.file("quantize", "sqnr.csv"), sqnr, ["variant", "form", "tensor", "kind", "sqnr_db"])
    comparisons = add_speed(cfg, run, ds, models)
    result = {
        "metric": ds.info.metric,
        "settings": {"format": "QDQ", "weights": ("int8 per-channel" if qcfg.per_channel else "int8 per-tensor")
                                                + (", 7-bit range (reduce_range)" if qcfg.reduce_range else ""),
                     "reduce_range": qcfg.reduce_range,
                     "activations": f"{qcfg.activation_type} per-tensor", "calibration_method": qcfg.calibration_method,
                     "calibration_samples": len(calib), "quantized_op_types": QUANTIZED_OPS,
                     "keep_removable_activations": qcfg.keep_activations, "quantize_bias": qcfg.quantize_bias,
                     "fold_normalization": qcfg.fold_normalization, "sqnr_samples": min(qcfg.sqnr_samples, len(ds.val)),
                     "timing": {**ort_util.describe_speed_setup(qcfg.threads), "repeats_batch": qcfg.repeats,
                                "repeats_b1": 4 * qcfg.repeats, "blocks": qcfg.timing_blocks,
                                "throughput_batch": qcfg.throughput_batch},
                     "cpu": ort_util.cpu_name(), "onnxruntime": ort_util.ort.__version__},
        "models": models,
        "comparisons": comparisons,
    }
    atomic_write_json(run.file("quantize", "quantize.json"), result)
    return result


def report_section(cfg: Config, run: RunDir) -> str | None:
    """The int8 stage's section of report.md: accuracy, size and speed of every model in both precisions."""
    q = run.read_json("int8", "quantize.json")
    if q is None:
        return None
    metric, st = q["metric"], q["settings"]
    tb = f"throughput_b{st['timing']['throughput_batch']}"
    rows = [[v, form, m["fp32"][f"test_{metric}"], m["int8"][f"test_{metric}"], m["test_argmax_agreement"], m["size_ratio"],
             m["int8"].get("latency_b1_ms"), m.get("speedup_b1"), m["int8"].get(tb), m.get(f"speedup_b{st['timing']['throughput_batch']}"),
             m["min_activation_sqnr_db"], "yes" if m["int8"]["integer_only"] else "no: " + ", ".join(m["int8"]["float_ops"])]
            for v, forms in q["models"].items() for form, m in forms.items()]
    return "\n\n".join([
        "## int8 (onnxruntime static quantization)",
        f"{st['format']}, weights {st['weights']}, activations {st['activations']}, calibration {st['calibration_method']} on "
        f"{st['calibration_samples']} training examples; timed on {st['cpu']} with {st['timing']['intra_op_threads']} thread(s). "
        "The verify section certifies the int8 model of each ReLU form itself (its \"-int8\" rows); a certificate for a "
        "float model says nothing about these graphs.",
        render.table(["variant", "form", f"fp32 test {metric}", f"int8 test {metric}", "argmax agreement (test)", "size ratio",
                      "int8 latency b1 (ms)", "speedup b1", f"int8 {tb} (/s)", "speedup", "min activation SQNR (dB)",
                      "integer-only"], rows),
    ])
