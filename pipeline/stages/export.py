"""The export stage: every model of the run to one self-contained fp32 ONNX file per form a later stage reads, each
checked against a float64 run of the model (the library and its decisions: `quantize/export.py`).

For each variant: the smooth best checkpoint (`train/<v>/best.pt`, form "smooth") and its swapped ReLU model
(`swap/<v>/relu.pt`, form "relu"); a ReLU-baseline variant has only the "relu" form, a non-gate only "smooth" (its
record says which). Writes, per form, `export/<variant>/<form>/model.onnx` (the plain graph: what onnxruntime runs and
the int8 stage quantizes), `model.folded.onnx` where the input normalization folds into the first Linear
(`export_mod.fold_normalization`; the int8 stage's other input form) and, for the ReLU form, `model.verifiers.onnx` (the
batch-1 form the verifiers read, `export_mod.export_for_verifiers`; the verify stage's ReLU networks). The pruned model
is the sparsity stage's, which needs its APoZ. `export/export.json` keeps every file with its checks (`FILES` names
them; `OUTPUTS` declares what the stage writes); and the stage's section of report.md.
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
from pipeline.rundir import Output, RunDir
from quantize.export import (EXPORTER, export_for_verifiers, fold_normalization, metadata_for,
                             settings, write_checked)


def sources(cfg: Config, run: RunDir) -> list[tuple[str, str, Path]]:
    """(variant, form, checkpoint) for every model the run exports, in a fixed order."""
    return [(v, form, run.file("train", v, "best.pt") if form == "smooth" else run.file("swap", v, "relu.pt"))
            for v in cfg.variants for form in run.forms(v)]


# The file name of each form, as export.json's `files` names them for the stages that read them.
FILES = {"plain": "model.onnx", "folded": "model.folded.onnx", "verifiers": "model.verifiers.onnx"}
OUTPUTS = (
    Output("export/export.json"),
    Output(f"export/<variant>/<form>/{FILES['plain']}"),
    Output(f"export/<variant>/<form>/{FILES['folded']}", when="the input normalization folds into the first Linear"),
    Output(f"export/<variant>/relu/{FILES['verifiers']}", when="the verifiers' form takes the model", only="relu"),
)


def run_export(cfg: Config, run: RunDir) -> dict[str, Any]:
    ds = dataset_for(cfg)
    ecfg = cfg.export
    xval = ds.val.x[:ecfg.check_samples]
    options = settings(ecfg, cfg.quantize.threads)
    models: dict[str, dict[str, Any]] = {}
    for variant, form, src in sources(cfg, run):
        model, payload = checkpoint.load_model(src)
        meta = metadata_for(payload, variant, form, ds.info)
        path = run.file("export", variant, form, FILES["plain"])
        written = write_checked(model, xval[:2], path, xval, **options, metadata=meta)
        entry = models.setdefault(variant, {})[form] = {**written.record(), "path": str(path.relative_to(run.path)),
                                                        "source": str(Path(src).relative_to(run.path))}
        folded = fold_normalization(model, tuple(payload["spec"]["input_shape"]))
        if folded is not None:
            path = run.file("export", variant, form, FILES["folded"])
            written = write_checked(folded, xval[:2], path, xval, reference=model, **options, metadata=meta)
            entry["folded"] = {"path": str(path.relative_to(run.path)), "into": list(folded._modules)[1],
                               **written.facts, "check": written.check}
        if form == "relu":
            entry["verifiers"] = _verifiers_form(run, variant, src, ds.info.input_shape, xval, ecfg)
    result = {"exporter": EXPORTER, "opset": ecfg.opset, "simplified": ecfg.simplify, "atol": ecfg.atol, "rtol": ecfg.rtol,
              "torch": torch.__version__, "onnx": onnx.__version__, "files": FILES, "models": models}
    atomic_write_json(run.file("export", "export.json"), result)
    return result


def _verifiers_form(run: RunDir, variant: str, src: Path, input_shape, xval: torch.Tensor, ecfg) -> dict[str, Any]:
    """The ReLU model in the verifiers' form, or why it has none: a model that form cannot take is the verify stage's
    "not verified" line, never a failed export of the forms the other stages read."""
    model, _ = checkpoint.load_model(src)  # the checkpoint as saved: the plain export's module stays out of it
    path = run.file("export", variant, "relu", FILES["verifiers"])
    try:
        rec = export_for_verifiers(model, tuple(input_shape), path, xval, ecfg.opset, ecfg.atol, ecfg.rtol)
    except (NotImplementedError, RuntimeError, TypeError, ValueError) as e:  # the exporter's refusals, not a failed check
        path.unlink(missing_ok=True)
        return {"path": None, "error": " ".join(str(e).split())}
    return {**rec, "path": str(path.relative_to(run.path))}


def report_section(cfg: Config, run: RunDir) -> str | None:
    """The export stage's section of report.md: every graph, its ops and its check against PyTorch."""
    e = run.read_json("export", "export.json")
    if e is None:
        return None
    def row(v: str, form: str, m: dict[str, Any]) -> list[Any]:
        c = m.get("check", m)  # the folded form keeps its check apart from its file's facts
        return [v, form, ", ".join(f"{op}×{n}" for op, n in m["ops"].items()), m["bytes"], c["ort_vs_fp64"],
                c["torch_vs_fp64"], c["bound_max"], c["ort_bound_ratio"], c["argmax_agreement"]]

    rows = []
    for v, forms in e["models"].items():
        for form, m in forms.items():
            rows.append(row(v, form, m))
            rows += [row(v, f"{form} ({kind})", m[kind]) for kind in ("folded", "verifiers") if (m.get(kind) or {}).get("path")]
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
