"""The sparsity stage: APoZ of the swapped ReLU models, their dead units pruned losslessly and exported (the library:
`analysis/sparsity.py`).

Reads: `swap/<variant>/relu.pt`, `train/<variant>/best.pt` (the smooth model's non-positive pre-activations), each
variant's record. Writes `sparsity/apoz.csv` (one row per unit), `sparsity/sparsity.json` (per-layer summary, pruning
results), and per variant `sparsity/<variant>/apoz_hist.png`, `pruned.pt` and `pruned.onnx`; and the stage's section of
report.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from analysis.sparsity import (PruneError, apoz, max_logit_diff, nonpositive_fraction, plot_histogram, provably_stable,
                               prune_dead, pruned_spec, unit_stats, unprunable, widths)
from pipeline import checkpoint, render
from pipeline.activations import Linked, activation_sites
from pipeline.atomic_io import atomic_write_csv, atomic_write_json
from pipeline.config import Config
from pipeline.data import dataset_for
from pipeline.progress import Progress
from pipeline.rundir import Output, RunDir
from quantize import export as export_mod

OUTPUTS = (Output("sparsity/apoz.csv"), Output("sparsity/sparsity.json"),
           Output("sparsity/<variant>/apoz_hist.png", only="relu"),
           *(Output(f"sparsity/<variant>/{f}", when="sparsity.prune and the model can be pruned", only="relu")
             for f in ("pruned.pt", "pruned.onnx")))


def run_sparsity(cfg: Config, run: RunDir) -> dict[str, Any]:
    scfg = cfg.sparsity
    ds = dataset_for(cfg)
    split = getattr(ds, scfg.split)
    device = run.compute_device()
    bs = cfg.data.eval_batch_size
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    progress = Progress("sparsity", len(cfg.variants), "variant")
    for variant in cfg.variants:
        relu, payload = checkpoint.load_model(run.file("swap", variant, "relu.pt"))
        record = run.variant(variant)
        if record.swapped_to is None:  # not a gate: the swap left it, no ReLU to count
            summary[variant] = {"note": f"no swap ({record.activation} is not a gate): no APoZ", "layers": {}}
            progress.step(line=f"    sparsity {variant}: not a gate, nothing to count")
            continue
        progress.step(0, line=f"    sparsity {variant}: APoZ on {len(split)} {scfg.split} samples")
        relu_apoz = apoz(unit_stats(relu, split, bs, device))
        smooth_nonpos = None
        if record.smooth:
            smooth, _ = checkpoint.load_model(run.file("train", variant, "best.pt"))
            smooth_nonpos = nonpositive_fraction(unit_stats(smooth, split, bs, device))
        linked_sites = {n for n, m in activation_sites(relu) if isinstance(m, Linked)}
        layers = {}
        for layer, a in relu_apoz.items():
            dead, alive = a == 1.0, a == 0.0
            for u, v in enumerate(a):
                rows.append({"variant": variant, "layer": layer, "unit": u, "apoz": float(v), "dead": bool(dead[u]),
                             "always_active": bool(alive[u]),
                             "nonpos_smooth": "" if smooth_nonpos is None else float(smooth_nonpos[layer][u])})
            layers[layer] = {"units": len(a), "apoz_mean": float(a.mean()), "apoz_median": float(np.median(a)),
                             "apoz_min": float(a.min()), "apoz_max": float(a.max()),
                             "dead": int(dead.sum()), "always_active": int(alive.sum()),
                             # a linked unit (g(z), g(−z)) is dead only when both of its outputs are (Riera & Pujol)
                             **({"dead_pairs": int((dead[:len(a) // 2] & dead[len(a) // 2:]).sum())} if layer in linked_sites else {}),
                             **({"nonpos_smooth_mean": float(smooth_nonpos[layer].mean())} if smooth_nonpos is not None else {})}
        progress.step(0, line=f"    sparsity {variant}: provably dead / always active units (CROWN/α-CROWN over the input range)")
        provable = provably_stable(relu, ds.info, layers)
        units = sum(v["units"] for v in layers.values())
        entry: dict[str, Any] = {
            "layers": layers, "units": units, "dead": sum(v["dead"] for v in layers.values()),
            "always_active": sum(v["always_active"] for v in layers.values()),
            "apoz_mean": float(np.concatenate(list(relu_apoz.values())).mean()),
            "dead_units": sum(v.get("dead_pairs", v["dead"]) for v in layers.values()),  # pairs counted once
            **provable,
        }
        plot_histogram(run.file("sparsity", variant, "apoz_hist.png"), variant, relu_apoz, smooth_nonpos, scfg.bins)
        if scfg.prune:
            why_not = unprunable(payload["spec"]) or (
                "not pruned: sparsity.split=test (pruning is checked lossless on the validation split it counts on)"
                if scfg.split != "val" else None)
            if not why_not:
                progress.step(0, line=f"    sparsity {variant}: pruning {entry['dead']} dead units, checking and exporting")
            entry["pruning"] = ({"note": why_not} if why_not else
                                _prune_variant(cfg, run, ds, variant, relu, payload, relu_apoz))
        summary[variant] = entry
        progress.step(line=f"    sparsity {variant}: done ({entry['dead']} dead of {entry['units']} units)")
    progress.close()
    atomic_write_csv(run.file("sparsity", "apoz.csv"), rows,
                     ["variant", "layer", "unit", "apoz", "dead", "always_active", "nonpos_smooth"])
    result = {"split": scfg.split, "samples": len(split), "variants": summary}
    atomic_write_json(run.file("sparsity", "sparsity.json"), result)
    return result


def _prune_variant(cfg: Config, run: RunDir, ds, variant: str, relu: nn.Sequential, payload: dict[str, Any],
                   relu_apoz: dict[str, np.ndarray]) -> dict[str, Any]:
    scfg = cfg.sparsity
    bs = cfg.data.eval_batch_size
    pruned, removed = prune_dead(relu, {n: a == 1.0 for n, a in relu_apoz.items()})
    val64, agree_val = max_logit_diff(relu, pruned, ds.val, bs, torch.float64)
    if not val64 <= scfg.atol:
        raise PruneError(f"{variant}: pruning dead units changed validation logits by {val64:.3g} > sparsity.atol={scfg.atol:g}")
    val32, _ = max_logit_diff(relu, pruned, ds.val, bs, torch.float32)
    test64, agree_test = max_logit_diff(relu, pruned, ds.test, bs, torch.float64)
    spec = pruned_spec(payload["spec"], pruned)
    checkpoint.save(run.file("sparsity", variant, "pruned.pt"), pruned, spec,
                    source=f"swap/{variant}/relu.pt", removed=removed)  # relative: identical runs, identical bytes
    rebuilt, _ = checkpoint.load_model(run.file("sparsity", variant, "pruned.pt"))  # the spec really rebuilds it
    xval = ds.val.x[:cfg.export.check_samples]
    onnx_path = run.file("sparsity", variant, "pruned.onnx")
    check = export_mod.write_checked(rebuilt, xval[:2], onnx_path, xval,
                                     **export_mod.settings(cfg.export, cfg.quantize.threads),
                                     metadata=export_mod.metadata_for({"spec": spec}, variant, "relu_pruned", ds.info)).check
    params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    return {"removed": removed, "removed_total": sum(removed.values()), "params_before": params(relu),
            "params_after": params(pruned), "widths_after": widths(spec["model"]),
            "val_max_logit_diff_fp64": val64, "val_max_logit_diff_fp32": val32, "val_argmax_agreement": agree_val,
            "test_max_logit_diff_fp64": test64, "test_argmax_agreement": agree_test, "atol": scfg.atol,
            "onnx": str(onnx_path.relative_to(run.path)), "onnx_max_abs_diff": check["max_abs_diff"],
            "onnx_bound_ratio": check["ort_bound_ratio"]}


def report_section(cfg: Config, run: RunDir) -> str | None:
    """The sparsity stage's section of report.md: APoZ per variant and what pruning the dead units removed."""
    sp = run.read_json("sparsity", "sparsity.json")
    if sp is None:
        return None
    rows, notes = [], []
    for v, e in sp["variants"].items():
        if not e.get("layers"):
            notes.append(f"`{v}`: {e.get('note', 'no ReLU layers')}.")
            continue
        pr = e.get("pruning") or {}
        provable = "—" if "provably_dead" not in e else \
            f"{e['provably_dead']} / {e['provably_active']} (IBP {e['provably_dead_ibp']} / {e['provably_active_ibp']})"
        rows.append([v, e["units"], e["apoz_mean"], e["dead"], e["always_active"], provable,
                     pr.get("removed_total", pr.get("note", "—")), pr.get("params_before"), pr.get("params_after"),
                     pr.get("test_argmax_agreement")])
    return "\n\n".join([
        "## Sparsity (APoZ of the swapped ReLU models)",
        f"Counted on the {sp['split']} split ({sp['samples']} samples): a dead unit is zero on every one of them, so pruning "
        "it is lossless on that split only (the test-set agreement is measured, not assumed). Provably dead / always "
        "active: for every input in the data's valid range, by CROWN/α-CROWN bounds (IBP in brackets); pruning those is "
        "lossless everywhere.",
        render.table(["variant", "units", "mean APoZ", "dead (validation)", "always active (validation)",
                      "provably dead / always active", "pruned units", "params before", "params after",
                      "argmax agreement after pruning (test)"], rows),
        *notes,
        "APoZ per unit, layer by layer (the smooth model's non-positive pre-activations beside it):",
        *(f"![APoZ histogram, {v}](../sparsity/{v}/apoz_hist.png)" for v, e in sp["variants"].items() if e.get("layers")),
    ])
