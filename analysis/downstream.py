"""The downstream record of a run's shipped networks: what hardening buys after the swap, per variant, in one place.

- int8 (the int8 stage's `quantize/quantize.json`, the ReLU form): the test accuracy drop in points, argmax agreement
  with fp32 on test, the logits' SQNR;
- sparsity (`sparsity/sparsity.json`): mean APoZ, the units dead on the counted split, the share pruned losslessly,
  parameters before and after; the pruned ONNX model's size and latency beside the unpruned one, timed side by side
  in onnxruntime by the downstream stage;
- verification per ε (the verify stage's `verify/details.csv`, its first verifier): the certified and falsified
  fractions and the median seconds per decided property, of the float ReLU network and of its int8 model; beside them
  the unstable ReLUs after one CROWN pass (`analysis.robustness.unstable`), measured by the downstream stage;
- certified radius per sample (`analysis.robustness.radius`), measured by the downstream stage, and certified
  accuracy as a curve of ε.

Every value read here comes from the stage that measured it; nothing a stage recorded is measured again.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

INT8_FORM = "relu"  # the shipped network's int8 model is its swapped ReLU form's


def int8_columns(quantize: dict[str, Any] | None, variant: str) -> dict[str, Any] | None:
    """The int8 stage's numbers of the variant's shipped (ReLU) form, None when it has none."""
    m = ((quantize or {}).get("models") or {}).get(variant, {}).get(INT8_FORM)
    if not m:
        return None
    metric = quantize.get("metric", "accuracy")
    return {"metric": metric, "fp32_test": m["fp32"][f"test_{metric}"], "int8_test": m["int8"][f"test_{metric}"],
            "test_drop_pt": m.get("test_drop_pt"), "test_argmax_agreement": m["test_argmax_agreement"],
            "output_sqnr_db": m.get("output_sqnr_db"), "size_ratio": m.get("size_ratio")}


def sparsity_columns(sparsity: dict[str, Any] | None, variant: str) -> dict[str, Any] | None:
    """The sparsity stage's numbers of the variant's swapped network, None when it has none."""
    e = ((sparsity or {}).get("variants") or {}).get(variant)
    if not e or "units" not in e:  # a variant without ReLU layers has only the stage's note
        return None
    pr = e.get("pruning") or {}
    removed = pr.get("removed_total")
    return {"split": sparsity.get("split"), "units": e["units"], "apoz_mean": e["apoz_mean"], "dead": e["dead"],
            "always_active": e["always_active"], "provably_dead": e.get("provably_dead"),
            "pruned_fraction": removed / e["units"] if removed is not None and e["units"] else None,
            "params_before": pr.get("params_before"), "params_after": pr.get("params_after"),
            "pruned_onnx": pr.get("onnx"), "not_pruned": pr.get("note")}


def read_details(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def unposed(details: Sequence[dict[str, str]]) -> dict[str, int]:
    """Per verified model (variant or int8 model name), how many properties were never posed: open with reason
    "budget", no bound pass finished in the stage budget's time. Its certified and falsified shares then count them as
    neither, so they measure in which order the stage verified the networks, not the network."""
    out: dict[str, int] = {}
    for r in details:
        if r.get("reason") == "budget":
            out[r["variant"]] = out.get(r["variant"], 0) + 1
    return out


def verify_columns(details: Sequence[dict[str, str]], model: str, verifier: str) -> list[dict[str, Any]]:
    """Per ε (ascending) of one verified model (`model`: a variant, or its int8 model's name), from the verify stage's
    details.csv rows of `verifier`: properties, certified / falsified fractions (a misclassified sample counts as
    falsified, as the stage counts it) and the median seconds over the properties a verifier decided (sat or unsat,
    misclassified samples left out)."""
    rows = [r for r in details if r["variant"] == model and r["verifier"] == verifier]
    out = []
    for eps in sorted({float(r["eps"]) for r in rows}):
        sel = [r for r in rows if float(r["eps"]) == eps]
        decided = [float(r["seconds"]) for r in sel if r["result"] in ("sat", "unsat") and r["stage"] != "clean"]
        out.append({"eps": eps, "properties": len(sel),
                    "certified": sum(r["result"] == "unsat" for r in sel) / len(sel),
                    "falsified": sum(r["result"] == "sat" for r in sel) / len(sel),
                    "decided": sum(r["result"] in ("sat", "unsat") for r in sel) / len(sel),
                    "median_decided_seconds": statistics.median(decided) if decided else None})
    return out


def unstable_columns(sweep: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`analysis.robustness.unstable.unstable_sweep`'s result as the record keeps it: per ε the mean and median count
    over samples, and per layer the unstable / stable active / stable dead shares."""
    return [{"eps": s["eps"], "samples": s["samples"], "relus": s["relus"],
             "unstable_mean": statistics.fmean(s["unstable"]) if s["unstable"] else None,
             "unstable_median": statistics.median(s["unstable"]) if s["unstable"] else None,
             "unstable_ibp_mean": statistics.fmean(s["unstable_ibp"]) if s["unstable_ibp"] else None,
             "layers": s["layers"]} for s in sweep]


def radius_columns(brackets: Sequence[dict[str, Any]], curve: Sequence[dict[str, Any]], eps_max: float,
                   tol: float) -> dict[str, Any]:
    """Per-sample brackets (`radius.record`) and the certified-accuracy curve, with the median of the proved radius
    (a censored one, proved at eps_max, counts as eps_max: a lower bound of the median)."""
    proved = [b["proved"] for b in brackets]
    return {"samples": len(brackets), "eps_max": eps_max, "tol": tol,
            "median_proved": statistics.median(proved) if proved else None,
            "mean_proved": statistics.fmean(proved) if proved else None,
            "censored": sum(b["open"] is None for b in brackets),
            "falsified": sum(b["falsified"] is not None for b in brackets),
            "seconds": round(sum(b["seconds"] for b in brackets), 3), "curve": list(curve), "brackets": list(brackets)}


def compact(record: dict[str, Any]) -> dict[str, Any]:
    """The record without per-sample brackets and per-layer shares: what the manifest keeps."""
    out = {}
    for variant, r in record.items():
        v = dict(r)
        v["radius"] = {k: {kk: vv for kk, vv in rad.items() if kk not in ("brackets", "curve")}
                       for k, rad in (r.get("radius") or {}).items()}
        v["unstable"] = {k: [{kk: vv for kk, vv in u.items() if kk != "layers"} for u in us]
                         for k, us in (r.get("unstable") or {}).items()}
        out[variant] = v
    return out


