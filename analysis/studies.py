"""Multi-run studies beyond the λ-GELU paper's two tables, tabulated by `pipeline report` from finished runs
(each is a sweep file, run by `pipeline sweep`; nothing here trains):

- the activation zoo of the GELU analysis paper (its Table 1): every registered activation on one model,
  side by side (configs/sweeps/zoo-fmnist.toml). Test loss and accuracy of the selected checkpoint (the sweep
  selects the last epoch, as the paper's curves end) and, for a gate, its accuracy after a direct swap to ReLU.
- which checkpoint ships (`harden.select`, configs/sweeps/select-study.toml): the same training under each rule,
  the shipped (swapped) network's test metric, how often the rule picked a checkpoint below λ_target.
- linked neurons (Riera & Pujol): g at given widths, at √2 × the widths, widened to the linked parameter count,
  linked g, and linked g narrowed to the single parameter count (configs/sweeps/linked-fmnist-mlp.toml); test
  metrics, the swapped network's accuracy and its dead units in the paper's sense (zero on every sample of the
  split the sparsity stage counted on; a linked unit is dead only when both of its outputs are).

A run takes part in the zoo table when it compares several activations that are not gates (the zoo), in the
linked table when it has a linked variant or matched widths.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pipeline import render
from pipeline.rundir import RunDir

from .stats import mean_ci

ZOO = ("elu", "hardshrink", "hardsigmoid", "hardtanh", "hardswish", "leaky_relu", "logsigmoid", "prelu", "relu",
       "relu6", "rrelu", "selu", "celu", "gelu", "sigmoid", "softplus", "softshrink", "softsign", "tanh", "tanhshrink",
       "serf", "mish", "lambda_gelu")

# The GELU analysis paper's Table 1 (CIFAR-10, 20 epochs): test loss, test accuracy in %. For orientation only:
# other data, other widths, other epoch count.
PAPER_TABLE1 = {
    "elu": (0.4232, 86.22), "hardshrink": (1.1266, 60.81), "hardsigmoid": (1.4296, 54.00), "hardtanh": (0.5573, 82.01),
    "hardswish": (0.3921, 88.77), "leaky_relu": (0.4036, 87.93), "logsigmoid": (0.5755, 81.42), "prelu": (0.5552, 86.33),
    "relu": (0.4478, 87.19), "relu6": (0.4145, 88.70), "rrelu": (0.4308, 85.91), "selu": (0.4983, 83.37),
    "celu": (0.4260, 86.21), "sigmoid": (3.2102, 33.90), "softplus": (0.5762, 80.82), "softshrink": (0.5626, 81.93),
    "softsign": (0.6819, 78.33), "tanh": (0.5318, 82.91), "tanhshrink": (0.5776, 80.78), "gelu": (0.3685, 89.52),
}

ARMS = {  # (width_match, linked) -> the study's name for it
    ("none", False): "single", ("sqrt2", False): "√2", ("params", False): "single, params = linked",
    ("none", True): "linked", ("params", True): "linked, params = single",
}


def _run(path: Path) -> dict[str, Any]:
    run = RunDir.open(path)
    return {"path": path, "cfg": run.cfg.to_dict(), "manifest": run.manifest(), "records": run.variants(),
            "swap": run.read_json("swap", "swap.json") or {}, "sparsity": run.read_json("sparsity", "sparsity.json")}


def _harden_metrics(run: dict[str, Any], variant: str) -> dict[str, Any]:
    m = run["manifest"].get("stages", {}).get("harden", {}).get("metrics", {}).get(variant)
    return m if isinstance(m, dict) else {}


def zoo_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        variants, records = run["cfg"]["variants"], run["records"]
        if sum(v in records and records[v].swapped_to is None for v in variants) < 2:
            continue  # not an activation comparison (of two or more activations that are not gates)
        for v in variants:
            sw = run["swap"].get(v)
            if sw is None or "test_loss_before" not in sw:
                continue
            gate = records[v].swap_changes
            h = _harden_metrics(run, v)
            out.append({"run": run["path"].name, "activation": v, "loss": sw["test_loss_before"], "accuracy": sw["test_before"],
                        "accuracy_swapped": sw["test_after"] if gate else None, "epoch": h.get("best_epoch"),
                        "lambda_final": (h.get("lambdas") or [None])[0], "paper_cifar10": PAPER_TABLE1.get(v)})
    return out


def _setting(cfg: dict[str, Any]) -> tuple:
    """What makes two runs arms of one comparison: same data, model, training length and seed."""
    return (cfg["data"]["name"], cfg["data"]["subset"], cfg["model"]["name"], cfg["train"]["epochs"], cfg["seed"])


def linked_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    studied = {_setting(r["cfg"]) for r in runs
               if r["cfg"]["model"]["width_match"] != "none" or any(v.startswith("linked_") for v in r["cfg"]["variants"])}
    out = []
    for run in runs:
        cfg = run["cfg"]
        wm = cfg["model"]["width_match"]
        if _setting(cfg) not in studied:  # the "single" arm is a plain run: it joins a study run of the same setting
            continue
        for v in cfg["variants"]:
            sw = run["swap"].get(v)
            if sw is None:
                continue
            linked = v.startswith("linked_")
            sp = (run["sparsity"] or {}).get("variants", {}).get(v, {})
            out.append({"run": run["path"].name, "activation": v.removeprefix("linked_"), "arm": ARMS.get((wm, linked), f"{wm}, linked={linked}"),
                        "params": _harden_metrics(run, v).get("params"), "test_loss": sw.get("test_loss_before"),
                        "test_accuracy": sw["test_before"], "test_accuracy_swapped": sw["test_after"],
                        "dead_units": sp.get("dead_units"), "units": sp.get("units") // (2 if linked else 1) if sp.get("units") else None,
                        "dead_split": (run["sparsity"] or {}).get("split")})
    return out


def select_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per data set, variant and selection rule (with its hold), over seeds: the shipped network's test metric
    (after the swap), the smooth one's, the selected epoch and the fraction of seeds selected below λ_target.
    Only settings trained under two or more rules take part."""
    groups: dict[tuple, list[tuple[dict, str]]] = {}
    for run in runs:
        cfg = run["cfg"]
        rule = cfg["harden"]["select"] + (f" (hold {cfg['harden']['hold']})" if cfg["harden"]["hold"] else "")
        for v in cfg["variants"]:
            if v in run["swap"]:
                key = (cfg["data"]["name"], cfg["model"]["name"], cfg["train"]["epochs"], v)
                groups.setdefault(key, []).append((run, rule))
    out = []
    for (data, model, epochs, v), members in sorted(groups.items()):
        rules = sorted({rule for _, rule in members})
        if len(rules) < 2:
            continue
        for rule in rules:
            sel = [run for run, r in members if r == rule]
            h = [_harden_metrics(run, v) for run in sel]
            hardness = [m.get("selected_hardness") for m in h if m.get("selected_hardness") is not None]
            out.append({"data": data, "model": model, "epochs": epochs, "variant": v, "select": rule, "seeds": len(sel),
                        "test_after": mean_ci(run["swap"][v]["test_after"] for run in sel),
                        "test_before": mean_ci(run["swap"][v]["test_before"] for run in sel),
                        "epoch": mean_ci(float(m.get("best_epoch") or math.nan) for m in h),
                        "not_hardened": (sum(x < 1 - 1e-6 for x in hardness) / len(hardness)) if hardness else None})
    return out


def select_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    pm = lambda m: "—" if m[0] != m[0] else f"{100 * m[0]:.2f}" + ("" if m[2] != m[2] else f" ± {100 * m[2]:.2f}")  # noqa: E731
    cells = [[f"{r['data']}/{r['model']} ({r['epochs']} ep.)", r["variant"], r["select"], str(r["seeds"]), pm(r["test_after"]),
              pm(r["test_before"]), render.fmt(r["epoch"][0], 1),
              "—" if r["not_hardened"] is None else f"{100 * r['not_hardened']:.0f}%"] for r in rows]
    return ["## Which checkpoint ships (harden.select)", "",
            ("The same training under each selection rule (the rule only picks the epoch; best_hardened also holds λ at "
             "λ_target for the last epochs). 'shipped' = the swapped ReLU network's test accuracy; mean ± 95% "
             "t-interval over seeds; 'below λ_target' = seeds whose selected checkpoint was not hardened."), "",
            render.table(["setting", "variant", "harden.select", "seeds", "shipped test acc (%)", "smooth test acc (%)",
                          "selected epoch", "below λ_target"], cells), ""]


def _marks(values: list[float], higher_better: bool) -> dict[int, str]:
    """Best in bold, second best underlined (the zoo paper's convention)."""
    order = sorted(range(len(values)), key=lambda i: -values[i] if higher_better else values[i])
    return {order[0]: "**", **({order[1]: "<u>"} if len(order) > 1 else {})}


def _marked(v: float, mark: str | None, digits: int) -> str:
    s = f"{v:.{digits}f}"
    return f"**{s}**" if mark == "**" else f"<u>{s}</u>" if mark else s


def zoo_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    loss_m = _marks([r["loss"] for r in rows], higher_better=False)
    acc_m = _marks([r["accuracy"] for r in rows], higher_better=True)
    cells = []
    for i, r in enumerate(rows):
        p = r["paper_cifar10"]
        name = r["activation"] + (f" (λ = {r['lambda_final']:.0f})" if r["lambda_final"] else "")
        cells.append([name, _marked(r["loss"], loss_m.get(i), 4), _marked(100 * r["accuracy"], acc_m.get(i), 2),
                      f"{100 * r['accuracy_swapped']:.2f}" if r["accuracy_swapped"] is not None else "no swap",
                      f"{p[0]:.4f}" if p else "–", f"{p[1]:.2f}" if p else "–"])
    return ["## Activation zoo (the GELU analysis paper's Table 1)", "",
            ("Test loss and accuracy of each activation's selected checkpoint, every activation from the same initial "
             "weights; 'swapped' = every gate replaced by ReLU, no retraining. Paper columns: its Table 1 (CIFAR-10, 20 "
             "epochs), for orientation only. **Bold** best, <u>underline</u> second best."), "",
            render.table(["activation", "test loss", "test accuracy (%)", "swapped to ReLU (%)", "paper loss", "paper acc. (%)"],
                         cells), ""]


def linked_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    cells = [[r["activation"], r["arm"], f"{r['params']:,}" if r["params"] else "—", render.fmt(r["test_loss"]),
              f"{100 * r['test_accuracy']:.2f}", f"{100 * r['test_accuracy_swapped']:.2f}",
              f"{r['dead_units']}/{r['units']}" if r["dead_units"] is not None else "—"]
             for r in sorted(rows, key=lambda r: (r["activation"], list(ARMS.values()).index(r["arm"]) if r["arm"] in ARMS.values() else 9))]
    split = next((r["dead_split"] for r in rows if r["dead_split"]), "val")
    return ["## Linked neurons: single vs √2 vs linked", "",
            (f"Test metrics of the selected checkpoint; 'swapped' = gates replaced by ReLU (CReLU for a linked pair). "
             f"Dead units counted on the {split} split on the swapped network: zero on every sample; a linked unit is "
             "dead only when both of its outputs are."), "",
            render.table(["activation", "arm", "params", "test loss", "test acc (%)", "test acc swapped (%)", "dead units"],
                         cells), ""]


def sections(paths: list[Path]) -> tuple[list[str], dict[str, Any]]:
    """Markdown lines and the numbers of every study found among these run directories."""
    runs = [_run(p) for p in paths if (p / "config.json").is_file()]
    zoo, linked, select = zoo_rows(runs), linked_rows(runs), select_rows(runs)
    return (select_markdown(select) + zoo_markdown(zoo) + linked_markdown(linked),
            {"select": select, "zoo": zoo, "linked": linked})
