"""The λ-GELU paper's Section IV, regenerated from run directories (`pipeline report`).

- Table I: per benchmark and activation (GELU, ReLU, λ-GELU per s-init mode), the best validation
  score (BVS, mean ± std over seeds), the epoch it was reached, the network-mean λ at the last
  epoch and the drift V_λ, from runs where λ is learned all along (no annealing).
- Table II: the metric of the selected checkpoint before and after the ReLU swap, on the validation split
  (used for selection) and on the test split (held out), mean ± 95% t-interval over seeds, for: the GELU
  baseline swapped directly, annealed λ-GELU (Algorithm 1), a ReLU network trained from scratch (no swap),
  and two ablations: annealing with λ not learned (gate.lr_mult = 0) and GELU swapped to ReLU at e_s then
  fine-tuned as ReLU for the remaining epochs (harden.method = swap). Paired comparisons (same seeds) of the
  shipped networks' test metric, and a plain statement of what the intervals support.
- Figure 1 (and 2): over a (t, c) grid, colour = Δλ(t, c), the cell mean of V_λ over seeds and
  init modes; annotation = ΔBVS(t, c) = mean BVS of λ-GELU − mean BVS of GELU.
- Figure 3: validation curves (mean ± std over seeds) and the Spearman correlation ρ_S(e) of the
  layerwise λ profiles between init modes, averaged over seeds.
- The side-by-side with the paper's own numbers (PAPER_TABLE1, PAPER_TABLE2 below).

A run contributes one record per variant. Which table a record feeds follows from its config: λ
runs whose switch epoch is T (train.switch_fraction = 1) are "learned" (Table I, Figures 1 and 3),
the others "annealed" (Table II); baselines feed both. Runs that have not finished every epoch are
listed and left out. Everything is computed from `config.json`, `manifest.json` (the selected checkpoint's
hardness), `train/metrics.csv` and `swap/swap.json`, so it works on runs from any machine, and on the run
directories of several sweep shards together.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import render
from pipeline.activations import RELU_FORMS
from pipeline.errors import PipelineError
from pipeline.evaluate import METRICS
from pipeline.hardness import switch_epoch
from pipeline.rundir import atomic_write_text

from . import hardness, studies
from .stats import CONFIDENCE
from .stats import mean_ci as _stats

# (data.name, model.name) -> how the paper and this report name the benchmark
LABELS = {
    ("adult", "mlp"): "MLP/Adult",
    ("fashion_mnist", "mlp"): "MLP/Fashion-MNIST",
    ("fashion_mnist", "cnn"): "CNN/Fashion-MNIST",
    ("cifar10", "resnet18_cifar"): "ResNet-18/CIFAR-10",
    ("cifar100", "resnet18_cifar"): "ResNet-18/CIFAR-100",
    ("tinyimagenet", "deit_tiny"): "DeiT-Tiny/TinyImageNet",
    ("wikitext2", "gpt"): "GPT/WikiText-2",
    ("shakespeare", "gpt"): "char-GPT/Shakespeare",
    ("digits", "mlp"): "MLP/digits",
    ("breast_cancer", "mlp"): "MLP/breast_cancer",
    ("wine", "mlp"): "MLP/wine",
}
# Our benchmark -> the paper's dataset row it reproduces (or stands in for).
PAPER_ROW = {
    "MLP/Adult": "Adult",
    "MLP/Fashion-MNIST": "FMNIST",
    "ResNet-18/CIFAR-10": "CIFAR10",
    "ResNet-18/CIFAR-100": "CIFAR100",
    "DeiT-Tiny/TinyImageNet": "TinyImageNet",
    "GPT/WikiText-2": "WikiText-2",
    "char-GPT/Shakespeare": "WikiText-2",  # stand-in: character level, not GPT-2 BPE; ppl not comparable
}
MODES = {"uniform": "uni", "increasing": "inc", "decreasing": "dec"}

# The paper's Table I: (BVS mean, BVS std, epoch, λ̄ mean, λ̄ std, Δλ̄ mean, Δλ̄ std); None = "-".
PAPER_TABLE1: dict[str, dict[str, tuple]] = {
    "Adult": {"GELU": (0.85, 4e-4, 41, None, None, None, None), "ReLU": (0.86, 6e-4, 40, None, None, None, None),
              "dec": (0.87, 8e-4, 32, 6.66, 0.13, 8.10, 0.2), "inc": (0.86, 9e-4, 46, 8.67, 0.10, 11.63, 0.49),
              "uni": (0.86, 1e-3, 46, 2.45, 0.07, 3.23, 0.49)},
    "FMNIST": {"GELU": (0.86, 2e-3, 49, None, None, None, None), "ReLU": (0.86, 1e-3, 48, None, None, None, None),
               "dec": (0.87, 3e-3, 49, 3.40, 3e-2, 6.34, 0.17), "inc": (0.87, 2e-3, 50, 3.41, 3e-2, 6.85, 0.14),
               "uni": (0.87, 8e-4, 48, 3.09, 2e-2, 6.48, 0.17)},
    "CIFAR10": {"GELU": (0.95, 1e-3, 72, None, None, None, None), "ReLU": (0.95, 1e-3, 70, None, None, None, None),
                "dec": (0.95, 2e-3, 75, 2.43, 6e-2, 4.55, 0.15), "inc": (0.95, 4e-4, 70, 1.68, 0.39, 3.51, 0.76),
                "uni": (0.95, 6e-4, 75, 1.75, 0.51, 3.22, 0.61)},
    "CIFAR100": {"GELU": (0.74, 5e-3, 74, None, None, None, None), "ReLU": (0.73, 3e-3, 72, None, None, None, None),
                 "dec": (0.74, 3e-3, 64, 2.64, 9e-2, 4.23, 0.13), "inc": (0.74, 3e-3, 69, 1.65, 0.48, 3.18, 0.77),
                 "uni": (0.74, 3e-3, 71, 1.89, 0.39, 3.39, 0.60)},
    "TinyImageNet": {"GELU": (0.72, 1e-3, 90, None, None, None, None), "ReLU": (0.71, 8e-4, 85, None, None, None, None),
                     "dec": (0.72, 2e-3, 90, 1.21, 1e-3, 1.39, 2e-2), "inc": (0.72, 2e-3, 87, 1.21, 1e-3, 1.43, 4e-2),
                     "uni": (0.72, 1e-4, 90, 1.19, 2e-4, 1.36, 3e-2)},
    "WikiText-2": {"GELU": (28.46, 2e-2, 7, None, None, None, None), "ReLU": (30.48, 4e-2, 9, None, None, None, None),
                   "dec": (28.59, 9e-3, 7, 1.24, 6e-5, 0.28, 2e-4), "inc": (28.71, 2e-2, 7, 1.24, 1e-4, 0.29, 2e-5),
                   "uni": (28.45, 2e-2, 7, 1.00, 8e-6, 2e-3, 1e-5)},
}
# The paper's Table II: (original, substituted), mean over 3 seeds. WikiText-2 was left out there
# ("activation substitution remains unstable under our protocol").
PAPER_TABLE2: dict[str, dict[str, tuple[float, float]]] = {
    "Adult": {"GELU": (0.85, 0.80), "λ-GELU": (0.81, 0.81)},
    "FMNIST": {"GELU": (0.86, 0.83), "λ-GELU": (0.86, 0.85)},
    "CIFAR10": {"GELU": (0.95, 0.92), "λ-GELU": (0.95, 0.95)},
    "CIFAR100": {"GELU": (0.74, 0.67), "λ-GELU": (0.74, 0.72)},
    "TinyImageNet": {"GELU": (0.71, 0.68), "λ-GELU": (0.71, 0.72)},
}
PAPER_TC = (0.1, 9.0)  # the (t, c) the paper fixes after Figure 1


# ---------------------------------------------------------------------------------------------
# Records


@dataclass
class Record:
    """One variant of one finished run."""

    run: str
    benchmark: str  # label, with the data subset when there is one
    variant: str
    mode: str  # s-init mode for λ-gates, "-" for baselines
    t: float
    c: float
    seed: int
    epochs: int
    annealed: bool  # λ hardened to λ_target after e_s (Algorithm 1)
    metric: str
    higher_is_better: bool
    val: np.ndarray  # [epochs]
    lambdas: np.ndarray  # [epochs, layers]; [epochs, 0] for baselines
    swap: dict[str, float] | None = None
    method: str = "anneal"  # harden.method: anneal (Algorithm 1) or swap (ReLU at e_s + 1, then fine-tuned)
    select: str = "best_val"  # harden.select
    hardness: float | None = None  # the selected checkpoint's smallest λ / λ_target (train stage); None: no λ
    warning: str | None = None  # the train stage's warning about the selected checkpoint, if any

    @property
    def hardenable(self) -> bool:
        return self.lambdas.shape[1] > 0

    @property
    def best_index(self) -> int:
        """0-based epoch of the BVS (the first one, as the training loop keeps it)."""
        return int(np.argmax(self.val) if self.higher_is_better else np.argmin(self.val))

    @property
    def bvs(self) -> float:
        return float(self.val[self.best_index])

    @property
    def lambda_mean(self) -> float:
        return float(self.lambdas[-1].mean()) if self.hardenable else math.nan

    @property
    def drift(self) -> float:
        return hardness.drift(self.lambdas) if self.hardenable else math.nan


@dataclass
class Collection:
    records: list[Record] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "<run>: why"


def _benchmark(cfg: dict[str, Any]) -> str:
    data, model = cfg["data"]["name"], cfg["model"]["name"]
    label = LABELS.get((data, model), f"{model}/{data}")
    return label + (f" (subset {cfg['data']['subset']})" if cfg["data"].get("subset") else "")


def _float(v: str) -> float:
    return float(v) if v not in ("", None) else math.nan


def read_run(path: Path) -> tuple[list[Record], list[str]]:
    cfg = json.loads((path / "config.json").read_text())
    metrics = path / "train" / "metrics.csv"
    if not metrics.is_file():
        return [], [f"{path}: no train/metrics.csv"]
    with open(metrics) as f:
        rows = list(csv.DictReader(f))
    swap = json.loads((path / "swap" / "swap.json").read_text()) if (path / "swap" / "swap.json").is_file() else {}
    manifest = json.loads((path / "manifest.json").read_text()) if (path / "manifest.json").is_file() else {}
    selected = manifest.get("stages", {}).get("harden", {}).get("metrics", {})
    T = int(cfg["train"]["epochs"])
    annealed_run = switch_epoch(T, float(cfg["train"]["switch_fraction"])) < T
    out, skipped = [], []
    for variant in cfg["variants"]:
        vrows = [r for r in rows if r["variant"] == variant]
        if len(vrows) < T:
            skipped.append(f"{path.name}/{variant}: {len(vrows)} of {T} epochs")
            continue
        metric_col = next(k for k in vrows[0] if k.startswith("val_") and k != "val_loss" and not k.endswith("_swapped")
                          and vrows[0][k] != "")
        metric = metric_col[len("val_"):]
        lam_cols = sorted((k for k in vrows[0] if k.startswith("lambda_") and vrows[0][k] != ""), key=lambda k: int(k.split("_")[1]))
        lams = np.array([[_float(r[k]) for k in lam_cols] for r in vrows[:T]], dtype=np.float64).reshape(T, len(lam_cols))
        hardenable = len(lam_cols) > 0
        sel = selected.get(variant) or {}
        entry = swap.get(variant)  # a ReLU baseline too: the swap stage records it with before = after
        out.append(Record(
            run=str(path), benchmark=_benchmark(cfg), variant=variant,
            mode=cfg["gate"]["init"] if hardenable else "-",
            t=float(cfg["gate"]["temperature"]), c=float(cfg["gate"]["lr_mult"]), seed=int(cfg["seed"]), epochs=T,
            annealed=hardenable and annealed_run, metric=metric, higher_is_better=METRICS[metric][1],
            val=np.array([float(r[metric_col]) for r in vrows[:T]]), lambdas=lams, swap=entry,
            method=cfg["harden"].get("method", "anneal"), select=cfg["harden"].get("select", "best_val"),
            hardness=sel.get("selected_hardness"), warning=sel.get("warning")))
    return out, skipped


def run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Every run directory under `paths` (a path may itself be a run directory), once, in a stable order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise PipelineError(f"{p} does not exist; give run directories or folders holding them")
        for cfg_file in sorted([p / "config.json"] if (p / "config.json").is_file() else p.rglob("config.json")):
            run = cfg_file.parent.resolve()
            if run not in out and "superseded" not in run.parts:
                out.append(run)
    return out


def collect(paths: Iterable[str | Path]) -> Collection:
    """The records of every run directory under `paths`."""
    col = Collection()
    for run in run_dirs(paths):
        recs, skipped = read_run(run)
        col.records += recs
        col.skipped += skipped
    return col


def _dedupe_baselines(recs: list[Record]) -> list[Record]:
    """A baseline trained the same way (variant, seed, epochs, harden.method, harden.select) in two runs is one
    sample, not two."""
    out, seen = [], set()
    for r in recs:
        key = (r.variant, r.seed, r.epochs, r.method, r.select) if not r.hardenable else (r.run, r.variant)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _by_benchmark(col: Collection) -> dict[str, list[Record]]:
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in col.records:
        groups[r.benchmark].append(r)
    return {b: _dedupe_baselines(rs) for b, rs in groups.items()}


def _learned_tc(recs: list[Record]) -> list[tuple[float, float]]:
    return sorted({(r.t, r.c) for r in recs if r.hardenable and not r.annealed})


# ---------------------------------------------------------------------------------------------
# Tables


def table1(col: Collection) -> list[dict[str, Any]]:
    """Rows of Table I: baselines, then λ-GELU per (t, c) and mode (dec, inc, uni as in the paper)."""
    rows = []
    for bench, recs in _by_benchmark(col).items():
        groups: dict[tuple, list[Record]] = defaultdict(list)
        for r in recs:
            if r.method == "swap":  # the fine-tuning ablation: swapped to ReLU mid-training, not a Table I run
                continue
            if not r.hardenable:
                groups[(r.variant.upper() if r.variant != "gelu" else "GELU", "-", None, None)].append(r)
            elif not r.annealed:
                groups[("λ-GELU", MODES.get(r.mode, r.mode), r.t, r.c)].append(r)
        order = {"GELU": 0, "RELU": 1, "λ-GELU": 2}
        for (act, mode, t, c), rs in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 3), kv[0][0], kv[0][2] or 0,
                                                                             kv[0][3] or 0, kv[0][1])):
            bvs = _stats(r.bvs for r in rs)
            rows.append({
                "benchmark": bench, "act": "ReLU" if act == "RELU" else act, "mode": mode, "t": t, "c": c,
                "metric": rs[0].metric, "epochs": rs[0].epochs, "seeds": bvs[3],
                "bvs": bvs, "epoch": _stats(r.best_index + 1 for r in rs)[0],
                # the test split at the selected checkpoint, where the swap stage ran and selection is best_val
                "test": _stats(r.swap.get("test_before", math.nan) if r.swap and r.select == "best_val" else math.nan for r in rs),
                "lambda": _stats(r.lambda_mean for r in rs), "drift": _stats(r.drift for r in rs),
            })
    return rows


# Table II rows: an activation label and a kind; the kind says how the row's network was made. In this order.
ROW_KINDS = (
    ("", "swapped directly after training (no fine-tuning)"),
    (" (annealed)", "annealed to λ_target (Algorithm 1), then swapped"),
    (" (from scratch)", "trained as it ships (no swap)"),
    (" (annealed, λ not learned)", "ablation: annealed with λ not learned (gate.lr_mult = 0), then swapped"),
    (" (swapped at e_s, fine-tuned)", "ablation: swapped to ReLU at e_s, then fine-tuned as ReLU (harden.method = swap)"),
    (" (learned, not annealed)", "λ learned all training, not annealed, then swapped"),
)
ACT_LABELS = {"gelu": "GELU", "lambda_gelu": "λ-GELU", "relu": "ReLU", "silu": "SiLU", "lambda_swish": "λ-Swish",
              "serf": "SERF", "lambda_serf": "λ-SERF", "mish": "Mish", "linked_relu": "CReLU"}
# Paired comparisons of the shipped networks (test metric after the swap, same seeds): (row a, row b).
COMPARISONS = (
    ("λ-GELU (annealed)", "ReLU (from scratch)"),
    ("λ-GELU (annealed)", "GELU"),
    ("λ-GELU (annealed)", "λ-GELU (annealed, λ not learned)"),
    ("λ-GELU (annealed)", "GELU (swapped at e_s, fine-tuned)"),
    ("GELU (swapped at e_s, fine-tuned)", "ReLU (from scratch)"),
)


def _table2_row(r: Record, recs: list[Record]) -> str | None:
    """The Table II row of a record: its activation's label and the kind of row (ROW_KINDS), or None."""
    if r.swap is None:
        return None
    label = ACT_LABELS.get(r.variant, r.variant)
    if r.variant in RELU_FORMS:
        return f"{label} (from scratch)"
    if not r.hardenable:
        return f"{label} (swapped at e_s, fine-tuned)" if r.method == "swap" else label
    if r.annealed and r.method == "anneal":
        return f"{label} (annealed, λ not learned)" if r.c == 0 else f"{label} (annealed)"
    if (not r.annealed and r.mode == "uniform" and _learned_tc(recs)
            and (r.t, r.c) == min(_learned_tc(recs), key=lambda tc: (tc != PAPER_TC, tc))):
        return f"{label} (learned, not annealed)"
    return None


def _row_order(key: str) -> tuple[int, str]:
    kind = max((i for i, (suffix, _) in enumerate(ROW_KINDS) if suffix and key.endswith(suffix)), default=0)
    return kind, key


def _grouped(recs: list[Record]) -> dict[str, list[Record]]:
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in recs:
        key = _table2_row(r, recs)
        if key is not None:
            groups[key].append(r)
    return groups


def table2(col: Collection) -> list[dict[str, Any]]:
    """Rows of Table II: the selected checkpoint's metric before and after the swap, validation and test."""
    rows = []
    for bench, recs in _by_benchmark(col).items():
        groups = _grouped(recs)
        for key in sorted(groups, key=_row_order):
            rs = groups[key]
            sw = [r.swap for r in rs]
            st = {f"{split}_{what}": _stats(f(s) for s in sw) for split in ("val", "test") for what, f in (
                ("original", lambda s, sp=split: s.get(f"{sp}_before", math.nan)),
                ("substituted", lambda s, sp=split: s.get(f"{sp}_after", math.nan)),
                ("change", lambda s, sp=split: s.get(f"{sp}_after", math.nan) - s.get(f"{sp}_before", math.nan)))}
            # hardening is a promise of the annealed rows only (a learned-only λ is never meant to reach λ_target)
            hardened = [r.hardness for r in rs if r.hardness is not None and r.annealed]
            rows.append({"benchmark": bench, "mode": key, "kind": ROW_KINDS[_row_order(key)[0]][1], "metric": rs[0].metric,
                         "seeds": len(rs),
                         "epochs": rs[0].epochs, "select": sorted({r.select for r in rs}), **st,
                         # the validation columns under their old names (side by side with the paper)
                         "original": st["val_original"], "substituted": st["val_substituted"], "change": st["val_change"],
                         "agreement": _stats(s.get("argmax_agreement", math.nan) for s in sw)[0],
                         "not_hardened": sum(1 for r in rs if r.warning and r.annealed), "hardness_min": min(hardened) if hardened else None,
                         "warnings": [f"{bench}, {Path(r.run).name}: {r.warning}" for r in rs if r.warning and r.annealed]})
    return rows


def comparisons(col: Collection) -> list[dict[str, Any]]:
    """Paired differences (a − b) of the shipped networks' test metric after the swap, over the seeds both rows
    ran, with a 95% t-interval, and what the interval says."""
    out = []
    for bench, recs in _by_benchmark(col).items():
        groups = {k: {r.seed: r for r in rs} for k, rs in _grouped(recs).items()}
        for a, b in COMPARISONS:
            if a not in groups or b not in groups:
                continue
            seeds = sorted(set(groups[a]) & set(groups[b]))
            diffs = [groups[a][k].swap.get("test_after", math.nan) - groups[b][k].swap.get("test_after", math.nan) for k in seeds]
            mean, sd, half, n = _stats(diffs)
            higher = METRICS[groups[a][seeds[0]].metric][1] if seeds else True
            outcome = "none" if n < 2 else "no difference" if abs(mean) <= half else \
                "better" if (mean > 0) == higher else "worse"
            if n == 0:
                verdict = "no paired test scores recorded"
            elif n < 2:
                verdict = "too few paired seeds for an interval"
            elif outcome == "no difference":
                verdict = f"no difference detected with {n} seeds (the interval contains 0; it does not show equality)"
            else:
                verdict = f"{a} is {outcome} (the interval excludes 0)"
            out.append({"benchmark": bench, "a": a, "b": b, "metric": groups[a][seeds[0]].metric if seeds else "",
                        "seeds": n, "difference": (mean, sd, half, n), "outcome": outcome, "verdict": verdict})
    return out


def tc_grid(recs: list[Record]) -> dict[str, Any] | None:
    """Figure 1's numbers for one benchmark: Δλ(t, c) and ΔBVS(t, c); None without ≥ 2 cells."""
    cells = _learned_tc(recs)
    if len(cells) < 2:
        return None
    ts, cs = sorted({t for t, _ in cells}), sorted({c for _, c in cells})
    drift = np.full((len(ts), len(cs)), np.nan)
    bvs = np.full_like(drift, np.nan)
    n = np.zeros_like(drift, dtype=int)
    for i, t in enumerate(ts):
        for j, c in enumerate(cs):
            rs = [r for r in recs if r.hardenable and not r.annealed and (r.t, r.c) == (t, c)]
            if rs:
                drift[i, j] = np.mean([r.drift for r in rs])
                bvs[i, j] = np.mean([r.bvs for r in rs])
                n[i, j] = len(rs)
    gelu = [r.bvs for r in recs if r.variant == "gelu"]
    gelu_bvs = float(np.mean(gelu)) if gelu else math.nan
    return {"t": ts, "c": cs, "drift": drift, "bvs": bvs, "delta_bvs": bvs - gelu_bvs, "gelu_bvs": gelu_bvs,
            "gelu_seeds": len(gelu), "runs": n, "metric": recs[0].metric}


def spearman_curves(recs: list[Record], tc: tuple[float, float]) -> dict[str, dict[str, np.ndarray]]:
    """ρ_S(e; m1, m2) averaged over the seeds that ran both modes: {pair: {mean, std, n}}."""
    by_mode: dict[str, dict[int, Record]] = defaultdict(dict)
    for r in recs:
        if r.hardenable and not r.annealed and (r.t, r.c) == tc:
            by_mode[r.mode][r.seed] = r
    out = {}
    modes = [m for m in ("uniform", "increasing", "decreasing") if m in by_mode] + sorted(set(by_mode) - set(MODES))
    for i, m1 in enumerate(modes):
        for m2 in modes[i + 1:]:
            seeds = sorted(set(by_mode[m1]) & set(by_mode[m2]))
            if not seeds:
                continue
            rho = np.array([[s["rho"] for s in hardness.spearman_over_epochs(by_mode[m1][k].lambdas, by_mode[m2][k].lambdas)]
                            for k in seeds])
            with np.errstate(all="ignore"):
                out[f"{MODES.get(m1, m1)}–{MODES.get(m2, m2)}"] = {
                    "mean": np.nanmean(rho, axis=0) if np.isfinite(rho).any() else np.full(rho.shape[1], np.nan),
                    "std": np.nanstd(rho, axis=0) if np.isfinite(rho).any() else np.full(rho.shape[1], np.nan),
                    "n": len(seeds)}
    return out


# ---------------------------------------------------------------------------------------------
# Formatting


def _num(v: float | None, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.1e}"
    return f"{v:.{digits}f}"


def _pm(ms: tuple[float, ...] | None, digits: int = 4) -> str:
    """mean ± the 95% t-interval's half-width (mean alone for one seed)."""
    if ms is None or math.isnan(ms[0]):
        return "-"
    return _num(ms[0], digits) if math.isnan(ms[2]) else f"{_num(ms[0], digits)} ± {ms[2]:.1e}"


def _digits(metric: str) -> int:
    return 2 if metric == "perplexity" else 4


TABLE1_HEADER = ["Benchmark", "T", "Act.", "Mode", "t", "c", "BVS (val)", "test at BVS", "Ep.", "λ̄ (last epoch)", "Δλ̄ (V_λ)",
                 "seeds"]


def table1_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        d = _digits(r["metric"])
        out.append([f"{r['benchmark']} ({r['metric']})", str(r["epochs"]), r["act"], r["mode"],
                    _num(r["t"], 2) if r["t"] is not None else "-", _num(r["c"], 0) if r["c"] is not None else "-",
                    _pm(r["bvs"], d), _pm(r.get("test"), d), f"{r['epoch']:.1f}", _pm(r["lambda"], 2), _pm(r["drift"], 2),
                    str(r["seeds"])])
    return out


TABLE2_HEADER = ["Benchmark", "T", "Row", "val original", "val swapped", "Δ val", "test original", "test swapped", "Δ test",
                 "argmax agr. (val)", "not hardened", "seeds"]


def table2_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        d = _digits(r["metric"])
        out.append([f"{r['benchmark']} ({r['metric']})", str(r["epochs"]), r["mode"],
                    *(_pm(r[f"{sp}_{w}"], d) for sp in ("val", "test") for w in ("original", "substituted", "change")),
                    _num(r["agreement"], 4), f"{r['not_hardened']}/{r['seeds']}" if r["hardness_min"] is not None else "-",
                    str(r["seeds"])])
    return out


COMPARISON_HEADER = ["Benchmark", "A", "B", "A − B (test, after the swap)", "paired seeds", "what the interval says"]


def comparison_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[f"{r['benchmark']} ({r['metric']})", r["a"], r["b"], _pm(r["difference"], _digits(r["metric"])), str(r["seeds"]),
             r["verdict"]] for r in rows]


def support_lines(t2: list[dict[str, Any]], comp: list[dict[str, Any]]) -> list[str]:
    """What the numbers support and what they do not, in words, from the intervals (regenerated with them)."""
    lines = []
    for bench in dict.fromkeys(r["benchmark"] for r in t2):
        rows = {r["mode"]: r for r in t2 if r["benchmark"] == bench}
        parts = []
        for key in ("GELU", "λ-GELU (annealed)"):
            r = rows.get(key)
            if r is None:
                continue
            m, _, h, n = r["test_change"]
            what = ("too few seeds for an interval" if n < 2 else "no change detected" if abs(m) <= h
                    else "a change (the interval excludes 0)")
            parts.append(f"the swap of {key} changes test {r['metric']} by {_pm(r['test_change'], _digits(r['metric']))} "
                         f"over {n} seeds: {what}")
            if r["not_hardened"]:
                parts.append(f"{r['not_hardened']} of {r['seeds']} {key} checkpoints were selected before λ reached λ_target")
        mine = [c for c in comp if c["benchmark"] == bench]
        for c in mine:
            if c["outcome"] in ("better", "worse"):
                parts.append(f"the shipped {c['a']} is {c['outcome']} than {c['b']} on test "
                             f"({_pm(c['difference'], _digits(c['metric']))}, the interval excludes 0)")
        same = [c for c in mine if c["outcome"] == "no difference"]
        if same:
            seeds = "/".join(str(n) for n in sorted({c["seeds"] for c in same}))
            parts.append(f"no test difference detected with {seeds} seeds (which does not show equality) for "
                         + ", ".join(f"{c['a']} vs {c['b']}" for c in same))
        if parts:
            lines.append(f"- **{bench}**: " + "; ".join(parts) + ".")
    if lines:
        lines += ["", ("What these numbers do not support: equality where an interval contains 0 (a wider seed count could "
                  "still separate the rows); any claim about the validation columns as performance (the validation split "
                  "chose the checkpoint, so they are optimistic: read the test columns); any claim beyond these data sets, "
                  "models, epoch counts and selection rule (`harden.select` is listed per row in numbers.json).")]
    return lines


def paper_row(benchmark: str) -> str | None:
    """The paper's dataset row for one of our benchmarks (a data subset still maps to it)."""
    return PAPER_ROW.get(benchmark.split(" (subset")[0])


def side_by_side(t1: list[dict[str, Any]], t2: list[dict[str, Any]]) -> tuple[list[list[str]], list[list[str]]]:
    """Our numbers next to the paper's, for the benchmarks that map to a paper row."""
    s1 = []
    for r in t1:
        paper = PAPER_TABLE1.get(paper_row(r["benchmark"]) or "", {})
        key = r["act"] if r["act"] in ("GELU", "ReLU") else r["mode"]
        if not paper or key not in paper or (r["t"] is not None and (r["t"], r["c"]) != PAPER_TC):
            continue
        p = paper[key]
        d = _digits(r["metric"])
        s1.append([r["benchmark"], paper_row(r["benchmark"]), r["act"] + ("" if r["mode"] == "-" else f" {r['mode']}"),
                   _num(r["bvs"][0], d), _num(p[0], 2), f"{r['epoch']:.0f}/{r['epochs']}", str(p[2]),
                   _num(r["lambda"][0], 2), _num(p[3], 2), _num(r["drift"][0], 2), _num(p[5], 2)])
    s2 = []
    for r in t2:
        paper = PAPER_TABLE2.get(paper_row(r["benchmark"]) or "", {})
        key = "GELU" if r["mode"] == "GELU" else "λ-GELU" if r["mode"] == "λ-GELU (annealed)" else None
        d = _digits(r["metric"])
        p = paper.get(key) if key else None
        if key is None or paper_row(r["benchmark"]) is None:
            continue
        s2.append([r["benchmark"], paper_row(r["benchmark"]), r["mode"], _num(r["original"][0], d),
                   _num(r["substituted"][0], d), _num(r["change"][0], d),
                   _num(p[0], 2) if p else "not reported", _num(p[1], 2) if p else "not reported",
                   _num(p[1] - p[0], 2) if p else "-"])
    return s1, s2


# ---------------------------------------------------------------------------------------------
# Figures


def plot_table(header: list[str], cells: list[list[str]], path: Path, title: str) -> Path:
    chars = sum(max(len(str(r[j])) for r in [header, *cells]) for j in range(len(header)))
    fig = render.figure(min(0.5 + 0.075 * chars, 30), 0.6 + 0.25 * (len(cells) + 1))
    ax = fig.add_subplot(1, 1, 1)
    ax.axis("off")
    tab = ax.table(cellText=cells or [["-"] * len(header)], colLabels=header, loc="center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(7)
    tab.auto_set_column_width(list(range(len(header))))
    ax.set_title(title, fontsize=9)
    return render.save(fig, path, tight=True)


def plot_tc_heatmap(grid: dict[str, Any], path: Path, title: str) -> Path:
    fig = render.figure(1.6 + 1.2 * len(grid["c"]), 1.4 + 0.9 * len(grid["t"]))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(grid["drift"], cmap="viridis", aspect="auto")
    cb = fig.colorbar(im, ax=ax)
    cb.set_label("Δλ (mean drift V_λ)")
    ax.set_xticks(range(len(grid["c"])), [f"{c:g}" for c in grid["c"]])
    ax.set_yticks(range(len(grid["t"])), [f"{t:g}" for t in grid["t"]])
    ax.set_xlabel("c (η_s = c·η_w)")
    ax.set_ylabel("t (temperature)")
    lo, hi = np.nanmin(grid["drift"]), np.nanmax(grid["drift"])
    for i in range(len(grid["t"])):
        for j in range(len(grid["c"])):
            v = grid["delta_bvs"][i, j] if not math.isnan(grid["gelu_bvs"]) else grid["bvs"][i, j]
            if math.isnan(v):
                continue
            dark = (grid["drift"][i, j] - lo) < 0.5 * (hi - lo) if hi > lo else True
            ax.text(j, i, f"{v:+.4f}" if not math.isnan(grid["gelu_bvs"]) else f"{v:.4f}", ha="center", va="center",
                    fontsize=8, color="white" if dark else "black")
    ax.set_title(title, fontsize=9)
    return render.save(fig, path)


def plot_figure3(recs: list[Record], tc: tuple[float, float], path: Path, title: str) -> Path:
    fig = render.figure(11, 4)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    curves: dict[str, list[Record]] = defaultdict(list)
    for r in recs:
        if not r.hardenable:
            curves["ReLU" if r.variant == "relu" else r.variant.upper() if r.variant != "gelu" else "GELU"].append(r)
        elif not r.annealed and (r.t, r.c) == tc:
            curves[f"λ-GELU {MODES.get(r.mode, r.mode)}"].append(r)
    for i, (name, rs) in enumerate(sorted(curves.items())):
        n = min(len(r.val) for r in rs)
        v = np.array([r.val[:n] for r in rs])
        e = np.arange(1, n + 1)
        color = f"C{i}"
        left.plot(e, v.mean(0), color=color, label=f"{name} (n={len(rs)})")
        if len(rs) > 1:
            left.fill_between(e, v.mean(0) - v.std(0), v.mean(0) + v.std(0), color=color, alpha=0.2)
        left.axvline(np.mean([r.best_index + 1 for r in rs]), color=color, ls="--", lw=0.8)
    left.set_xlabel("epoch")
    left.set_ylabel(f"validation {recs[0].metric}")
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    curves = spearman_curves(recs, tc)
    for i, (pair, s) in enumerate(curves.items()):
        e = np.arange(1, len(s["mean"]) + 1)
        right.plot(e, s["mean"], color=f"C{i}", label=f"{pair} (n={s['n']})")
        right.fill_between(e, s["mean"] - s["std"], s["mean"] + s["std"], color=f"C{i}", alpha=0.2)
    right.set_xlabel("epoch")
    right.set_ylabel("Spearman ρ_S of layerwise λ")
    right.set_ylim(-1.05, 1.05)
    right.grid(alpha=0.3)
    if curves:
        right.legend(fontsize=7)
    else:  # ρ_S compares init modes: a sweep that ran one mode has none to compare
        right.text(0.5, 0.5, "one init mode ran:\nno ρ_S to compare", ha="center", va="center", transform=right.transAxes)
    fig.suptitle(title, fontsize=9)
    return render.save(fig, path)


# ---------------------------------------------------------------------------------------------
# The report


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text).strip("-").lower().replace("--", "-")


def _main_tc(recs: list[Record]) -> tuple[float, float] | None:
    cells = _learned_tc(recs)
    if not cells:
        return None
    return PAPER_TC if PAPER_TC in cells else max(cells, key=lambda tc: sum(1 for r in recs if (r.t, r.c) == tc))


def write_report(paths: Iterable[str | Path], out: str | Path | None = None,
                 title: str = "λ-GELU: the paper's tables on these runs") -> Path:
    """Write report.md, table1/2 (.md, .png), the (t, c) heatmaps and Figure 3 per benchmark, and
    numbers.json (everything the Markdown shows, machine-readable). Returns the report.md path."""
    paths = list(paths)
    col = collect(paths)
    if not col.records:
        raise PipelineError(f"no finished runs under {', '.join(map(str, paths))} (a run needs config.json and "
                            f"train/metrics.csv with every epoch){'; unfinished: ' + '; '.join(col.skipped) if col.skipped else ''}")
    out = Path(out) if out else Path(paths[0]) / "paper-report"
    out.mkdir(parents=True, exist_ok=True)
    t1, t2 = table1(col), table2(col)
    md = [f"# {title}", "", f"Runs read from: {', '.join(map(str, paths))} ({len(col.records)} finished variant runs).", ""]
    numbers: dict[str, Any] = {"table1": t1, "table2": t2, "heatmaps": {}, "spearman": {}, "skipped": col.skipped,
                               "confidence": CONFIDENCE}

    md += ["## Table I: best validation score, epoch, mean λ, drift (λ learned all training)", "",
           ("BVS is the best validation score over the epochs (max accuracy, min perplexity); test at BVS the held-out "
           "test score of that checkpoint (where the swap stage ran and harden.select = best_val); Ep. the mean epoch "
           "it was reached; λ̄ the mean over layers of λ at the last epoch; Δλ̄ the drift "
           "V_λ = (1/L) Σ_ℓ Σ_e |λ_ℓ(e+1) − λ_ℓ(e)|; all mean ± 95% t-interval over seeds."), ""]
    cells1 = table1_cells(t1)
    md.append(render.table(TABLE1_HEADER, cells1) if cells1 else "_no finished runs with λ learned all along or baselines_")
    atomic_write_text(out / "table1.md", render.table(TABLE1_HEADER, cells1) + "\n")
    plot_table(TABLE1_HEADER, cells1, out / "table1.png", "Table I")
    md += ["", "![Table I](table1.png)", ""]

    md += ["## Table II: original vs substituted (ReLU) metric of the selected checkpoint, validation and test", "",
           "No weight update after the swap; mean ± 95% t-interval over seeds. Δ = swapped − original (for perplexity, "
           "positive is worse). The validation split chose the checkpoint (its columns are optimistic); the test split "
           "is held out. Rows: " + "; ".join(f"*activation{suffix}*: {what}" for suffix, what in ROW_KINDS) + ". For a ReLU network "
           "the swap changes nothing (original = swapped); for the fine-tuned ablation the selected checkpoint is "
           "usually ReLU already. *not hardened*: seeds whose selected checkpoint had λ below λ_target.", ""]
    cells2 = table2_cells(t2)
    md.append(render.table(TABLE2_HEADER, cells2) if cells2 else "_no finished runs with a swap stage_")
    atomic_write_text(out / "table2.md", render.table(TABLE2_HEADER, cells2) + "\n")
    plot_table(TABLE2_HEADER, cells2, out / "table2.png", "Table II")
    md += ["", "![Table II](table2.png)", ""]
    comp = comparisons(col)
    numbers["comparisons"] = comp
    if comp:
        md += ["## Paired comparisons of the shipped networks", "",
               ("Difference of the test metric after the swap, seed by seed (the same seed gives the same data order "
               "and initial weights), mean ± 95% t-interval."), "", render.table(COMPARISON_HEADER, comparison_cells(comp)), ""]
    support = support_lines(t2, comp)
    if support:
        md += ["## What these numbers support", ""] + support + [""]
    warned = [w for r in t2 for w in r["warnings"]]
    if warned:
        md += ["## Selected checkpoints not hardened to λ_target", ""] + [f"- {w}" for w in warned] + [""]

    for bench, recs in _by_benchmark(col).items():
        grid = tc_grid(recs)
        if grid is not None:
            name = f"fig1-tc-{_slug(bench)}.png"
            plot_tc_heatmap(grid, out / name, f"{bench}: colour Δλ(t, c), text ΔBVS vs GELU ({grid['metric']})")
            numbers["heatmaps"][bench] = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in grid.items()}
            head = ["t \\ c"] + [f"{c:g}" for c in grid["c"]]
            drift_rows = [[f"{t:g}"] + [_num(v, 2) for v in grid["drift"][i]] for i, t in enumerate(grid["t"])]
            dbvs_rows = [[f"{t:g}"] + [f"{v:+.4f}" if not math.isnan(v) else "-" for v in grid["delta_bvs"][i]]
                         for i, t in enumerate(grid["t"])]
            n_rows = [[f"{t:g}"] + [str(v) for v in grid["runs"][i]] for i, t in enumerate(grid["t"])]
            md += [f"## Figure 1: (t, c) grid on {bench}", "",
                   f"Cell means over seeds and s-init modes; GELU BVS = {_num(grid['gelu_bvs'])} over {grid['gelu_seeds']} seeds.",
                   "", "Δλ(t, c):", "", render.table(head, drift_rows), "", "ΔBVS(t, c) = BVS(λ-GELU) − BVS(GELU):", "",
                   render.table(head, dbvs_rows), "", "runs per cell:", "", render.table(head, n_rows), "", f"![Figure 1]({name})", ""]
        tc = _main_tc(recs)
        if tc is not None:
            name = f"fig3-{_slug(bench)}.png"
            plot_figure3(recs, tc, out / name, f"{bench} (t = {tc[0]:g}, c = {tc[1]:g})")
            sp = spearman_curves(recs, tc)
            numbers["spearman"][bench] = {k: {"mean": v["mean"].tolist(), "std": v["std"].tolist(), "n": v["n"]} for k, v in sp.items()}
            md += [f"## Figure 3: validation curves and Spearman ρ_S across init modes, {bench}", ""]
            if sp:
                T = len(next(iter(sp.values()))["mean"])
                picks = sorted({1, max(1, T // 4), max(1, T // 2), T})
                md += [render.table(["pair", "seeds"] + [f"ρ_S(e={e})" for e in picks],
                           [[k, str(v["n"])] + [_num(float(v["mean"][e - 1]), 2) for e in picks] for k, v in sp.items()]), ""]
            md += [f"![Figure 3]({name})", ""]
            md += _lambda_profiles(recs, tc, bench, out)

    study_md, numbers["studies"] = studies.sections(run_dirs(paths))
    md += study_md

    s1, s2 = side_by_side(t1, t2)
    md += ["## Side by side with the paper", "",
           ("The paper's numbers are its Tables I and II (3 seeds, full training on GPUs); ours are the rows above. "
           "A stand-in benchmark (marked in the first column) is compared on trends only."), ""]
    if s1:
        md += [render.table(["ours", "paper row", "Act./mode", "BVS ours", "BVS paper", "Ep. ours/T", "Ep. paper", "λ̄ ours",
                    "λ̄ paper", "Δλ̄ ours", "Δλ̄ paper"], s1), ""]
    if s2:
        md += [render.table(["ours", "paper row", "Mode", "orig. ours", "subst. ours", "change ours", "orig. paper", "subst. paper",
                    "change paper"], s2), ""]
    if not s1 and not s2:
        md += ["_none of these benchmarks maps to a row of the paper's tables_", ""]
    if col.skipped:
        md += ["## Left out (unfinished)", ""] + [f"- {s}" for s in col.skipped] + [""]
    atomic_write_text(out / "numbers.json", json.dumps(_finite(numbers), indent=1, default=_jsonable, allow_nan=False) + "\n")
    atomic_write_text(out / "report.md", "\n".join(md))
    return out / "report.md"


def _lambda_profiles(recs: list[Record], tc: tuple[float, float], bench: str, out: Path) -> list[str]:
    """The layerwise hardness profile per init mode: λ_ℓ at the last epoch (mean over seeds), and
    the uniform mode's λ per layer over epochs (analysis.hardness.plot_lambda)."""
    by_mode: dict[str, list[Record]] = defaultdict(list)
    for r in recs:
        if r.hardenable and not r.annealed and (r.t, r.c) == tc:
            by_mode[r.mode].append(r)
    if not by_mode:
        return []
    L = next(iter(by_mode.values()))[0].lambdas.shape[1]
    rows = [[MODES.get(m, m), str(len(rs))] + [_num(float(np.mean([r.lambdas[-1, j] for r in rs])), 2) for j in range(L)]
            for m, rs in sorted(by_mode.items(), key=lambda kv: list(MODES).index(kv[0]) if kv[0] in MODES else 9)]
    md = [f"Layerwise λ at the last epoch, {bench} (mean over seeds; layer 0 is the input side):", "",
          render.table(["mode", "seeds"] + [f"λ_{j}" for j in range(L)], rows), ""]
    ref = by_mode.get("uniform") or next(iter(by_mode.values()))
    n = min(r.lambdas.shape[0] for r in ref)
    name = f"lambda-{_slug(bench)}.png"
    hardness.plot_lambda(np.mean([r.lambdas[:n] for r in ref], axis=0), out / name,
                         title=f"{bench}: λ per layer, {ref[0].mode} init, mean of {len(ref)} seeds")
    return md + [f"![λ per layer]({name})", ""]


def _finite(o: Any) -> Any:
    """NaN (an undefined std or ρ_S) becomes null, so numbers.json is strict JSON."""
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if isinstance(o, np.ndarray):
        return _finite(o.tolist())
    if isinstance(o, (float, np.floating)) and not math.isfinite(float(o)):
        return None
    return o


def _jsonable(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(type(o).__name__)
