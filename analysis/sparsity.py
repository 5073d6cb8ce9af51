"""APoZ of a ReLU model, and lossless pruning of its dead units: the library of the sparsity stage
(`pipeline/stages/sparsity.py`).

APoZ (average percentage of zeros) of a unit is the fraction of its ReLU outputs that are exactly 0
over the validation set; for a conv channel, over every position of every sample. APoZ = 100% is a
dead unit, APoZ = 0% an always-active one (linear on this data). λ-GELU never outputs an exact zero,
so on the smooth model we report the fraction of non-positive pre-activations instead (what APoZ
would be if its gates were ReLUs at that point). Statistics are streamed batch by batch.

A dead unit's output is 0 for every validation input, so removing it (its row of W_l and b_l, the
matching column(s) of the next layer) leaves the logits unchanged on that set: checked in float64
against `sparsity.atol`, where only the removal can change anything (float32 changes the summation
order, hence ~1e-7 noise). On other inputs a unit dead on validation may fire; the test-set change
is reported next to it rather than assumed to be zero.

Apart from those, units *provably* dead or always active for every input in the data's valid range
(`analysis.verification.stability.stable_units`: CROWN/α-CROWN bounds, IBP counts beside) are counted per
layer (a conv channel when all its positions are): pruning those is lossless for every input.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline import render
from pipeline.activations import Linked, activation_sites
from pipeline.affine import AFFINE, set_inputs, set_outputs
from pipeline.data import Split, batches
from pipeline.devices import model_on
from pipeline.errors import PipelineError
from pipeline.gates import channel_axis
from pipeline.atomic_io import atomic_path

PRUNE_ATOL = 1e-6  # pruned vs original logits on the validation set, float64 (the default of sparsity.atol)


class PruneError(PipelineError):
    pass


@torch.no_grad()
def unit_stats(model: nn.Module, split: Split, batch_size: int, device: torch.device | str = "cpu") -> dict[str, dict[str, torch.Tensor]]:
    """Per activation site and unit: count of exact-zero outputs, of non-positive inputs, of positions.

    A unit is a feature of a [N, F] activation or a channel of a [N, C, H, W] one (counted over N·H·W).
    """
    model = model_on(model, device).eval()  # the caller's model stays where it is
    stats: dict[str, dict[str, torch.Tensor]] = {}

    def hook(name: str):
        def fn(m, inputs, output):
            x = inputs[0]
            if isinstance(m, Linked):  # output j < C is g(z_j), output C + j is g(−z_j)
                x = torch.cat([x, -x], dim=channel_axis(x))
            axis = channel_axis(x)
            dims = [d for d in range(x.dim()) if d != axis]  # every axis but the unit axis
            s = stats.setdefault(name, {"zero": 0, "nonpos": 0, "positions": 0})
            s["zero"] = s["zero"] + (output == 0).sum(dims).long().cpu()
            s["nonpos"] = s["nonpos"] + (x <= 0).sum(dims).long().cpu()
            s["positions"] += x.numel() // x.shape[axis]
        return fn

    handles = [m.register_forward_hook(hook(n)) for n, m in activation_sites(model)]
    try:
        for x, _ in batches(split, batch_size):
            model(x.to(device))
    finally:
        for h in handles:
            h.remove()
    return stats


def apoz(stats: dict[str, dict[str, torch.Tensor]]) -> dict[str, np.ndarray]:
    return {n: (s["zero"].double() / s["positions"]).numpy() for n, s in stats.items()}


def nonpositive_fraction(stats: dict[str, dict[str, torch.Tensor]]) -> dict[str, np.ndarray]:
    return {n: (s["nonpos"].double() / s["positions"]).numpy() for n, s in stats.items()}


# ---------------------------------------------------------------------------------------------
# Pruning


def _neighbours(mods: list[tuple[str, nn.Module]], k: int) -> tuple[int, int, bool]:
    """Producer (last affine layer before site k), consumer (first after), and a Flatten in between."""
    prod = next((i for i in range(k - 1, -1, -1) if isinstance(mods[i][1], AFFINE)), None)
    cons = next((i for i in range(k + 1, len(mods)) if isinstance(mods[i][1], AFFINE)), None)
    if prod is None or cons is None:
        raise PruneError(f"activation {mods[k][0]} has no affine layer on one side; cannot prune it")
    between = [m for _, m in mods[prod + 1:cons] if m is not mods[k][1]]
    if any(not isinstance(m, nn.Flatten) for m in between):
        raise PruneError(f"between {mods[prod][0]} and {mods[cons][0]} only the activation and Flatten are supported")
    return prod, cons, bool(between)


def prune_dead(model: nn.Sequential, dead: dict[str, np.ndarray]) -> tuple[nn.Sequential, dict[str, int]]:
    """Remove the dead units of every site: rows of the producing Linear/Conv (and bias), the matching
    input columns (Linear) or input channels (Conv) of the consumer. A layer keeps at least one unit.

    Returns the pruned copy and the number of units removed per site.
    """
    if not isinstance(model, nn.Sequential):
        raise PruneError(f"pruning needs an nn.Sequential model, got {type(model).__name__}")
    model = copy.deepcopy(model).cpu()
    mods = list(model.named_children())
    removed: dict[str, int] = {}
    for k, (name, mod) in enumerate(mods):
        if name not in dead:
            continue
        mask = torch.as_tensor(np.asarray(dead[name], dtype=bool))
        keep = (~mask).nonzero().flatten()
        if len(keep) == 0:  # all dead: the layer's output is constant; keep one zero unit, not zero width
            keep = torch.tensor([0])
        removed[name] = len(mask) - len(keep)
        if removed[name] == 0:
            continue
        p, c, flat = _neighbours(mods, k)
        prod, cons = mods[p][1], mods[c][1]
        _slice_out(prod, keep)
        if flat:  # Conv → act → Flatten → Linear: channel j owns columns j·S .. (j+1)·S − 1
            per = cons.in_features // len(mask)
            cols = (keep[:, None] * per + torch.arange(per)[None, :]).flatten()
            _slice_in(cons, cols)
        else:
            _slice_in(cons, keep)
    return model, removed


def _slice_out(layer: nn.Module, keep: torch.Tensor) -> None:
    set_outputs(layer, layer.weight.detach()[keep], None if layer.bias is None else layer.bias.detach()[keep])


def _slice_in(layer: nn.Module, keep: torch.Tensor) -> None:
    try:
        set_inputs(layer, layer.weight.detach()[:, keep])
    except ValueError as exc:
        raise PruneError(f"cannot prune: {exc}") from None


def pruned_spec(spec: dict[str, Any], model: nn.Sequential) -> dict[str, Any]:
    """The checkpoint spec whose widths rebuild the pruned model (MLP hidden; CNN channels and fc width)."""
    m = dict(spec["model"])
    m["width_match"] = "none"  # the widths below are final; matching them again would resize the pruned model
    children = OrderedDict(model.named_children())
    if m["name"] == "mlp":
        m["hidden"] = [children[f"fc{i}"].out_features for i in range(len(m["hidden"]))]
    elif m["name"] == "cnn":
        m["channels"] = [children[f"conv{i}"].out_channels for i in range(len(m["channels"]))]
        m["cnn_hidden"] = children["fc"].out_features
    else:
        raise PruneError(f"no pruned spec for model {m['name']!r}")
    return {**spec, "model": m}


def widths(m: dict[str, Any]) -> dict[str, Any]:
    return {"hidden": m["hidden"]} if m["name"] == "mlp" else {"channels": m["channels"], "cnn_hidden": m["cnn_hidden"]}


@torch.no_grad()
def max_logit_diff(a: nn.Module, b: nn.Module, split: Split, batch_size: int, dtype: torch.dtype) -> tuple[float, float]:
    """Max |logits_a − logits_b| and argmax agreement on a split, both models run in `dtype` on CPU."""
    a, b = copy.deepcopy(a).cpu().to(dtype).eval(), copy.deepcopy(b).cpu().to(dtype).eval()
    diff, agree = 0.0, 0
    for x, _ in batches(split, batch_size):
        x = x.to(dtype) if x.is_floating_point() else x
        la, lb = a(x), b(x)
        diff = max(diff, float((la - lb).abs().max()))
        agree += int((la.argmax(-1) == lb.argmax(-1)).sum())
    return diff, agree / len(split)


# ---------------------------------------------------------------------------------------------
# Stage


def plot_histogram(path, variant: str, relu_apoz: dict[str, np.ndarray], smooth_nonpos: dict[str, np.ndarray] | None, bins: int) -> None:
    names = list(relu_apoz)
    fig = render.figure(3.2 * len(names), 2.8)
    axes = fig.subplots(1, len(names), squeeze=False, sharey=False)
    edges = np.linspace(0, 100, bins + 1)
    for ax, n in zip(axes[0], names):
        ax.hist(100 * relu_apoz[n], bins=edges, color="tab:blue", alpha=0.8, label="APoZ (swapped ReLU)")
        if smooth_nonpos is not None and n in smooth_nonpos:
            ax.hist(100 * smooth_nonpos[n], bins=edges, histtype="step", color="tab:orange", lw=1.5,
                    label="non-positive pre-act. (smooth)")
        ax.set_title(f"{variant} · {n}: {int((relu_apoz[n] == 1).sum())} dead, {int((relu_apoz[n] == 0).sum())} always active",
                     fontsize=8)
        ax.set_xlabel("% of validation activations")
    axes[0][0].set_ylabel("units")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


def provably_stable(relu: nn.Module, info, layers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Units dead / always active over the whole input domain by the tight bounds (and by IBP), added to `layers`
    per layer; the totals, or a note when the bounds cannot be computed (an unbounded domain, an unread module)."""
    from analysis.verification.ops.base import UnsupportedModel
    from analysis.verification.stability import stable_units

    try:
        sites = {r["site"]: r for r in stable_units(relu, info.input_shape, info.input_low, info.input_high)}
    except (UnsupportedModel, ValueError) as e:
        return {"provable_note": f"not computed: {e}"}
    keys = ("dead", "active", "dead_ibp", "active_ibp")
    for name, layer in layers.items():
        r = sites.get(name)
        if r is None:
            continue
        per = r["units"] // layer["units"]  # a conv channel: every position of it
        dead, active = (np.asarray(r[m]).reshape(layer["units"], per).all(1) for m in ("dead_mask", "active_mask"))
        counts = {"dead": int(dead.sum()), "active": int(active.sum())}
        if per == 1:
            counts.update(dead_ibp=r["dead_ibp"], active_ibp=r["active_ibp"])
        layer.update({f"provably_{k}": counts.get(k) for k in keys})
    total = {f"provably_{k}": sum(v.get(f"provably_{k}") or 0 for v in layers.values()) for k in keys}
    return {**total, "provable_method": next(iter(sites.values()))["method"] if sites else None,
            "provable_domain": [info.input_low, info.input_high]}


def unprunable(spec: dict[str, Any]) -> str | None:
    """Why dead units of this model are not pruned (None: they are)."""
    if spec["model"]["name"] not in ("mlp", "cnn"):
        return f"not pruned: model {spec['model']['name']!r}; pruning handles the plain mlp and cnn stacks"
    if spec["activation"] != "relu":
        return f"not pruned: activation {spec['activation']!r}; a linked pair shares its input row, only plain ReLU units are pruned"
    return None