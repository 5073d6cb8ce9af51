"""The swap as a library: every gate of a model becomes ReLU, with no weight update. The swap stage
(`pipeline/stages/swap.py`), the train stage's `harden.method=swap`, the certificate and `to_gates`' users call these.

A gate function called inside some forward (`x = F.gelu(x)`) is no module, and an activation module of a class the
swap does not know (GPT-2's `NewGELUActivation`, timm's `GELU`) computes its gate by its own formula: no swap can
replace either. `to_relu` and `swap_report` watch one forward (`pipeline.probe`) and refuse such a model with
`SwapError`, naming each module and the fix (`to_gates` first), rather than hand back a "ReLU" model that still
computes GELU; where no input can be read from the model they ask for `example=`, in one line.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .activations import Gate, Linked, gate_of, gate_sites, is_activation
from .affine import set_outputs
from .data import as_split
from .errors import PipelineError
from .evaluate import predict, score
from .outputs import logits_view
from .probe import smooth_calls


class SwapError(PipelineError):
    """The swap cannot make this model ReLU (one line naming the fix)."""


def replace_modules(root: nn.Module, match: Callable[[nn.Module, str], bool],
                    make: Callable[[nn.Module, str], nn.Module]) -> nn.Module:
    """Replace every submodule for which match(module, fqn) holds by make(module, fqn); returns the root.

    Replaced modules are not descended into. The root itself may be replaced.
    """
    if match(root, ""):
        return make(root, "")

    def walk(parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent.named_children()):
            fqn = f"{prefix}{name}"
            if match(child, fqn):
                setattr(parent, name, make(child, fqn))
            else:
                walk(child, fqn + ".")

    walk(root, "")
    return root


def _swapped(m: nn.Module) -> bool:
    return gate_of(m) is not None


def smooth_work_error(calls: list, who: str) -> str:
    """The one-line refusal for smooth gate work the swap cannot replace (`pipeline.probe.Call`s), with the fix for
    each kind: a module of a class the swap does not know is converted by to_gates; a call needs a module first."""
    calls = sorted(calls, key=lambda c: (c.fqn, c.name))
    modules = [c.describe() for c in calls if c.computes]
    inline = [c.describe() for c in calls if not c.computes]
    parts = []
    if modules:
        parts.append(f"{'; '.join(modules)}: a gate of a class the swap does not replace; convert it first with "
                     "model, report = to_gates(model) (it becomes a hardenable gate, then ReLU)")
    if inline:
        parts.append(f"the model calls {', '.join(inline)} inside forward(), and no swap can replace a call: hold it as "
                     "a module (self.act = nn.GELU()), then to_gates and harden it")
    return f"{who}: the swap would leave smooth gates computing: " + "; ".join(parts)


def check_swappable(model: nn.Module, example: Any = None, who: str = "to_relu") -> None:
    """SwapError when a forward of `model` does smooth gate work outside the gate modules the swap replaces
    (`pipeline.probe`: F.gelu / F.silu / F.mish called inside a forward, an activation module that computes a gate by
    its own formula; one forward on `example`, or on a zero batch read from the model), and when no forward can be
    watched: the swap would be unchecked, so `example=` is asked for."""
    found = smooth_calls(model, example, _swapped)
    if found.calls is None:
        raise SwapError(f"{who}: cannot watch the model's forward for smooth gates the swap would leave ({found.how}); "
                        f"pass example=<an input batch>")
    if found.calls:
        raise SwapError(smooth_work_error(found.calls, who))


# The owner of a bounded gate that scales another tensor: timm's SqueezeExcite, torchvision's SqueezeExcitation, an SE
# block by any other name
SQUEEZE_EXCITE = re.compile(r"squeeze|excit|(^|[^a-z])se([^a-z]|$)", re.IGNORECASE)
BOUNDED = (nn.Sigmoid, nn.Hardsigmoid, nn.Tanh, nn.Softsign)  # activations with no ReLU limit: gates in [0, 1] or [−1, 1]
BOUNDED_NAME = re.compile(r"sigmoid|tanh", re.IGNORECASE)


def _kept_reason(model: nn.Module, fqn: str, m: nn.Module) -> str:
    if isinstance(m, BOUNDED) or BOUNDED_NAME.search(type(m).__name__):
        owner = model.get_submodule(fqn.rpartition(".")[0]) if "." in fqn else model
        if SQUEEZE_EXCITE.search(type(owner).__name__) or any(SQUEEZE_EXCITE.search(p) for p in fqn.split(".")[:-1]):
            return "squeeze-excite gates, not activations"
        return "bounded, with no ReLU form (x·g(λx) → ReLU is what the swap replaces)"
    return "computes no gate x·g(λx), so it has no ReLU form"


def kept_activations(model: nn.Module) -> list[str]:
    """What the swap keeps as it is, one line per kind and reason: "7 Sigmoid kept: squeeze-excite gates, not
    activations". Activations that are neither a gate (`gate_of`) nor ReLU (`activations.is_activation`)."""
    found: Counter = Counter()
    for fqn, m in model.named_modules():
        if gate_of(m) is None and not isinstance(m, (nn.ReLU, Linked)) and is_activation(m):
            found[(type(m).__name__, _kept_reason(model, fqn, m))] += 1
    return [f"{n} {name} kept: {why}" for (name, why), n in found.items()]


def to_relu(model: nn.Module, example: Any = None, allow_unchanged: bool = False) -> nn.Module:
    """Swap every gate (`activations.gate_of`: the project's gates and torch's nn.GELU / nn.SiLU / nn.Mish)
    for its ReLU form, in place; callers pass a copy when they keep the original. A linked pair keeps its
    pairing: its inner gate becomes ReLU, so the pair is CReLU. A model that calls a gate function inside a
    forward is refused (`check_swappable`, on `example` or an input read from its first layer), and so is one with
    no gate whose other activations are not ReLU (it would come back unchanged, called ReLU; `kept_activations` says
    what it keeps) unless `allow_unchanged` (a baseline's swapped model is itself)."""
    check_swappable(model, example)
    if not gate_sites(model) and not allow_unchanged:
        kept = kept_activations(model)
        if kept:
            raise SwapError(f"to_relu: nothing to swap: the model has no gate, and it is not ReLU ({'; '.join(kept)}); "
                            "convert its activations first with model, report = to_gates(model) (the report says why "
                            "each is left), or take it as it is with to_relu(model, allow_unchanged=True)")
    model = replace_modules(model, lambda m, _: _swapped(m), lambda m, _: m.to_relu() if isinstance(m, Gate) else nn.ReLU())
    sync_fused_activation(model)
    return model


def sync_fused_activation(root: nn.Module) -> None:
    """torch's nn.TransformerEncoderLayer decides when it is built whether its fused eval-mode kernel may run, from the
    activation it holds then (`activation_relu_or_gelu`: 1 ReLU, 2 GELU, 0 another); that kernel computes ReLU or GELU
    itself and would ignore a gate or a ReLU put in later (a swapped layer would give the GELU outputs exactly).
    Recomputed from the activation each such layer holds now, after every swap of activations."""
    for m in root.modules():
        if hasattr(m, "activation_relu_or_gelu"):
            a = getattr(m, "activation", None)
            m.activation_relu_or_gelu = (1 if a is F.relu or isinstance(a, nn.ReLU) else
                                         2 if a is F.gelu or isinstance(a, nn.GELU) else 0)


def swap_report(model: nn.Module, data, batch_size: int = 2048, device: torch.device | str = "cpu",
                metric: str = "accuracy") -> dict[str, float]:
    """What swapping every gate to ReLU does to `model` on `data` (a Split, (x, y) tensors, a DataLoader:
    `data.as_split`), the swap stage's numbers: the metric before and after, the top-1 agreement of the two
    models and the largest |Δlogit|. `model` itself is not changed (a copy is swapped). A model with smooth gate
    work the swap cannot replace (found by one forward on the data's first rows) is refused with SwapError. A model
    that returns a Hugging Face ModelOutput, a dict or a tuple is measured on its logits (`pipeline.outputs`), and
    `output` says which. `swapped`: how many gates became ReLU (0: nothing was swapped, and `note` says so, never a
    bare agreement of 1.0); `kept`: what the swap keeps as it is, with the reason (`kept_activations`)."""
    split = as_split(data)
    param = next(model.parameters(), None)
    example = split.x[:2].to(param.device if param is not None else "cpu")
    model, output = logits_view(model, example)
    check_swappable(model, example, "swap_report")
    n_gates, kept = len(gate_sites(model)), kept_activations(model)
    swapped = to_relu(copy.deepcopy(model), example, allow_unchanged=True)
    before = predict(model, split, batch_size, device)
    after = predict(swapped, split, batch_size, device)
    b, a = score(before, split.y, metric), score(after, split.y, metric)
    said = {"note": "nothing to swap: the model has no gate, so before = after" + ("" if kept else " (it is ReLU already)")
            } if n_gates == 0 else {}
    return {"before": b["metric"], "after": a["metric"], "loss_before": b["loss"], "loss_after": a["loss"],
            "argmax_agreement": float((before.argmax(-1) == after.argmax(-1)).float().mean()),
            "max_logit_change": float((before - after).abs().max()), "swapped": n_gates, "kept": kept, **said,
            **({"output": output} if output else {})}


def _mirrored(layer: nn.Module) -> nn.Module:
    """A copy of the affine layer with its outputs followed by their negatives: [W; −W], [b; −b]."""
    w, b = layer.weight.detach(), None if layer.bias is None else layer.bias.detach()
    return set_outputs(copy.deepcopy(layer), torch.cat([w, -w], dim=0), None if b is None else torch.cat([b, -b]))


def unfold_linked_relu(model: nn.Module) -> nn.Module:
    """A copy in which every affine layer → CReLU pair of an nn.Sequential becomes affine(2C) → ReLU:
    CReLU(Wx + b) = ReLU([W; −W]x + [b; −b]), exactly (up to the summation order of a wider GEMM). For
    readers that know Gemm/Conv/Relu but no Neg/Concat (verifiers, interval bounds)."""
    net = copy.deepcopy(model)
    for seq in [m for m in net.modules() if isinstance(m, nn.Sequential)]:
        names = list(seq._modules)
        for prev, name in zip(names, names[1:]):
            m, p = seq._modules[name], seq._modules[prev]
            if isinstance(m, Linked) and isinstance(m.inner, nn.ReLU) and isinstance(p, (nn.Linear, nn.Conv2d)):
                seq._modules[prev], seq._modules[name] = _mirrored(p), nn.ReLU()
    return net


def relu_spec(spec: dict[str, Any], swapped_to: str) -> dict[str, Any]:
    """The spec that rebuilds the swapped model: the checkpoint's spec with the activation the variant's record
    says the swap turns it into (`VariantRecord.swapped_to`: relu for a gate, linked_relu for a linked pair)."""
    return {**spec, "activation": swapped_to}
