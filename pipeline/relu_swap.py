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
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .activations import Gate, Linked, gate_of
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


def to_relu(model: nn.Module, example: Any = None) -> nn.Module:
    """Swap every gate (`activations.gate_of`: the project's gates and torch's nn.GELU / nn.SiLU / nn.Mish)
    for its ReLU form, in place; callers pass a copy when they keep the original. A linked pair keeps its
    pairing: its inner gate becomes ReLU, so the pair is CReLU. A model that calls a gate function inside a
    forward is refused (`check_swappable`, on `example` or an input read from its first layer)."""
    check_swappable(model, example)
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
    `output` says which."""
    split = as_split(data)
    param = next(model.parameters(), None)
    example = split.x[:2].to(param.device if param is not None else "cpu")
    model, output = logits_view(model, example)
    check_swappable(model, example, "swap_report")
    swapped = to_relu(copy.deepcopy(model), example)
    before = predict(model, split, batch_size, device)
    after = predict(swapped, split, batch_size, device)
    b, a = score(before, split.y, metric), score(after, split.y, metric)
    return {"before": b["metric"], "after": a["metric"], "loss_before": b["loss"], "loss_after": a["loss"],
            "argmax_agreement": float((before.argmax(-1) == after.argmax(-1)).float().mean()),
            "max_logit_change": float((before - after).abs().max()), **({"output": output} if output else {})}


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
