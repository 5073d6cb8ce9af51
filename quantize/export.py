"""A model to one self-contained fp32 ONNX file, checked against a float64 run of it: `write_checked`, the one
sequence (trace → onnxsim → checks → save → onnxruntime and PyTorch against float64 → facts) behind every ONNX file
the pipeline writes: the export stage (`pipeline/stages/export.py`), the int8 stage's folded form, the sparsity stage's
pruned model, the verify stage's ReLU files (`export_for_verifiers`) and `analysis.api.export_onnx`/`verify`.

Decisions (see also docs/architecture.md, "Pitfalls"):
- Exporter: `torch.onnx.export(..., dynamo=False)`, the TorchScript tracer. The dynamo exporter
  (torch ≥ 2.9's default) needs onnxscript, a further dependency, for graphs this simple; the tracer
  is deprecated but present through torch 2.14 (pyproject pins torch < 2.15).
- Opset 20 (the tracer's highest): the first with a native `Gelu` op, so λ-GELU = GELU(λx)/λ exports
  as Mul → Gelu → Div, three nodes instead of the seven-node Erf expansion of opset ≤ 19, and plain
  GELU as one node. The ReLU graphs are the same at any opset ≥ 13 (Gemm/Conv/Relu/Flatten).
- nn.MultiheadAttention exports with its fused eval-mode fast path off (`mha_fastpath`), the tracer
  having no symbolic for the fused op.
- Inputs in natural units: the model's first module `Normalize` (x·scale + shift) is inside the graph.
- Dynamic batch axis on the input and the logits; onnxsim keeps it (checked, not assumed).
- Single file: no external data (checked), `onnx.checker.check_model(full_check=True)`, then
  onnxruntime and PyTorch each against a float64 run of the model on a validation batch (`compare`),
  output by output, with the tolerance float32 rounding can account for in this network and input
  (`quantize/rounding.py`). Two float32 engines are never compared with each other: either one can be
  the less accurate (onnxruntime sums a Gemm, or a folded normalization, in another order than PyTorch).
"""

from __future__ import annotations

import copy
import json
import warnings
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from pipeline.atomic_io import atomic_path
from pipeline.config import ExportConfig
from pipeline.opset import OPSET, VERIFIERS_OPSET
from pipeline.devices import cpu_model
# The exporter itself lives with onnxruntime's sessions (`pipeline.onnx_io`); the stages and their callers use it here.
from pipeline.onnx_io import ExportError, check_graph, to_onnx  # noqa: F401
from pipeline.outputs import traceable

from . import ort as ort_util
from . import rounding
from . import verifier_form

# Slack on top of the derived rounding bound (quantize/rounding.py), absolute and times max|logit|: the defaults
# of export.atol and export.rtol. None is needed where every op has a rule; they are for ops that have none.
FP32_ATOL = 0.0
FP32_RTOL = 0.0
# Check inputs the float64 rounding bound is derived on, at most (spread evenly over them), where a caller asks for a
# bounded check (`analysis.api.export_onnx`): the cost is linear in them (a traced float64 forward and a backward per
# checked output, in chunks; 500 inputs of a 108k-parameter ViT take about 1.3 s on 2 cores, benchmarks/EXPORT.md).
BOUND_SAMPLES = 512
EXPORTER = "torch.onnx.export(dynamo=False)"


def save(proto: onnx.ModelProto, path: Path) -> None:
    with atomic_path(path) as tmp:
        onnx.save_model(proto, str(tmp), save_as_external_data=False)


@torch.no_grad()
def compare(path: Path, model: nn.Module, x: torch.Tensor, atol: float = FP32_ATOL, rtol: float = FP32_RTOL,
            threads: int = 1, bound_samples: int | None = None) -> dict[str, Any]:
    """onnxruntime and PyTorch (float32) each against a float64 run of `model` on x, output by output, with the
    tolerance derived from the network (`quantize.rounding.forward_bound`: how far float32 rounding can move
    each output) plus atol + rtol·max|logit| (default 0). Raises ExportError where onnxruntime is further from
    float64 than that: the graph computes another function (a wrong op or weight), not the same one rounded.
    `bound_samples`: derive the bound (and so make this check) on at most that many of the inputs, spread evenly
    (None: all); both engines still run on every input, for `argmax_agreement` and `max_abs_diff`.

    PyTorch beyond its bound says the bound missed something in this network (the ops without a rule are listed
    in `unmodelled_ops`): a warning, not an error, since the export is not at fault.
    """
    model = cpu_model(model).eval()  # the caller's model stays where it is
    ref32_all = model(x).numpy()  # x may exceed a fixed-batch graph's batch: `infer` feeds it in slices
    got_all = ort_util.infer(ort_util.session(path, threads), x.numpy())
    rows = (np.arange(len(x)) if bound_samples is None or len(x) <= bound_samples
            else np.unique(np.linspace(0, len(x) - 1, bound_samples).round().astype(int)))
    ref32, got = ref32_all[rows], got_all[rows]
    b = rounding.forward_bound(model, x[torch.as_tensor(rows)])
    n = len(rows)
    ref64 = b.reference.reshape(n, -1)[:, b.index]
    scale = float(np.abs(b.reference).max())
    tol = b.bound + atol + rtol * scale
    out: dict[str, Any] = {"samples": len(x), "samples_bounded": n, "outputs_checked": int(b.bound.shape[1]),
                           "outputs": int(b.reference[0].size),
                           "max_abs_logit": scale, "bound_max": float(tol.max()), "bound_median": float(np.median(tol)),
                           "max_abs_diff": float(np.abs(got_all - ref32_all).max()),
                           "argmax_agreement": float((got_all.argmax(-1) == ref32_all.argmax(-1)).mean()),
                           "unmodelled_ops": b.unmodelled}
    for engine, y in (("torch", ref32), ("ort", got)):  # PyTorch first: the error message quotes it
        err = np.abs(y.reshape(n, -1)[:, b.index] - ref64)
        ratio = np.where(tol > 0, err / np.where(tol > 0, tol, 1), np.where(err > 0, np.inf, 0))
        out[f"{engine}_vs_fp64"] = float(err.max())
        out[f"{engine}_bound_ratio"] = float(ratio.max())  # also NaN when an engine gave NaN
        if engine == "ort" and not ratio.max() <= 1:
            i, j = np.unravel_index(np.nanargmax(np.where(np.isnan(ratio), np.inf, ratio)), ratio.shape)
            extra = f"; ops the bound does not model: {', '.join(b.unmodelled)} (export.atol adds slack)" if b.unmodelled else ""
            raise ExportError(f"{path}: onnxruntime is {err[i, j]:.3g} from the float64 result at input {rows[i]}, output {b.index[j]}, "
                              f"where float32 rounding accounts for at most {tol[i, j]:.3g} (PyTorch: {out['torch_vs_fp64']:.3g} at "
                              f"most, {out['torch_bound_ratio']:.2g}x its bound): the graph computes another function{extra}")
    if not out["torch_bound_ratio"] <= 1:
        warnings.warn(f"{path}: PyTorch float32 exceeds the derived rounding bound ({out['torch_bound_ratio']:.3g}x)"
                      + (f"; ops without a rule: {', '.join(b.unmodelled)}" if b.unmodelled else ""), RuntimeWarning, stacklevel=2)
    return out


def fold_normalization(model: nn.Module, input_shape: tuple[int, ...]) -> nn.Sequential | None:
    """An input normalization (a first module computing x·scale + shift, like `pipeline.models.Normalize`),
    an optional Flatten and a Linear become [Flatten →] Linear' with W' = W·diag(scale), b' = b + W·shift
    (float64 algebra); None if the model does not start that way. A Conv cannot take the fold (its zero
    padding is not zero after the shift), so a CNN keeps its Mul/Add prologue; a model that is not an nn.Sequential
    gives None too."""
    if not isinstance(model, nn.Sequential):
        return None
    names = list(model._modules)
    mods = list(model._modules.values())
    flat = len(mods) > 1 and isinstance(mods[1], nn.Flatten)
    k = 2 if flat else 1
    if len(mods) <= k or not (hasattr(mods[0], "scale") and hasattr(mods[0], "shift") and isinstance(mods[k], nn.Linear)):
        return None
    norm, lin = mods[0], mods[k]
    ones = torch.ones((1, *input_shape), dtype=torch.float64)
    scale = (ones * torch.as_tensor(norm.scale).double()).flatten()  # per input feature after Flatten
    shift = (ones * torch.as_tensor(norm.shift).double()).flatten()
    w = lin.weight.double()
    b = lin.bias.double() if lin.bias is not None else torch.zeros(lin.out_features, dtype=torch.float64)
    folded = nn.Linear(lin.in_features, lin.out_features)
    with torch.no_grad():
        folded.weight.copy_(w * scale[None, :])
        folded.bias.copy_(b + w @ shift)
    out = copy.deepcopy(model)
    del out._modules[names[0]]
    out._modules[names[k]] = folded
    return out.eval()


def verifier_model(model: nn.Module, input_shape: tuple[int, ...]) -> nn.Module:
    """The form of a swapped ReLU model that verifiers read: linked ReLU pairs unfolded into one wider
    affine layer (Linear([W; −W]) → ReLU), the input normalization folded into the first Linear where it
    can be. Same function as `model` (exact algebra, float64 folds)."""
    from pipeline.relu_swap import unfold_linked_relu

    net = unfold_linked_relu(model).eval()
    return fold_normalization(net, tuple(input_shape)) or net


@dataclass(frozen=True)
class Written:
    """An ONNX file `write_checked` wrote: its path, facts about the file (bytes, nodes before and after onnxsim, op
    counts, and what a `form` added) and its check against PyTorch (`compare`'s numbers)."""

    path: Path
    facts: dict[str, Any]
    check: dict[str, Any]

    def record(self) -> dict[str, Any]:
        """Path, facts and check in one flat dict, as export.json and the API report them."""
        return {"path": str(self.path), **self.facts, **self.check}


def settings(ecfg: ExportConfig, threads: int = 1) -> dict[str, Any]:
    """`write_checked`'s options as a run's export section sets them (`threads`: onnxruntime's, the quantize section's)."""
    return {"opset": ecfg.opset, "simplify": ecfg.simplify, "atol": ecfg.atol, "rtol": ecfg.rtol, "threads": threads}


def write_checked(model: nn.Module, example: torch.Tensor, path: Path, check_inputs: torch.Tensor, *,
                  reference: nn.Module | None = None, opset: int = OPSET, simplify: bool = True, atol: float = FP32_ATOL,
                  rtol: float = FP32_RTOL, threads: int = 1, bound_samples: int | None = None,
                  metadata: dict[str, str] | None = None, dynamic_batch: bool = True,
                  form: Callable[[onnx.ModelProto], tuple[onnx.ModelProto, dict[str, Any]]] | None = None) -> Written:
    """The one way a model becomes an ONNX file: `model` traced on `example` (`to_onnx`, a Hugging Face model made
    traceable first), rewritten by `form` where one is given (its facts kept, the graph checked again), saved to
    `path`, then onnxruntime and PyTorch each against a float64 run of `reference` (default: `model` itself) on
    `check_inputs` (`compare`: ExportError where onnxruntime leaves the float32 rounding bound)."""
    path = Path(path)
    with traceable(model):
        proto, facts = to_onnx(model, example, opset, simplify, metadata, dynamic_batch)
    if form is not None:
        proto, extra = form(proto)
        check_graph(proto, dynamic_batch)
        facts.update(extra)
    save(proto, path)
    check = compare(path, model if reference is None else reference, check_inputs, atol, rtol, threads, bound_samples)
    return Written(path, {"bytes": ort_util.file_bytes(path), **facts, "ops": ort_util.op_counts(proto)}, check)


def export_for_verifiers(model: nn.Module, input_shape: tuple[int, ...], path: Path, x: torch.Tensor,
                         opset: int = OPSET, atol: float = FP32_ATOL, rtol: float = FP32_RTOL,
                         metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """`verifier_model(model)` to a batch-1 ONNX at `path` in the form other verifiers' loaders read
    (`quantize.verifier_form`: Flatten/Gemm/Conv/Relu, a Mul/Add prologue only where no fold is exact), checked
    against `model` itself on the inputs `x` like every export (`write_checked`)."""
    def to_form(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, Any]]:
        proto, made = verifier_form.to_verifier_form(proto, tuple(input_shape))
        return proto, {"verifier_form": made}

    return write_checked(verifier_model(model, input_shape), x[:1], path, x, reference=model,
                         opset=min(opset, VERIFIERS_OPSET), metadata=metadata, dynamic_batch=False, atol=atol,
                         rtol=rtol, form=to_form).record()


def metadata_for(payload: dict[str, Any], variant: str, form: str, info) -> dict[str, str]:
    spec = payload["spec"]
    return {"variant": variant, "form": form, "activation": spec["activation"],
            "input_shape": json.dumps(spec["input_shape"]), "num_classes": str(spec["num_classes"]),
            "input_units": "natural (the data's own units; normalization is inside the graph)",
            "input_low": json.dumps(info.input_low), "input_high": json.dumps(info.input_high)}