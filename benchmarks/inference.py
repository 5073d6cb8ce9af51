"""onnxruntime fp32 vs int8, batch 1 and batch 256, one intra-op thread.

Models: the default model built with λ-GELU and swapped to ReLU ("swapped_relu"), and the same model
with GELU ("gelu", whose Gelu nodes stay float in the int8 graph); λ-GELU unswapped ("lambda_gelu",
Mul → Gelu → Div) for completeness. The graphs are made exactly as the pipeline's export and int8
stages make them (`quantize.export.to_onnx`, `quantize.export.fold_normalization` and `quantize_file`:
QDQ, per-channel int8 weights, calibration on training images at `quantize.percentile`; the stage's clip search
picks another clip, which changes no node and so no speed). Weights are the seeded
initialization: speed does not depend on what was learned, and no training run is needed.
All sessions are timed interleaved, one `session.run` of each per repetition.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.config import Config
from pipeline.data import dataset_for
from pipeline.models import build_model, make_spec
from pipeline.relu_swap import to_relu
from quantize import export as export_mod
from quantize import int8 as int8_mod
from quantize import ort as ort_util

from .common import interleaved, paired_ratio, summary


def _models(cfg: Config, info) -> dict[str, torch.nn.Module]:
    out = {}
    for name, act in (("swapped_relu", "lambda_gelu"), ("gelu", "gelu"), ("lambda_gelu", "lambda_gelu")):
        torch.manual_seed(cfg.seed)
        m = build_model(make_spec(cfg.model, act, cfg.gate, info)).eval()
        out[name] = to_relu(copy.deepcopy(m)) if name == "swapped_relu" else m
    return out


def _export_pair(model, name: str, ds, cfg: Config, work: Path) -> dict[str, Path]:
    example = ds.val.x[:2]
    fp32 = work / f"{name}.fp32.onnx"
    proto, _ = export_mod.to_onnx(model, example, cfg.export.opset, cfg.export.simplify)
    export_mod.save(proto, fp32)
    src = fp32
    folded = export_mod.fold_normalization(model, tuple(ds.info.input_shape)) if cfg.quantize.fold_normalization else None
    if folded is not None:  # as the int8 stage does for an MLP
        src = work / f"{name}.folded.onnx"
        proto, _ = export_mod.to_onnx(folded, example, cfg.export.opset, cfg.export.simplify)
        export_mod.save(proto, src)
    int8 = work / f"{name}.int8.onnx"
    calib = int8_mod.calibration_samples(cfg.quantize, ds.train.x, cfg.seed)
    int8_mod.quantize_file(src, int8, calib, cfg.quantize, work)
    return {"fp32": fp32, "int8": int8}


def bench_inference(cfg: Config, reps: int, batches: tuple[int, ...] = (1, 256), threads: int = 1) -> dict[str, Any]:
    ds = dataset_for(cfg)
    out: dict[str, Any] = {"model": cfg.model.name, "data": cfg.data.name, "threads": threads, "reps": reps,
                           "weights": "seeded initialization (speed only)", "opset": cfg.export.opset, "models": {}}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        paths = {}
        for name, model in _models(cfg, ds.info).items():
            for prec, p in _export_pair(model, name, ds, cfg, work).items():
                paths[(name, prec)] = p
        sessions = {k: ort_util.session(p, threads) for k, p in paths.items()}
        for k, p in paths.items():
            counts = ort_util.optimized_op_counts(p, threads)
            out["models"].setdefault(k[0], {})[k[1]] = {
                "bytes": ort_util.file_bytes(p), "optimized_ops": counts, "float_ops": ort_util.float_ops(counts)}
        for b in batches:
            reps_b = reps * 4 if b == 1 else reps  # batch 1 is cheap: more repetitions for the same time
            x = ds.val.x[:b].numpy()
            if len(x) < b:
                x = np.concatenate([x] * (-(-b // len(x))))[:b]
            feed = {ort_util.INPUT: ort_util.as_input(x)}
            fns = {f"{n}/{p}": (lambda s=s: s.run([ort_util.OUTPUT], feed)) for (n, p), s in sessions.items()}
            times = interleaved(fns, reps_b, warmup=5)
            for (n, p) in sessions:
                t = times[f"{n}/{p}"]
                out["models"][n][p][f"batch{b}_ms"] = summary(t, 1e3)
                out["models"][n][p][f"batch{b}_samples_per_s"] = b / summary(t)["median"]
            for n in out["models"]:
                out["models"][n][f"int8_speedup_batch{b}"] = paired_ratio(times[f"{n}/fp32"], times[f"{n}/int8"])
            out[f"swapped_relu_int8_vs_gelu_fp32_batch{b}"] = paired_ratio(times["gelu/fp32"], times["swapped_relu/int8"])
            out[f"swapped_relu_int8_vs_gelu_int8_batch{b}"] = paired_ratio(times["gelu/int8"], times["swapped_relu/int8"])
    return out
