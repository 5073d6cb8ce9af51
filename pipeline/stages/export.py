"""The export stage: every model of the run to one self-contained fp32 ONNX file, checked against a float64 run of the
model (the library and its decisions: `quantize/export.py`).

For each variant: the smooth best checkpoint (`train/<v>/best.pt`, form "smooth") and its swapped ReLU model
(`swap/<v>/relu.pt`, form "relu"); a ReLU-baseline variant has only the "relu" form, a non-gate only "smooth" (its
record says which). Writes `export/<variant>/<form>/model.onnx` and `export/export.json` (every file with its checks);
and the stage's section of report.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import torch

from pipeline import checkpoint, render
from pipeline.atomic_io import atomic_write_json
from pipeline.config import Config
from pipeline.data import dataset_for
from pipeline.rundir import RunDir
from quantize.export import EXPORTER, metadata_for, settings, write_checked


def sources(cfg: Config, run: RunDir) -> list[tuple[str, str, Path]]:
    """(variant, form, checkpoint) for every model the run exports, in a fixed order."""
    out = []
    for v in cfg.variants:
        record = run.variant(v)
        if record.smooth:
            out.append((v, "smooth", run.file("train", v, "best.pt")))
        if record.swapped_to is not None:  # a non-gate (Tanh, ...) has no ReLU form: the swap left it
            out.append((v, "relu", run.file("swap", v, "relu.pt")))
    return out


def run_export(cfg: Config, run: RunDir) -> dict[str, Any]:
    ds = dataset_for(cfg)
    ecfg = cfg.export
    xval = ds.val.x[:ecfg.check_samples]
    models: dict[str, dict[str, Any]] = {}
    for variant, form, src in sources(cfg, run):
        model, payload = checkpoint.load_model(src)
        path = run.file("export", variant, form, "model.onnx")
        written = write_checked(model, xval[:2], path, xval, **settings(ecfg, cfg.quantize.threads),
                                metadata=metadata_for(payload, variant, form, ds.info))
        models.setdefault(variant, {})[form] = {**written.record(), "path": str(path.relative_to(run.path)),
                                                "source": str(Path(src).relative_to(run.path))}
    result = {"exporter": EXPORTER, "opset": ecfg.opset, "simplified": ecfg.simplify, "atol": ecfg.atol, "rtol": ecfg.rtol,
              "torch": torch.__version__, "onnx": onnx.__version__, "models": models}
    atomic_write_json(run.file("export", "export.json"), result)
    return result


def report_section(cfg: Config, run: RunDir) -> str | None:
    """The export stage's section of report.md: every graph, its ops and its check against PyTorch."""
    e = run.read_json("export", "export.json")
    if e is None:
        return None
    rows = [[v, form, ", ".join(f"{op}×{n}" for op, n in m["ops"].items()), m["bytes"], m["ort_vs_fp64"], m["torch_vs_fp64"],
             m["bound_max"], m["ort_bound_ratio"], m["argmax_agreement"]] for v, forms in e["models"].items() for form, m in forms.items()]
    slack = f" plus export.atol {e['atol']:g} + export.rtol {e['rtol']:g}·max|logit|" if e["atol"] or e["rtol"] else ""
    return "\n\n".join([
        "## ONNX export (fp32)",
        f"Exporter {e['exporter']}, opset {e['opset']}, onnxsim {'on' if e['simplified'] else 'off'}; inputs in natural units "
        f"(the normalization is inside each graph). Each graph is checked on validation inputs: onnxruntime and PyTorch "
        f"each against a float64 run of the model, every output within the bound float32 rounding can account for in "
        f"this network (quantize/rounding.py){slack}. The share column is onnxruntime's largest error as a fraction of "
        f"its bound.",
        render.table(["variant", "form", "ops", "bytes", "max |Δlogit| onnxruntime vs float64", "PyTorch vs float64",
                      "largest bound", "share of bound", "argmax agreement"], rows),
    ])
