"""The swap stage: every gate of the best checkpoint becomes ReLU, with no weight update."""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
from torch import nn

from . import checkpoint
from .activations import Gate, Linked, gate_of, swapped_activation
from .config import Config
from .data import as_split, dataset_for
from .distributed import resolve_device
from .errors import TrainingError
from .evaluate import predict, score
from .rundir import RunDir, atomic_write_json


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


def to_relu(model: nn.Module) -> nn.Module:
    """Swap every gate (`activations.gate_of`: the project's gates and torch's nn.GELU / nn.SiLU / nn.Mish)
    for its ReLU form, in place; callers pass a copy when they keep the original. A linked pair keeps its
    pairing: its inner gate becomes ReLU, so the pair is CReLU."""
    return replace_modules(model, lambda m, _: gate_of(m) is not None,
                           lambda m, _: m.to_relu() if isinstance(m, Gate) else nn.ReLU())


def swap_report(model: nn.Module, data, batch_size: int = 2048, device: torch.device | str = "cpu",
                metric: str = "accuracy") -> dict[str, float]:
    """What swapping every gate to ReLU does to `model` on `data` (a Split, (x, y) tensors, a DataLoader:
    `data.as_split`), the swap stage's numbers: the metric before and after, the top-1 agreement of the two
    models and the largest |Δlogit|. `model` itself is not changed (a copy is swapped)."""
    split = as_split(data)
    before = predict(model, split, batch_size, device)
    after = predict(to_relu(copy.deepcopy(model)), split, batch_size, device)
    b, a = score(before, split.y, metric), score(after, split.y, metric)
    return {"before": b["metric"], "after": a["metric"], "loss_before": b["loss"], "loss_after": a["loss"],
            "argmax_agreement": float((before.argmax(-1) == after.argmax(-1)).float().mean()),
            "max_logit_change": float((before - after).abs().max())}


def _mirrored(layer: nn.Module) -> nn.Module:
    """The affine layer with its outputs followed by their negatives: [W; −W], [b; −b]."""
    new = copy.deepcopy(layer)
    w = layer.weight.detach()
    new.weight = nn.Parameter(torch.cat([w, -w], dim=0))
    if layer.bias is not None:
        new.bias = nn.Parameter(torch.cat([layer.bias.detach(), -layer.bias.detach()]))
    if isinstance(new, nn.Linear):
        new.out_features *= 2
    else:
        new.out_channels *= 2
    return new


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


def relu_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec that rebuilds the swapped model: ReLU for a gate, CReLU (linked_relu) for a linked gate
    pair; an activation that is not a gate keeps its own (the swap leaves it unchanged)."""
    return {**spec, "activation": swapped_activation(spec["activation"]) or spec["activation"]}


def _refuse_diverged(payload: dict[str, Any], cfg: Config, variant: str, source) -> None:
    """The divergence rule of the train stage, applied again to the checkpoint that would ship: a model whose
    training loss ran away (however it got selected) is not swapped, exported or verified."""
    f, loss, init = cfg.train.divergence_factor, payload.get("train_loss"), payload.get("initial_loss")
    if loss is None:
        return  # a checkpoint saved outside the train stage (the API's) carries no training losses
    if not math.isfinite(loss) or (f > 0 and init and loss > f * init):
        untrained = f"{init:.4g}" if init else "not recorded"
        raise TrainingError(f"{variant}: {source} comes from a diverged training (mean loss {loss:.4g}, untrained "
                            f"{untrained}); lower train.lr and rerun training (`--redo train`) before swapping it")


def run_swap(cfg: Config, run: RunDir) -> dict[str, Any]:
    """swap.json: per variant the metric before and after the swap on val and test, the argmax agreement and
    largest |Δlogit| on val (the split the checkpoint was chosen on), and the test loss before and after. A
    variant with nothing to swap (a ReLU baseline, a non-gate like Tanh) is recorded too, before = after: its
    numbers are what the swapped networks are compared with."""
    device = resolve_device(cfg.device)
    ds = dataset_for(cfg)
    bs = cfg.data.eval_batch_size
    m = ds.info.metric  # accuracy, or perplexity for language models
    result: dict[str, dict[str, float]] = {}
    swapped_to: dict[str, str] = {}  # what each variant's gates became
    for variant in cfg.variants:
        facts = run.variant(variant)
        source = run.file("train", variant, "best.pt")
        model, payload = checkpoint.load_model(source, device)
        _refuse_diverged(payload, cfg, variant, source)
        val, test = (swap_report(model, getattr(ds, s), bs, device, m) for s in ("val", "test"))
        result[variant] = {"val_before": val["before"], "val_after": val["after"], "test_before": test["before"],
                           "test_after": test["after"], "argmax_agreement": val["argmax_agreement"],
                           "max_logit_change": val["max_logit_change"], "test_loss_before": test["loss_before"],
                           "test_loss_after": test["loss_after"]}
        if facts["swapped_to"] in (None, facts["activation"]):
            # Nothing to swap: a ReLU baseline's checkpoint already is its ReLU model; a non-gate stays as it is.
            swapped, spec = model, payload["spec"]
            swapped_to[variant] = "no swap" if facts["swapped_to"] is None else "already ReLU"
        else:
            swapped, spec = to_relu(model), relu_spec(payload["spec"])  # the loaded copy is ours to change
            swapped_to[variant] = facts["swapped_to"]
        checkpoint.save(run.file("swap", variant, "relu.pt"), swapped, spec, source_epoch=payload.get("epoch"),
                        source=str(source.relative_to(run.path)))
    atomic_write_json(run.file("swap", "swap.json"), result)
    return {**result, "swapped_to": swapped_to}
