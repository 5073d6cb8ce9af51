"""The swap stage: every gate of the best checkpoint becomes ReLU, with no weight update."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from . import checkpoint
from .activations import RELU_FORMS, Gate, swapped_activation
from .config import Config
from .rundir import RunDir, atomic_write_json
from .train import dataset_for, predict, resolve_device, score


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
    """Swap every gate for its ReLU form, in place; callers pass a copy when they keep the original."""
    return replace_modules(model, lambda m, _: isinstance(m, Gate), lambda m, _: m.to_relu())


def relu_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec that rebuilds the swapped model: ReLU for a gate, CReLU (linked_relu) for a linked gate
    pair; an activation that is not a gate keeps its own (the swap leaves it unchanged)."""
    return {**spec, "activation": swapped_activation(spec["activation"]) or spec["activation"]}


def run_swap(cfg: Config, run: RunDir) -> dict[str, Any]:
    device = resolve_device(cfg.device)
    ds = dataset_for(cfg)
    bs = cfg.data.eval_batch_size
    result: dict[str, dict[str, float]] = {}  # swap.json: exactly the six numbers per variant
    swapped_to: dict[str, str] = {}  # what each variant's gates became ("no swap": not a gate, e.g. Tanh)
    for variant in cfg.variants:
        model, payload = checkpoint.load_model(run.file("train", variant, "best.pt"), device)
        if not any(isinstance(m, Gate) for m in model.modules()):
            # Nothing to swap (a ReLU baseline): its best checkpoint is already the ReLU model.
            checkpoint.save(run.file("swap", variant, "relu.pt"), model, payload["spec"], source_epoch=payload.get("epoch"),
                            source=str(run.file("train", variant, "best.pt")))
            if payload["spec"]["activation"] not in RELU_FORMS:  # Tanh, ELU, ...: not a gate, so no swap; say so
                m = ds.info.metric
                val, test = (score(predict(model, getattr(ds, s), bs, device), getattr(ds, s).y, m)["metric"] for s in ("val", "test"))
                result[variant] = {"val_before": val, "val_after": val, "test_before": test, "test_after": test,
                                   "argmax_agreement": 1.0, "max_logit_change": 0.0}
                swapped_to[variant] = "no swap"
            continue
        before = {s: predict(model, getattr(ds, s), bs, device) for s in ("val", "test")}
        swapped = to_relu(model)  # the loaded copy is ours to change
        after = {s: predict(swapped, getattr(ds, s), bs, device) for s in ("val", "test")}
        # Agreement and logit change on the validation split: the split the checkpoint was chosen on.
        m = ds.info.metric  # accuracy, or perplexity for language models
        result[variant] = {
            "val_before": score(before["val"], ds.val.y, m)["metric"],
            "val_after": score(after["val"], ds.val.y, m)["metric"],
            "test_before": score(before["test"], ds.test.y, m)["metric"],
            "test_after": score(after["test"], ds.test.y, m)["metric"],
            "argmax_agreement": float((before["val"].argmax(-1) == after["val"].argmax(-1)).float().mean()),
            "max_logit_change": float((before["val"] - after["val"]).abs().max()),
        }
        swapped_to[variant] = swapped_activation(payload["spec"]["activation"]) or "no swap"
        checkpoint.save(run.file("swap", variant, "relu.pt"), swapped, relu_spec(payload["spec"]),
                        source_epoch=payload.get("epoch"), source=str(run.file("train", variant, "best.pt")))
    atomic_write_json(run.file("swap", "swap.json"), result)
    return {**result, "swapped_to": swapped_to}
