"""The int8 stage: onnxruntime static quantization of every exported model, and what it buys (the library, its recipe
and its decisions: `quantize/int8.py`).

Reads: `export/export.json` and its fp32 files (the plain graph, and the one with an MLP's input normalization folded
into its first Linear where the export stage wrote it), the training split for calibration. Writes `quantize/<variant>/<form>/model.int8.onnx`
(and `model.fp32.onnx` when the fold changed the graph), `quantize/sqnr.csv` (per-tensor SQNR fp32 vs int8,
activations and weights) and `quantize/quantize.json`; and the stage's section of report.md.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import render
from pipeline.atomic_io import atomic_write_csv, atomic_write_json
from pipeline.config import Config
from pipeline.data import dataset_for
from pipeline.errors import RunDirError
from pipeline.rundir import Output, RunDir
from quantize import ort as ort_util
from quantize.int8 import (LOW_SQNR_DB, QUANTIZED_OPS, agreement_warning, calibration_samples, clip_fidelity,
                           evaluate_file, input_sqnr_rows, quantize_forms, sqnr_rows)

OUTPUTS = (Output("quantize/quantize.json"), Output("quantize/sqnr.csv"), Output("quantize/<variant>/<form>/model.int8.onnx"),
           Output("quantize/<variant>/<form>/model.fp32.onnx", when="the folded graph was the one quantized"))


def quantize_one(cfg: Config, run: RunDir, ds, variant: str, form: str, entry: dict[str, Any], calib: np.ndarray,
                 workdir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Quantize one exported model and evaluate both precisions (timing comes later, for all models at once)."""
    qcfg = cfg.quantize
    fp32_path = run.path / entry["path"]
    out_dir = run.file("quantize", variant, form)
    sources, fold_check, fold_into = {"float": fp32_path}, {}, ""
    folded = entry.get("folded")  # the export stage's graph with the normalization folded in, where it folds
    if qcfg.fold_normalization and folded is not None:
        sources = {"folded": run.path / folded["path"], **sources}
        fold_check, fold_into = folded["check"], folded["into"]
    int8_path = out_dir / "model.int8.onnx"
    # the input form and the clip are chosen on the validation split, as the checkpoint was (the test split stays for
    # reporting)
    chosen, made, candidates = quantize_forms(sources, int8_path, calib, qcfg, workdir, check=ds.val.x.numpy(),
                                              batch_size=cfg.data.eval_batch_size)
    src = out_dir / "model.fp32.onnx"  # the graph that was quantized, where it is not the export's own
    if chosen == "folded":
        shutil.copyfile(sources["folded"], src)
        normalization = f"folded into {fold_into}"
    else:
        src.unlink(missing_ok=True)
        src = fp32_path
        normalization = "float prologue (Mul, Add on the input)" + (" (folding it agreed less with fp32)" if fold_into else "")
    pre = made.pre

    fp32, fp32_logits = evaluate_file(fp32_path, ds, qcfg.threads, cfg.data.eval_batch_size)
    int8, int8_logits = evaluate_file(int8_path, ds, qcfg.threads, cfg.data.eval_batch_size)
    xs = ds.val.x[:qcfg.sqnr_samples].numpy()
    rows = (input_sqnr_rows(int8_path, xs, tuple(ds.info.input_shape), ds.info.feature_names)
            + sqnr_rows(pre, int8_path, xs, workdir))
    act_sqnr = [r["sqnr_db"] for r in rows if r["kind"] == "activation" and isinstance(r["sqnr_db"], float)]
    in_sqnr = [r["sqnr_db"] for r in rows if r["kind"] == "input" and isinstance(r["sqnr_db"], float)]
    val = clip_fidelity(fp32_logits["val"], int8_logits["val"])
    warning = agreement_warning(f"{variant}/{form}", val, qcfg.agreement_floor, "the validation split", rows,
                                chosen == "folded")
    result = {
        "fp32_path": entry["path"], "int8_path": str(int8_path.relative_to(run.path)),
        "quantized_from": str(src.relative_to(run.path)), "normalization": normalization,
        "input_form": chosen, **({"input_forms": candidates} if candidates else {}),
        **({"fold_check": fold_check} if fold_check else {}),
        **({"percentile": made.percentile} if made.percentile is not None else {}),
        **({"clip_search": made.search} if made.search else {}),
        **({"clip_note": made.note} if made.note else {}),
        "fp32": fp32, "int8": int8,
        **_changes(fp32, int8, ds.info.metric),
        "val_argmax_agreement": val["agreement"],
        "test_argmax_agreement": float((fp32_logits["test"].argmax(-1) == int8_logits["test"].argmax(-1)).mean()),
        "test_max_logit_change": float(np.abs(fp32_logits["test"] - int8_logits["test"]).max()),
        "size_ratio": fp32["bytes"] / int8["bytes"],
        "output_sqnr_db": next((r["sqnr_db"] for r in rows if r["tensor"] == ort_util.OUTPUT and r["kind"] == "activation"), None),
        "min_activation_sqnr_db": min(act_sqnr) if act_sqnr else None,
        "min_input_sqnr_db": min(in_sqnr) if in_sqnr else None,
        **({"warning": warning} if warning else {}),
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
    exported = run.read_json("export", "export.json")
    if exported is None:
        raise RunDirError(f"{run.path}: the export stage has written no export/export.json; run it first "
                          f"(`pipeline run --resume {run.path} --redo export`)")
    if "files" not in exported:  # an export before the stage wrote the folded form: int8 would quietly skip the fold
        raise RunDirError(f"{run.path}: export/export.json predates the export stage's folded and verifiers' forms; "
                          f"run `pipeline run --resume {run.path} --redo export`")
    exported = exported["models"]
    calib = calibration_samples(qcfg, ds.train.x, cfg.seed)
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
                     "percentile": qcfg.clip_percentile, "clip_search": qcfg.clip_candidates[1:],
                     "clip_tolerance_pt": qcfg.clip_tolerance_pt,
                     "calibration_samples": len(calib), "quantized_op_types": QUANTIZED_OPS,
                     "keep_removable_activations": qcfg.keep_activations, "quantize_bias": qcfg.quantize_bias,
                     "fold_normalization": qcfg.fold_normalization, "agreement_floor": qcfg.agreement_floor, "sqnr_samples": min(qcfg.sqnr_samples, len(ds.val)),
                     "timing": {**ort_util.describe_speed_setup(qcfg.threads), "repeats_batch": qcfg.repeats,
                                "repeats_b1": 4 * qcfg.repeats, "blocks": qcfg.timing_blocks,
                                "throughput_batch": qcfg.throughput_batch},
                     "cpu": ort_util.cpu_name(), "onnxruntime": ort_util.ort.__version__},
        "models": models,
        "comparisons": comparisons,
        # what the run's closing lines repeat (`pipeline.runner.closing_lines`)
        "warnings": [m["warning"] for forms in models.values() for m in forms.values() if m.get("warning")],
    }
    atomic_write_json(run.file("quantize", "quantize.json"), result)
    return result


def report_section(cfg: Config, run: RunDir) -> str | None:
    """The int8 stage's section of report.md: accuracy, size and speed of every model in both precisions."""
    q = run.read_json("quantize", "quantize.json")
    if q is None:
        return None
    metric, st = q["metric"], q["settings"]
    tb = f"throughput_b{st['timing']['throughput_batch']}"
    clipped = st.get("percentile") is not None
    rows = [[v, form, m.get("input_form", ""), m["fp32"][f"test_{metric}"], m["int8"][f"test_{metric}"],
             m.get("val_argmax_agreement"), m["test_argmax_agreement"], m["size_ratio"],
             m["int8"].get("latency_b1_ms"), m.get("speedup_b1"), m["int8"].get(tb), m.get(f"speedup_b{st['timing']['throughput_batch']}"),
             m["min_activation_sqnr_db"], "yes" if m["int8"]["integer_only"] else "no: " + ", ".join(m["int8"]["float_ops"])]
            + ([f"{m.get('percentile', st['percentile']):g}"] if clipped else [])
            for v, forms in q["models"].items() for form, m in forms.items()]
    search = st.get("clip_search") or []
    if not clipped:
        calibration = st["calibration_method"]
    elif not search:
        calibration = f"percentile ({st['percentile']:g}%)"
    else:
        calibration = (f"percentile, per model the most clipping of {', '.join(f'{p:g}' for p in [st['percentile'], *search])}% "
                       f"whose validation argmax agreement with fp32 is at most {st['clip_tolerance_pt']:g} points below "
                       f"{st['percentile']:g}%'s (finer grids leave the int8 verifier less rounding noise)")
    kept = sorted({m["clip_note"] for forms in q["models"].values() for m in forms.values() if m.get("clip_note")})
    return "\n\n".join([
        "## int8 (onnxruntime static quantization)",
        f"{st['format']}, weights {st['weights']}, activations {st['activations']} calibrated on "
        f"{st['calibration_samples']} training examples by {calibration}; timed on {st['cpu']} with {st['timing']['intra_op_threads']} thread(s). "
        "The verify section certifies the int8 model of each ReLU form itself (its \"-int8\" rows); a certificate for a "
        "float model says nothing about these graphs."
        + "".join(f" Clip kept at {st['percentile']:g}% where the validation split has {k}." for k in kept),
        "The input column says how each int8 graph meets its input: \"folded\" quantizes the raw input, the "
        "normalization folded into the first Linear (integer-only), \"float\" keeps the normalization in float before "
        "the first QuantizeLinear; where both exist, the fold is kept only if its validation agreement with fp32 is "
        f"within {st['clip_tolerance_pt']:g} points of the float form's and its input grid keeps as many features above "
        f"{LOW_SQNR_DB:g} dB SQNR (one grid over features of different scales loses the small ones).",
        render.table(["variant", "form", "input", f"fp32 test {metric}", f"int8 test {metric}", "argmax agreement (val)",
                      "argmax agreement (test)", "size ratio",
                      "int8 latency b1 (ms)", "speedup b1", f"int8 {tb} (/s)", "speedup", "min activation SQNR (dB)",
                      "integer-only"] + (["clip (%)"] if clipped else []), rows),
        *(["**Below the agreement floor** (quantize.agreement_floor "
           f"{st.get('agreement_floor', 0):.2%}; per-input and per-tensor SQNR in quantize/sqnr.csv):\n\n"
           + "\n".join(f"- {w}" for w in q["warnings"])] if q.get("warnings") else []),
    ])
