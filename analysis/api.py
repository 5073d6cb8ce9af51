"""Check, swap, export and verify a model of your own with the functions the stages use, taking a model and
data (a Split, (x, y) tensors or a DataLoader: `pipeline.data.as_split`) instead of a run directory.

    from analysis import api
    api.swap(model, (x, y))                                   # the swap stage's numbers (pipeline.relu_swap.swap_report)
    api.check(model, (x, y))                                  # the check stage's per-layer check + swap certificate
    api.export_onnx(model, x[:2], "model.onnx", check_inputs=x)  # the export stage's ONNX, checked against PyTorch
    api.verify(relu_model, (x, y), epsilons=[0.01], low=0.0, high=1.0)  # the verify stage's verifiers

The model is given back as it came (device, train/eval mode): the stage functions move it to the CPU and to eval
mode. Nothing here writes a run directory; `export_onnx` writes only the file it is asked for.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.config import CheckConfig
from pipeline.data import as_split
from pipeline.relu_swap import swap_report, to_relu
from quantize import export as export_mod
from quantize import ort as ort_util

from . import check as check_stage

__all__ = ["swap", "check", "export_onnx", "verify", "to_relu"]


@contextlib.contextmanager
def _as_given(model: nn.Module) -> Iterator[nn.Module]:
    """Give the model back on its device and in its modes after a stage function moved it."""
    modes = {m: m.training for m in model.modules()}
    p = next(model.parameters(), None)
    try:
        yield model
    finally:
        if p is not None:
            model.to(p.device)
        for m, training in modes.items():
            m.training = training


def swap(model: nn.Module, data: Any, batch_size: int = 2048, device: torch.device | str = "cpu",
         metric: str = "accuracy") -> dict[str, float]:
    """The metric before and after every gate becomes ReLU, top-1 agreement, max |Δlogit| (`swap_report`)."""
    with _as_given(model):
        return swap_report(model, data, batch_size, device, metric)


def check(model: nn.Module, data: Any, config: CheckConfig | None = None, batch_size: int = 2048,
          device: torch.device | str = "cpu") -> dict[str, Any]:
    """The check stage for one model: per gate layer, the measured gap to ReLU against its bounds
    (`analysis.check.empirical_check`), and the swap certificate against the measured logit change on `data`
    (`analysis.check.swap_certificate`).

    `verdict`: {"certificate": "holds" | "refused" | "fails", "statements", "why"} (`analysis.check.verdict`): holds
    when every float32 statement that could be proved held on every sample and every gate is within c/λ of ReLU;
    refused when none could be proved; fails otherwise. `predictions`: the closed-form predictions of per-layer
    means, a separate diagnostic (`analysis.check.predictions`). A model without gates: verdict None (the swap
    changes nothing)."""
    cfg = config or CheckConfig()
    split = as_split(data)
    with _as_given(model):
        layers = check_stage.empirical_check(model, split, batch_size, device, cfg.soft_delta, cfg.band, cfg.sup_rtol)
        if not layers:
            return {"layers": [], "certificate": None, "verdict": None, "predictions": None,
                    "note": "no gates: the swap leaves this model unchanged"}
        cert = check_stage.swap_certificate(model, split, batch_size, split.x[:1])
    return {"layers": layers, "certificate": cert, "verdict": check_stage.verdict(layers, cert),
            "predictions": check_stage.predictions(layers)}


def export_onnx(model: nn.Module, example: torch.Tensor, path: str | Path, check_inputs: torch.Tensor | None = None,
                opset: int = 20, simplify: bool = True, atol: float = export_mod.FP32_ATOL, rtol: float = export_mod.FP32_RTOL,
                dynamic_batch: bool = True, metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """`model` to one self-contained fp32 ONNX file at `path`, as the export stage writes it (`quantize.export`:
    trace at `opset`, onnxsim, full ONNX check, dynamic batch), then onnxruntime and PyTorch each against
    float64 on `check_inputs` (default: `example`): raises ExportError where onnxruntime leaves the float32
    rounding bound of the network (`quantize.export.compare`; atol + rtol·max|logit| is slack on top).
    Returns the facts (nodes, ops, bytes) and the check's numbers."""
    path = Path(path)
    x = example if check_inputs is None else check_inputs
    with _as_given(model):
        proto, facts = export_mod.to_onnx(model, example, opset, simplify, metadata, dynamic_batch)
        export_mod.save(proto, path)
        checked = export_mod.compare(path, model, x.cpu(), atol, rtol)
    return {"path": str(path), "bytes": ort_util.file_bytes(path), **facts, "ops": ort_util.op_counts(proto), **checked}


def verify(model: Any, data: Any, epsilons: Sequence[float] | None = None, low: Any = -math.inf, high: Any = math.inf,
           verifier: str | None = None, timeout_s: float | None = None, samples: int | None = None,
           input_shape: Sequence[int] | None = None, clock: str = "wall", jobs: int = 1,
           device: str | None = None) -> dict[str, Any]:
    """L∞ robustness of the first `samples` examples of `data` at each radius, with the verify stage's verifiers
    through its property loop (`analysis.verification.harness`; "auto" = the staged chain, attack first, then bounds,
    then branch and bound; or any registered name or chain "a+b"). `model`: any nn.Module the verifier can read
    (through its ONNX export: ReLU, the smooth gates, residual adds, convolutions, BatchNorm, ...; a module it cannot
    read raises UnsupportedModel naming the op and the module path), or an ONNX file. The box is
    [max(x0 − eps, low), min(x0 + eps, high)] (low/high: the data's valid range; unclipped by default).
    Unset arguments take the verify stage's defaults (`pipeline.config.VerifyConfig`); `timeout_s` is per property;
    `device` where the bounds compute (auto | cpu | cuda | cuda:N).

    Returns {"verifier", "rows": one per (eps, sample) with result sat/unsat/timeout/unknown/error,
    "certified": {eps: fraction unsat}}. The verify stage itself (VNN-LIB files, instances.csv, witnesses)
    stays a stage over ONNX files; `analysis.verification.vnncomp` runs a VNN-COMP folder."""
    from pipeline.config import VerifyConfig

    from .verification import harness, registry
    from .verification.readers import read
    from .verification.vnnlib import robustness_spec

    defaults = VerifyConfig()
    epsilons = list(defaults.epsilons if epsilons is None else epsilons)
    verifier = verifier or defaults.verifiers[0]
    samples = defaults.samples if samples is None else samples
    timeout_s = timeout_s if timeout_s is not None else (defaults.timeout_s or defaults.budget_s / max(1, samples * len(epsilons)))
    registry.check_name(verifier)
    split = as_split(data)
    n = min(samples, len(split))
    shape = tuple(input_shape or split.x.shape[1:])
    if isinstance(model, nn.Module):
        with _as_given(model):
            net = read(model, shape)
            recheck = harness.ModuleRecheck(copy.deepcopy(model).cpu().float(), shape)
    else:
        net, recheck = read(model), (harness.OnnxRecheck(model) if isinstance(model, (str, Path)) else None)
    xs = split.x[:n].double().reshape(n, -1).numpy()
    tasks = [harness.SpecTask(key=(eps, k), verifier=verifier, net=net, recheck=recheck,
                              specs=[robustness_spec(xs[k], eps, low, high, int(split.y[k]), net.num_outputs)])
             for eps in epsilons for k in range(n)]
    outcomes = harness.run(tasks, harness.PerTask(timeout_s), jobs=jobs, clock=clock, device=device or defaults.device)
    rows = [{"sample": o.key[1], "eps": o.key[0], "label": int(split.y[o.key[1]]), "result": o.result.status,
             "stage": o.result.stage, "seconds": o.result.seconds, "message": o.result.message,
             "margin_lb": o.result.info.get("margin_lb")} for o in outcomes]
    certified = {eps: sum(r["result"] == "unsat" for r in rows if r["eps"] == eps) / max(n, 1) for eps in epsilons}
    return {"verifier": registry.resolve(verifier), "samples": n, "rows": rows, "certified": certified}
