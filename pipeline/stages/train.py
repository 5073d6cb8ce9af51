"""The `train` and `harden` stages: Algorithm 1 over every variant of a run. `train` runs epochs 1..e_s (λ learned),
`harden` e_s+1..T (s frozen, λ annealed to λ_target, or every gate swapped to ReLU and fine-tuned: `harden.method`).
Each phase decides every variant's record (`pipeline.variant_record.decide`, the one writer) and hands it to the loop
(`pipeline.train_loop.train_variant`), which reads e_s and λ_target from it.

Reads: the config and the data. Writes: `train/<variant>/{best,last,switch,switch_best}.pt`, `timing.json`,
`train/metrics.csv` (the loop, per epoch), the variants' records in the manifest; and the stages' section of report.md.
"""

from __future__ import annotations

import csv
from typing import Any

from pipeline import checkpoint, distributed, lambda_stats, variant_record
from pipeline.atomic_io import atomic_write_bytes
from pipeline.config import Config
from pipeline.data import dataset_for
from pipeline.errors import CheckpointError
from pipeline.evaluate import METRICS
from pipeline.render import figure, save, table
from pipeline.rundir import Output, RunDir
from pipeline.train_loop import train_variant

_SET_ASIDE = Output("train/<variant>/*.unusable-*", when="a resume state found unusable is kept beside, never deleted")
# Per stage (train and harden share train/; harden rewrites the files train wrote). A phase without epochs writes none.
OUTPUTS = {
    "train": (Output("train/metrics.csv", when="e_s ≥ 1"),
              *(Output(f"train/<variant>/{f}", when="e_s ≥ 1") for f in ("best.pt", "last.pt", "timing.json", "switch.pt",
                                                                             "switch_best.pt")),
              _SET_ASIDE),
    "harden": (Output("train/metrics.csv", when="e_s < T"),
               *(Output(f"train/<variant>/{f}", when="e_s < T") for f in ("best.pt", "last.pt", "timing.json")),
               _SET_ASIDE),
}


def _run_phase(cfg: Config, run: RunDir, harden_phase: bool, log=print) -> dict[str, Any]:
    device = run.compute_device()
    ds = dataset_for(cfg)
    world = distributed.world()
    if world.main:  # decided once per phase (harden.* may change on --resume from the harden stage), read back
        run.record_variants({v: variant_record.decide(v, cfg.harden, cfg.train) for v in cfg.variants})
    recs = distributed.broadcast({v: run.variant(v) for v in cfg.variants} if world.main else None)
    T = cfg.train.epochs
    e_s = recs[cfg.variants[0]].switch_epoch  # one schedule for every variant of a run
    last = T if harden_phase else e_s
    histories: dict[str, list[dict]] = {}
    for v in cfg.variants:  # histories of every variant, so metrics.csv always holds them all
        p = run.file("train", v, "last.pt")
        try:
            histories[v] = checkpoint.load_payload(p)["state"]["history"] if world.main and p.is_file() else []
        except CheckpointError:
            histories[v] = []  # train_variant sets it aside and falls back
    out = {"epochs": [1 if not harden_phase else e_s + 1, last], "switch_epoch": e_s, "device": str(device)}
    if world.distributed:
        out["world_size"] = world.size
    for v in cfg.variants:
        out[v] = train_variant(cfg, run, ds, v, recs[v], last, harden_phase, histories, device, log)
        if not harden_phase and world.main and run.file("train", v, "last.pt").is_file():
            # Algorithm 1, line 2: keep the state at e_s (λ(e_s), the weights, the best so far) beside the run.
            atomic_write_bytes(run.file("train", v, "switch.pt"), run.file("train", v, "last.pt").read_bytes())
            if run.file("train", v, "best.pt").is_file():
                atomic_write_bytes(run.file("train", v, "switch_best.pt"), run.file("train", v, "best.pt").read_bytes())
    return out


def run_train(cfg: Config, run: RunDir) -> dict[str, Any]:
    """Epochs 1..e_s: weights and λ learned together (λ's s at c·lr, no weight decay)."""
    return _run_phase(cfg, run, harden_phase=False)


def run_harden(cfg: Config, run: RunDir) -> dict[str, Any]:
    """Epochs e_s+1..T: s frozen, λ annealed linearly to λ_target (or gates swapped and fine-tuned)."""
    return _run_phase(cfg, run, harden_phase=True)


# ---------------------------------------------------------------------------------------------
# The train and harden stages' section of report.md


def _metrics_rows(run: RunDir) -> list[dict[str, str]]:
    p = run.file("train", "metrics.csv")
    if not p.is_file():
        return []
    with open(p) as f:
        return list(csv.DictReader(f))


def _shipped(run: RunDir) -> tuple[str, dict[str, Any]]:
    """Which stage's summary says which checkpoint ships (harden once it has finished, else train), and the summary."""
    stages = run.manifest()["stages"]
    for name in ("harden", "train"):
        metrics = stages.get(name, {}).get("metrics")
        if stages.get(name, {}).get("status") == "done" and metrics:
            return name, metrics
    return "", {}


# what each harden.select rule ships, in the report's words (pipeline/config.py HardenConfig.select)
SELECT_RULES = {"best_hardened": "the best among the epochs at λ_target (a baseline without λ: its best epoch)",
                "best_val": "the best validation epoch of the smooth model", "last": "the last epoch",
                "best_swapped": "the best validation epoch of the swapped ReLU model"}


def report_section(cfg: Config, run: RunDir) -> str | None:
    """The shipped checkpoint of every variant (the one `harden.select` chose: what swap, export and verify use),
    training curves with the shipped epoch marked, the λ per layer and the learned phase's drift (None before the
    train stage wrote metrics)."""
    rows = _metrics_rows(run)
    if not rows:
        return None
    figs = run.dir("report")
    metric_col = next(k for k in rows[0] if k.startswith("val_") and k != "val_loss" and not k.endswith("_swapped"))
    higher = METRICS[metric_col[len("val_"):]][1]
    stage, summaries = _shipped(run)
    body, summary, shipped_epochs = [], [], {}
    for v in cfg.variants:
        vr = [r for r in rows if r["variant"] == v]
        if not vr:
            continue
        record = run.variant(v)
        vals = [float(r[metric_col]) for r in vr]
        best_i = max(range(len(vals)), key=lambda i: vals[i] if higher else -vals[i])
        lam_cols = [k for k in vr[0] if k.startswith("lambda_") and vr[0][k] != ""]
        ship = (summaries.get(v) or {}).get("best_epoch")
        at = next((r for r in vr if int(r["epoch"]) == ship), None) if ship else None
        if at is not None:
            shipped_epochs[v] = ship
        lam_at = [float(at[k]) for k in lam_cols] if at is not None else []
        best_epochs = [r["epoch"] for r, x in zip(vr, vals) if x == vals[best_i]]  # every epoch at the best value
        summary.append([v, ship if at is not None else "—", float(at[metric_col]) if at is not None else "—",
                        f"{vals[best_i]:.4f} (epoch{'s' if len(best_epochs) > 1 else ''} {', '.join(map(str, best_epochs))})",
                        vals[-1],
                        (sum(lam_at) / len(lam_at)) if lam_at else "—", record.lambda_target or "—"])
        if lam_cols:
            table_ = [[float(r[k]) for k in lam_cols] for r in vr]
            e_s = record.switch_epoch
            lambda_stats.plot_lambda(table_, figs / f"lambda_{v}.png", layer_names=[f"layer {i}" for i in range(len(lam_cols))],
                                     title=f"{v}: λ per layer", switch_epoch=e_s, target=record.lambda_target,
                                     marked_epoch=shipped_epochs.get(v))
            body.append(f"![λ per layer, {v}](lambda_{v}.png)")
            if e_s >= 2:
                learned = table_[:e_s]
                body.append(f"`{v}`: drift of the learned phase V_λ = {lambda_stats.drift(learned):.4f} over epochs 1..{e_s}; "
                            f"λ(e_s) per layer = {', '.join(f'{x:.3f}' for x in learned[-1])}.")
    for v in cfg.variants:
        if isinstance(summaries.get(v), dict) and summaries[v].get("warning"):
            body.append(f"**Warning** ({v}): {summaries[v]['warning']}.")
    _plot_curves(rows, cfg.variants, metric_col, shipped_epochs, figs / "validation.png")
    which = (f"the checkpoint `harden.select={cfg.harden.select}` chose ({stage} stage's record in the manifest): what the "
             "swap, export and verify stages use" if stage else "not chosen yet (the train stage has not finished)")
    rule = SELECT_RULES.get(cfg.harden.select, "")
    which += (f". `best {metric_col}` is the smooth model's best over all epochs (every epoch that reached it listed); "
              f"the shipped epoch is {rule}, so it can be another epoch, or a later one of equal value (ties go to the "
              "later, more hardened epoch)")
    return "\n\n".join(["## Training (Algorithm 1)", f"Shipped: {which}.",
                        table(["variant", "shipped epoch", f"{metric_col} shipped", f"best {metric_col}", f"last {metric_col}",
                               "mean λ shipped", "λ_target"], summary),
                        "![validation curves](validation.png)", *body])


def _plot_curves(rows: list[dict], variants: list[str], col: str, shipped: dict[str, int], path) -> None:
    save(curves_figure(rows, variants, col, shipped), path)


def curves_figure(rows: list[dict], variants: list[str], col: str, shipped: dict[str, int]):
    """The validation metric per epoch, each variant's shipped epoch marked (★), whole-number epoch ticks."""
    from matplotlib.ticker import MaxNLocator

    fig = figure(6.4, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for i, v in enumerate(variants):
        vr = [r for r in rows if r["variant"] == v]
        line, = ax.plot([int(r["epoch"]) for r in vr], [float(r[col]) for r in vr], marker="o", ms=3, label=v, color=f"C{i}")
        at = next((r for r in vr if int(r["epoch"]) == shipped.get(v)), None)
        if at is not None:
            ax.plot([int(at["epoch"])], [float(at[col])], marker="*", ms=13, color=line.get_color(), markeredgecolor="k",
                    linestyle="none", label=f"{v}: shipped (epoch {at['epoch']})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="epoch", ylabel=col, title="validation metric per epoch (★ = the checkpoint that ships)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig
