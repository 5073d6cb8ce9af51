"""The swap as a library: every gate of a model becomes ReLU, with no weight update. The swap stage
(`pipeline/stages/swap.py`), the train stage's `harden.method=swap`, the certificate and `to_gates`' users call these.

A gate function called inside some forward (`x = F.gelu(x)`) is no module, so no swap can replace it: `to_relu`
and `swap_report` watch one forward (`pipeline.probe`) and refuse such a model with `SwapError`, rather than hand
back a "ReLU" model that still computes GELU.
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


def check_swappable(model: nn.Module, example: Any = None, who: str = "to_relu") -> None:
    """SwapError when a forward of `model` calls F.gelu / F.silu / F.mish outside the gate modules the swap replaces
    (`pipeline.probe`: one forward on `example`, or on a zero batch read from the first layer; a model whose input
    size cannot be read is not watched: pass `example`)."""
    calls = smooth_calls(model, example, _swapped).calls
    if calls:
        what = ", ".join(f"{c.name} in {c.where()}" for c in sorted(calls, key=lambda c: (c.fqn, c.name)))
        raise SwapError(f"{who}: the model calls {what} inside forward(), and no swap can replace a call: the model would "
                        "still compute that smooth gate. Hold it as a module (self.act = nn.GELU()), then to_gates and "
                        "harden it")


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
    itself and would ignore a gate or a ReLU put in later (measured: a swapped layer gave the GELU outputs exactly).
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
    models and the largest |Δlogit|. `model` itself is not changed (a copy is swapped). A model that calls a gate
    function inside a forward (found by one forward on the data's first rows) is refused with SwapError."""
    split = as_split(data)
    param = next(model.parameters(), None)
    example = split.x[:2].to(param.device if param is not None else "cpu")
    check_swappable(model, example, "swap_report")
    swapped = to_relu(copy.deepcopy(model), example)
    before = predict(model, split, batch_size, device)
    after = predict(swapped, split, batch_size, device)
    b, a = score(before, split.y, metric), score(after, split.y, metric)
    return {"before": b["metric"], "after": a["metric"], "loss_before": b["loss"], "loss_after": a["loss"],
            "argmax_agreement": float((before.argmax(-1) == after.argmax(-1)).float().mean()),
            "max_logit_change": float((before - after).abs().max())}


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
