"""Reading finished run directories into records: one `Record` per variant of a run, its facts read from the train
stage's record (`RunDir.variant`), its curves from `train/metrics.csv`, its swap from `swap/swap.json` and the
selected checkpoint's hardness from the harden stage's metrics in the manifest.

Which table a record feeds follows from its record: a hardenable variant whose switch epoch is T (train.switch_fraction
= 1) is "learned" (Table I, Figures 1 and 3), the others "annealed" (Table II); baselines feed both. Runs that have not
finished every epoch are listed and left out.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline import lambda_stats
from pipeline.errors import PipelineError
from pipeline.evaluate import METRICS
from pipeline.rundir import RunDir

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
MODES = {"uniform": "uni", "increasing": "inc", "decreasing": "dec"}


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
    is_relu: bool  # trained as ReLU (the variant's record): a from-scratch row of Table II
    metric: str  # a key of pipeline.evaluate.METRICS
    val: np.ndarray  # [epochs]
    lambdas: np.ndarray  # [epochs, layers]; [epochs, 0] for baselines
    swap: dict[str, float] | None = None
    method: str = "anneal"  # harden.method: anneal (Algorithm 1) or swap (ReLU at e_s + 1, then fine-tuned)
    select: str = "best_hardened"  # harden.select
    hardness: float | None = None  # the selected checkpoint's smallest λ / λ_target (train stage); None: no λ
    warning: str | None = None  # the train stage's warning about the selected checkpoint, if any

    @property
    def hardenable(self) -> bool:
        return self.lambdas.shape[1] > 0

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric][1]

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
        return lambda_stats.drift(self.lambdas) if self.hardenable else math.nan


@dataclass
class Collection:
    records: list[Record] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "<run>: why"


def _benchmark(cfg) -> str:
    data, model = cfg.data.name, cfg.model.name
    label = LABELS.get((data, model), f"{model}/{data}")
    return label + (f" (subset {cfg.data.subset})" if cfg.data.subset else "")


def _float(v: str) -> float:
    return float(v) if v not in ("", None) else math.nan


def read_run(path: Path) -> tuple[list[Record], list[str]]:
    """The records of one run directory's finished variants, and what was left out (unfinished) with why."""
    run = RunDir.open(path)
    cfg = run.cfg
    metrics = run.file("train", "metrics.csv")
    if not metrics.is_file():
        return [], [f"{path}: no train/metrics.csv"]
    with open(metrics) as f:
        rows = list(csv.DictReader(f))
    swap = run.read_json("swap", "swap.json") or {}
    selected = run.manifest()["stages"].get("harden", {}).get("metrics") or {}
    T = cfg.train.epochs
    out, skipped = [], []
    for variant in cfg.variants:
        vrows = [r for r in rows if r["variant"] == variant]
        if len(vrows) < T:
            skipped.append(f"{path.name}/{variant}: {len(vrows)} of {T} epochs")
            continue
        record = run.variant(variant)
        metric_col = next(k for k in vrows[0] if k.startswith("val_") and k != "val_loss" and not k.endswith("_swapped")
                          and vrows[0][k] != "")
        lam_cols = sorted((k for k in vrows[0] if k.startswith("lambda_") and vrows[0][k] != ""), key=lambda k: int(k.split("_")[1]))
        if record.hardenable != bool(lam_cols):
            raise PipelineError(f"{metrics}: {variant} is {'' if record.hardenable else 'not '}hardenable by its record, but "
                                f"its λ columns say otherwise; rerun it with `pipeline run --resume {path} --redo train`")
        lams = np.array([[_float(r[k]) for k in lam_cols] for r in vrows[:T]], dtype=np.float64).reshape(T, len(lam_cols))
        sel = selected.get(variant) or {}
        out.append(Record(
            run=str(path), benchmark=_benchmark(cfg), variant=variant, mode=cfg.gate.init if record.hardenable else "-",
            t=cfg.gate.temperature, c=cfg.gate.lr_mult, seed=cfg.seed, epochs=T,
            annealed=record.hardenable and record.switch_epoch < T, is_relu=record.is_relu, metric=metric_col[len("val_"):],
            val=np.array([float(r[metric_col]) for r in vrows[:T]]), lambdas=lams,
            swap=swap.get(variant),  # a ReLU baseline too: the swap stage records it with before = after
            method=cfg.harden.method, select=cfg.harden.select,
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
