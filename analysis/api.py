"""Check, swap, export, quantize and verify a model of your own with the functions the stages use, taking a model
and data (a Split, (x, y) tensors or a DataLoader: `pipeline.data.as_split`) instead of a run directory.

    from analysis import api
    api.swap(model, (x, y))                                   # the swap stage's numbers (pipeline.relu_swap.swap_report)
    api.check(model, (x, y))                                  # the check stage's per-layer check + swap certificate
    api.export_onnx(model, x[:2], "model.onnx", check_inputs=x)  # the export stage's ONNX, checked against PyTorch
    api.quantize(relu_model, x_train, "model.int8.onnx", data=(x, y))  # the int8 stage's int8 ONNX and its numbers
    api.verify(relu_model, (x, y), epsilons=[0.01], low=0.0, high=1.0)  # the verify stage's verifiers

The model is given back as it came (device, train/eval mode): the stage functions move it to the CPU and to eval
mode. Nothing here writes a run directory; `export_onnx` and `quantize` write only the files they are asked for.
"""

from __future__ import annotations

import contextlib
import copy
import math
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.config import CheckConfig, QuantizeConfig
from pipeline.data import as_split
from pipeline.activations import gate_of
from pipeline.outputs import logits_view
from pipeline.probe import smooth_calls
from pipeline.relu_swap import SwapError, smooth_work_error, swap_report, to_relu
from pipeline.opset import OPSET
from quantize import export as export_mod
from quantize import ort as ort_util

from . import bounds_check

__all__ = ["swap", "check", "CheckResult", "export_onnx", "quantize", "verify", "to_relu"]


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
    """The metric before and after every gate becomes ReLU, top-1 agreement, max |Δlogit|, how many gates were
    swapped and what was kept, with the reason (`swap_report`). Refuses (SwapError) a model with smooth gate work the
    swap cannot replace, and says `swapped: 0` with a note where there was nothing to swap: never a perfect-looking
    swap of nothing."""
    with _as_given(model):
        return swap_report(model, data, batch_size, device, metric)


class CheckResult(dict):
    """What `check` found: the keys it always had (`layers`, `certificate`, `verdict`: {"certificate", "statements",
    "why"}, `predictions`, `output`, `note`), with the verdict as fields: `verdict` ("holds" | "refused" | "fails", None
    for a model with nothing to swap), `why` (one sentence), `statements` (the float32 statements that held),
    `certified` (the verdict holds) and `certified_fraction` (the share of samples whose top-1 it keeps)."""

    @property
    def verdict(self) -> str | None:
        v = self["verdict"]
        return None if v is None else v["certificate"]

    @property
    def why(self) -> str:
        v = self["verdict"]
        return self.get("note", "") if v is None else v["why"]

    @property
    def statements(self) -> list[str]:
        v = self["verdict"]
        return [] if v is None else list(v["statements"])

    @property
    def certified(self) -> bool:
        return self.verdict == "holds"

    @property
    def certified_fraction(self) -> float | None:
        """The share of samples whose top-1 prediction the certificate keeps (None unless it holds)."""
        v = self["verdict"]
        return None if v is None else v.get("certified_fraction")


def check(model: nn.Module, data: Any, config: CheckConfig | None = None, batch_size: int = 2048,
          device: torch.device | str = "cpu") -> CheckResult:
    """The check stage for one model: per gate layer, the measured gap to ReLU against its bounds
    (`analysis.bounds_check.empirical_check`), and the swap certificate against the measured logit change on `data`
    (`analysis.bounds_check.swap_certificate`).

    `verdict` (a field of the `CheckResult`, and its dict under the key "verdict": `analysis.bounds_check.verdict`): holds
    when every float32 statement that could be proved held on every sample and every gate is within c/λ of ReLU;
    refused when none could be proved; fails otherwise. `predictions`: the closed-form predictions of per-layer
    means, a separate diagnostic (`analysis.bounds_check.predictions`). A model without gates: verdict None (the swap
    changes nothing)."""
    cfg = config or CheckConfig()
    split = as_split(data)
    with _as_given(model):
        example = _on_device(model, split.x[:2])
        net, output = logits_view(model, example)
        found = smooth_calls(net, example, lambda m: gate_of(m) is not None)
        if found.calls:  # a check of the gates alone would call the swap of this model complete
            raise SwapError(smooth_work_error(found.calls, "api.check"))
        layers = bounds_check.empirical_check(net, split, batch_size, device, cfg.soft_delta, cfg.band, cfg.sup_rtol)
        said = {"output": output} if output else {}
        if not layers:
            return CheckResult(layers=[], certificate=None, verdict=None, predictions=None, **said,
                               note="no gates and no smooth gate work (one forward watched): the swap leaves this model unchanged")
        cert = bounds_check.swap_certificate(net, split, batch_size, split.x[:1])
    v = bounds_check.verdict(layers, cert)
    if v["certificate"] != "holds":  # a refused or failed certificate is said, not left in a dict to be found
        print(f"api.check: the swap certificate {v['certificate']}: {v['why']}")
    elif v["certified_fraction"] == 0:  # as is one that holds but keeps no prediction
        print(f"api.check: the swap certificate holds but proves no prediction unchanged: {v['why']}")
    return CheckResult(layers=layers, certificate=cert, verdict=v, predictions=bounds_check.predictions(layers), **said)


def _on_device(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    p = next(model.parameters(), None)
    return x if p is None else x.to(p.device)


def export_onnx(model: nn.Module, example: torch.Tensor, path: str | Path, check_inputs: torch.Tensor | None = None,
                opset: int = OPSET, simplify: bool = True, atol: float = export_mod.FP32_ATOL, rtol: float = export_mod.FP32_RTOL,
                dynamic_batch: bool = True, metadata: dict[str, str] | None = None,
                bound_samples: int | None = export_mod.BOUND_SAMPLES) -> dict[str, Any]:
    """`model` to one self-contained fp32 ONNX file at `path`, as the export stage writes it (`quantize.export`:
    trace at `opset`, onnxsim, full ONNX check, dynamic batch), then onnxruntime and PyTorch each against
    float64 on `check_inputs` (default: `example`): raises ExportError where onnxruntime leaves the float32
    rounding bound of the network (`quantize.export.compare`; atol + rtol·max|logit| is slack on top). The bound is
    derived on at most `bound_samples` of the check inputs, spread evenly (its cost is linear in them,
    benchmarks/EXPORT.md); None derives it on all. Every check input is
    run through both engines (`argmax_agreement`, `max_abs_diff`). A model that returns a Hugging Face ModelOutput,
    a dict or a tuple is exported with its logits as the one output (`pipeline.outputs`; `output` says which).
    Returns the facts (nodes, ops, bytes) and the check's numbers."""
    x = example if check_inputs is None else check_inputs
    with _as_given(model):
        net, output = logits_view(model, _on_device(model, example))
        written = export_mod.write_checked(net, example, Path(path), x.cpu(), opset=opset, simplify=simplify, atol=atol,
                                           rtol=rtol, bound_samples=bound_samples, metadata=metadata,
                                           dynamic_batch=dynamic_batch)
    return {**written.record(), **({"output": output} if output else {})}


def quantize(model: nn.Module | str | Path, calibration: Any, path: str | Path, data: Any = None,
             config: QuantizeConfig | None = None, seed: int = 0, example: torch.Tensor | None = None,
             opset: int = OPSET) -> dict[str, Any]:
    """`model` as the int8 stage quantizes it (`quantize.int8.quantize_file`: onnxruntime static quantization, QDQ,
    per-channel 7-bit weights, int8 activations calibrated by percentile on `calibration_samples` inputs and clipped as
    far as `data` allows: the `QuantizeConfig` defaults unless `config` says otherwise), written to `path`; returns
    its report. `QuantizeConfig(activation_type="int16")` makes a w8a16 file instead (16-bit activation grids), which
    `verify` certifies on residual nets and transformers where the int8 one stays open, at the cost of CPU speed
    (docs/verification.md, "Sixteen-bit activations").

    model: an nn.Module (exported first as `export_onnx` does, checked against PyTorch; an input normalization at the
        head of an nn.Sequential is also tried folded into its first Linear and kept so only where that agrees with
        fp32 as well as keeping it in float, as the stage does: `quantize.int8.quantize_forms`) or an fp32 ONNX file.
    calibration: inputs ([N, ...] tensor or array) or anything `as_split` takes (its inputs are used); up to
        `config.calibration_samples` of them are drawn without replacement with `seed`.
    data: where the fp32 and int8 models are compared (default: the calibration inputs): inputs, or with labels
        (anything `as_split` takes) accuracy too.
        With percentile calibration the activations' clip is chosen there too (`config.clip_search`: the most
        clipping percentile whose argmax agreement with fp32 is at most `clip_tolerance_pt` points below
        `percentile`'s), so pass held-out inputs, not the test set you report on; that costs one onnxruntime pass
        over `data` per candidate (four by default), and is skipped (`settings["clip_note"]` says why) where the
        tolerance is less than one of `data`'s outputs.
    example: the export's trace input for a module (default: the first two calibration inputs).

    The report: `path`, `settings` (with the clip chosen, `percentile`, and every candidate's agreement on `data`,
    `clip_search`), per precision (`fp32`, `int8`) the file's bytes, its op counts raw and as
    onnxruntime optimizes them, the float ops left and whether it runs integer-only (and `accuracy` with labels);
    `argmax_agreement` and `max_logit_change` (int8 against fp32 on `data`), `size_ratio`, and the SQNR in dB of the
    output and the smallest of any activation (`sqnr`: per input feature at the input's grid, then per tensor, as
    quantize/sqnr.csv); `settings["input_form"]` ("folded" or "float") and each form's agreement (`input_forms`).
    Where `argmax_agreement` is below `config.agreement_floor`, `warning` is one line naming the inputs or layers
    that lose the signal and the fix, also raised as a RuntimeWarning; else None."""
    from pipeline.config import validate_quantize
    from quantize import int8 as int8_mod

    # a bad setting is one line naming it, not onnxruntime's error from inside the calibrator
    q = validate_quantize(copy.deepcopy(config) if config is not None else QuantizeConfig())
    path = Path(path)
    xs = _inputs(calibration)
    unlabelled = data is None or isinstance(data, (torch.Tensor, np.ndarray))
    split = None if unlabelled else as_split(data)
    xe = split.x if split is not None else (xs if data is None else _inputs(data))
    with tempfile.TemporaryDirectory(prefix="api-int8-") as tmp:
        work = Path(tmp)
        if isinstance(model, nn.Module):
            src = work / "model.fp32.onnx"
            sources = {"float": src}
            with _as_given(model):
                trace, checks = xs[:2] if example is None else example, xe[:q.sqnr_samples]
                folded = (export_mod.fold_normalization(copy.deepcopy(model).cpu(), tuple(xs.shape[1:]))
                          if q.fold_normalization and isinstance(model, nn.Sequential) else None)
                if folded is not None:
                    sources = {"folded": work / "model.folded.fp32.onnx", **sources}
                    export_onnx(folded, trace, sources["folded"], check_inputs=checks, opset=opset)
                export_onnx(model, trace, src, check_inputs=checks, opset=opset)
        else:
            src = Path(model)
            if not src.is_file():
                raise FileNotFoundError(f"{src}: no such ONNX file")
            sources = {"float": src}
        calib = int8_mod.calibration_samples(q, xs.cpu(), seed)
        form, made, forms = int8_mod.quantize_forms(sources, path, calib, q, work, check=xe.cpu().numpy())
        pre = made.pre
        threads = q.threads
        logits = {p: ort_util.infer(ort_util.session(f, threads), xe.cpu().numpy()) for p, f in (("fp32", src), ("int8", path))}
        facts = {}
        for p, f in (("fp32", src), ("int8", path)):
            facts[p] = ort_util.file_facts(f, threads)
            if split is not None:
                facts[p]["accuracy"] = ort_util.accuracy(logits[p], split.y.numpy())
        xq = xe[:q.sqnr_samples].cpu().numpy()
        sqnr = int8_mod.input_sqnr_rows(path, xq, tuple(xq.shape[1:])) + int8_mod.sqnr_rows(pre, path, xq, work)
    acts = [r["sqnr_db"] for r in sqnr if r["kind"] == "activation" and isinstance(r["sqnr_db"], float)]
    fidelity = int8_mod.clip_fidelity(logits["fp32"], logits["int8"])
    warning = int8_mod.agreement_warning(str(path), fidelity, q.agreement_floor, "`data`", sqnr, form == "folded")
    if warning:
        warnings.warn(warning, RuntimeWarning, stacklevel=2)
    return {"path": str(path), "source": str(model) if not isinstance(model, nn.Module) else type(model).__name__,
            "settings": {"format": "QDQ", "per_channel": q.per_channel, "reduce_range": q.reduce_range,
                         "activation_type": q.activation_type, "calibration_method": q.calibration_method,
                         "percentile": made.percentile, **({"clip_search": made.search} if made.search else {}),
                         **({"clip_note": made.note} if made.note else {}),
                         "clip_tolerance_pt": q.clip_tolerance_pt,
                         "calibration_samples": len(calib), "keep_removable_activations": q.keep_activations,
                         "quantize_bias": q.quantize_bias, "seed": seed, "input_form": form,
                         **({"input_forms": forms} if forms else {}), "agreement_floor": q.agreement_floor},
            **facts, "samples": len(xe),
            "argmax_agreement": fidelity["agreement"], "warning": warning,
            "max_logit_change": float(np.abs(logits["fp32"] - logits["int8"]).max()),
            "size_ratio": facts["fp32"]["bytes"] / facts["int8"]["bytes"],
            "output_sqnr_db": next((r["sqnr_db"] for r in sqnr if r["tensor"] == ort_util.OUTPUT and r["kind"] == "activation"), None),
            "min_activation_sqnr_db": min(acts) if acts else None, "sqnr": sqnr}


def _inputs(data: Any) -> torch.Tensor:
    """The inputs of `data`: a tensor or array of inputs as they are, anything else through `as_split`."""
    if isinstance(data, (torch.Tensor, np.ndarray)):
        x = torch.as_tensor(data)
        return x.float() if x.is_floating_point() else x
    return as_split(data).x


def verify(model: Any, data: Any, epsilons: Sequence[float] | None = None, low: Any = -math.inf, high: Any = math.inf,
           verifier: str | None = None, timeout_s: float | None = None, samples: int | None = None,
           input_shape: Sequence[int] | None = None, clock: str = "wall", jobs: int = 1,
           progress: bool = True, device: str | None = None) -> dict[str, Any]:
    """L∞ robustness of the first `samples` examples of `data` at each radius, with the verify stage's verifiers
    through its property loop (`analysis.verification.harness`; "auto" = the staged chain: bounds first, the attack a
    probe, then branch and bound; or any registered name or chain "a+b"). `model`: any nn.Module the verifier can read
    (through its ONNX export: ReLU, the smooth gates, residual adds, convolutions, BatchNorm, ...; a module it cannot
    read raises UnsupportedModel naming the op and the module path), or an ONNX file. The box is
    [max(x0 − eps, low), min(x0 + eps, high)] (low/high: the data's valid range; unclipped by default).
    Unset arguments take the verify stage's defaults (`pipeline.config.VerifyConfig`); `timeout_s` is per property,
    and holds within a second: every property's time (its share of the first bound pass, which runs CROWN for all the
    properties batched before anything else, and its own turn) is at most `timeout_s` + 0.5 s. When one CROWN pass of
    the model (measured on the first property) does not fit in `timeout_s`, the property loop's budget sentence (the
    one the verify stage and `pipeline vnncomp` print: `harness.FirstPass`) says so with the limit that would. `progress`: each answer as it comes (a bar on a terminal, else a line per property). `device`: where the
    bounds compute (auto | cpu | cuda | cuda:N).

    A counterexample counts as the verify stage counts it (`Problem.confirm`): a float32 point inside the box whose
    outputs, computed by onnxruntime on the model's ONNX file (a module is exported to a temporary one, as
    `from_torch` reads it), strictly violate the property.

    Returns {"verifier", "rows": one per (eps, sample) with result sat/unsat/timeout/unknown/error, "reason" for an open
    one ("budget": no bound pass finished in its time, "timeout": the search after it ran out, "tie": the model ties at a
    point of the box, so no certificate exists, "unknown", "error"),
    its "margin_lb" (the best found; > 0 proves it) and, for a sat, "counterexample" (the input, float32, shaped like
    one example) and "output" (onnxruntime's outputs there, float32; None otherwise), "certified": {eps: fraction
    unsat}, "first_pass": the measured seconds of one CROWN pass of the model, and "note": the line said when
    `timeout_s` did not cover it (else "")}. `analysis.verification.vnnlib.format_witness(x, y)` writes a
    counterexample in VNN-COMP's form. The verify stage itself (VNN-LIB files, instances.csv, witnesses) stays a stage
    over ONNX files; `analysis.verification.vnncomp` runs a VNN-COMP folder.

    What the verifier reads, per built-in architecture and network kind (`analysis.robustness.coverage`, generated
    by the engine's readers; a model of your own is read when its export uses only `readers.supported_ops()`, e.g. a
    ViT with nn.MultiheadAttention, LayerNorm and a class token):

    | architecture | float ReLU | smooth (λ-GELU) | int8 | float ReLU read by a second tool | decided by the verify stage (float ReLU · smooth · int8) |
    |---|---|---|---|---|---|
    | `mlp` | read | read | read | yes: auto_LiRPA, neuralsat, onnx2pytorch, onnx2torch | 45/45 · 28/30 · 43/45 (hidden [256, 256, 256, 256]; fashion_mnist, ε 0.002–0.008; [run](benchmarks/verify-results/clip-search/mlp/summary.json)) |
    | `cnn` | read | read | read | yes: auto_LiRPA, neuralsat, onnx2pytorch, onnx2torch | 30/30 · 30/30 · 27/30 (channels [16, 32], cnn_hidden 64; digits, ε 0.002–0.008; [run](benchmarks/verify-results/issue40/cnn1632-merged/summary.json)) |
    | `resnet18_cifar` | read | read | read | yes: auto_LiRPA, neuralsat, onnx2pytorch, onnx2torch | 30/30 · 30/30 · 9/30 (resnet_width 8; digits, ε 0.002–0.008; [run](benchmarks/verify-results/resnet18w8/summary.json)) |
    | `deit_tiny` | read | read | read | yes: auto_LiRPA, onnx2pytorch | 28/30 · 28/30 · 0/30 (dim 32, depth 2, heads 4, patch_size 4; digits, ε 0.002–0.008; [run](benchmarks/verify-results/issue40/deit32x2-planes/after/summary.json)) |
    | `gpt` | not read: an integer input (int64: token ids or indices) | not read: an integer input (token ids into an nn.Embedding) | not read: an integer input (int64: token ids or indices) | — | not measured |
    | `preact_resnet` | read | read | read | yes: auto_LiRPA, neuralsat, onnx2pytorch, onnx2torch | 30/30 · 30/30 · 0/30 (channels [8, 16]; digits, ε 0.002–0.008; [run](benchmarks/verify-results/issue40/preact816-merged/summary.json))<br>30/30 · 29/30 · 0/30 (channels [16, 32]; digits, ε 0.002–0.008; [run](benchmarks/verify-results/issue40/preact1632-merged/summary.json)) |
    """
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
    device = harness.resolve_device(device or defaults.device, setting="device=")  # once, before any work
    split = as_split(data)
    n = min(samples, len(split))
    shape = tuple(input_shape or split.x.shape[1:])
    with tempfile.TemporaryDirectory(prefix="api-verify-") as tmp:
        onnx_path = Path(tmp) / "model.onnx"
        if isinstance(model, nn.Module):
            with _as_given(model):
                net = read(model, shape)  # first: an unreadable module is refused with the op and module named
                # the file counterexamples are replayed on, checked against the module on the samples verified
                export_mod.write_checked(copy.deepcopy(model).cpu().float(), torch.zeros(1, *shape), onnx_path,
                                         split.x[:n].reshape(n, *shape).cpu(), dynamic_batch=False)
        elif isinstance(model, (str, Path)):
            onnx_path = Path(model)
            net = read(onnx_path)
        else:  # a ModelProto or its bytes
            import onnx

            export_mod.save(model if isinstance(model, onnx.ModelProto) else onnx.load_from_string(model), onnx_path)
            net = read(onnx_path)
        recheck = harness.OnnxRecheck(onnx_path)
        xs = split.x[:n].double().reshape(n, -1).numpy()
        tasks = [harness.SpecTask(key=(eps, k), verifier=verifier, net=net, recheck=recheck, network="the model",
                                  specs=[robustness_spec(xs[k], eps, low, high, int(split.y[k]), net.num_outputs)])
                 for eps in epsilons for k in range(n)]
        outcomes = harness.run(tasks, harness.PerTask(timeout_s), jobs=jobs, clock=clock,
                               progress="verify" if progress else None, label=lambda key: f"ε {key[0]:g} sample {key[1]}",
                               device=device, setting="timeout_s=", note=lambda s: print(f"verify: {s}"))
    rows = []
    for o in outcomes:
        res, common = o.result, o.row()
        sat = res.status == "sat" and res.counterexample is not None
        rows.append({"sample": o.key[1], "eps": o.key[0], "label": int(split.y[o.key[1]]),
                     **{k: common[k] for k in ("result", "reason", "stage", "seconds", "message", "margin_lb")},
                     "counterexample": np.asarray(res.counterexample, dtype=np.float32).reshape(shape) if sat else None,
                     "output": np.asarray(res.output, dtype=np.float32).reshape(-1) if sat else None})
    certified = {eps: sum(r["result"] == "unsat" for r in rows if r["eps"] == eps) / max(n, 1) for eps in epsilons}
    return {"verifier": registry.resolve(verifier), "samples": n, "rows": rows, "certified": certified,
            "first_pass": outcomes.first_pass.slowest, "note": " ".join(outcomes.first_pass.lines)}
