"""The `report` stage: one Markdown page (`report/report.md`) and its figures, built only from what
the earlier stages wrote. Each section is a function of the run directory that returns Markdown,
or None when its inputs are absent (a stage that was not run is left out, never filled in).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from pipeline.config import Config
from pipeline.hardness import switch_epoch
from pipeline.render import figure, save, table
from pipeline.rundir import RunDir, atomic_write_text

from . import hardness


def _json(path: Path) -> Any | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _metrics_rows(run: RunDir) -> list[dict[str, str]]:
    p = run.file("train", "metrics.csv")
    if not p.is_file():
        return []
    with open(p) as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------------------------
# Sections


def section_overview(cfg: Config, run: RunDir) -> str:
    m = run.manifest()
    stages = [[name, st.get("status"), st.get("seconds"), st.get("device")] for name, st in m["stages"].items() if name != "report"]
    total = sum(s[2] or 0 for s in stages)
    return "\n\n".join([
        f"# Run `{run.path.name}`",
        f"Data `{cfg.data.name}`, model `{cfg.model.name}`, variants {', '.join(f'`{v}`' for v in cfg.variants)}, "
        f"seed {cfg.seed}, {cfg.train.epochs} epochs ({cfg.train.optimizer}, lr {cfg.train.lr}, wd {cfg.train.weight_decay}, "
        f"{cfg.train.schedule} schedule); λ learned for e_s = {switch_epoch(cfg.train.epochs, cfg.train.switch_fraction)} epochs "
        f"(t = {cfg.gate.temperature}, c = {cfg.gate.lr_mult}, {cfg.gate.granularity}, init {cfg.gate.init}), then annealed to "
        f"λ_target ({cfg.harden.criterion}, ε = {cfg.harden.epsilon:g}): "
        + (", ".join(f"`{v}` {t:.3f}" for v, t in _targets(cfg, run).items()) or "no hardened variant") + ".",
        table(["stage", "status", "seconds", "device"], stages) + f"\n\nTotal stage time: {total:.1f} s.",
    ])


def section_training(cfg: Config, run: RunDir) -> str | None:
    rows = _metrics_rows(run)
    if not rows:
        return None
    figs = run.dir("report")
    metric_col = next(k for k in rows[0] if k.startswith("val_") and k != "val_loss")
    body = []
    summary = []
    for v in cfg.variants:
        vr = [r for r in rows if r["variant"] == v]
        if not vr:
            continue
        vals = [float(r[metric_col]) for r in vr]
        higher = metric_col != "val_perplexity"
        best_i = max(range(len(vals)), key=lambda i: vals[i] if higher else -vals[i])
        lam_cols = [k for k in vr[0] if k.startswith("lambda_") and vr[0][k] != ""]
        lam_best = [float(vr[best_i][k]) for k in lam_cols]
        summary.append([v, int(vr[best_i]["epoch"]), vals[best_i], vals[-1],
                        (sum(lam_best) / len(lam_best)) if lam_best else "—"])
        if lam_cols:
            table_ = [[float(r[k]) for k in lam_cols] for r in vr]
            hardness.plot_lambda(table_, figs / f"lambda_{v}.png", layer_names=[f"layer {i}" for i in range(len(lam_cols))],
                                 title=f"{v}: λ per layer", switch_epoch=switch_epoch(cfg.train.epochs, cfg.train.switch_fraction),
                                 target=_targets(cfg, run).get(v))
            body.append(f"![λ per layer, {v}](lambda_{v}.png)")
            e_s = switch_epoch(cfg.train.epochs, cfg.train.switch_fraction)
            if e_s >= 2:
                learned = table_[:e_s]
                body.append(f"`{v}`: drift of the learned phase V_λ = {hardness.drift(learned):.4f} over epochs 1..{e_s}; "
                            f"λ(e_s) per layer = {', '.join(f'{x:.3f}' for x in learned[-1])}.")
    harden = run.manifest()["stages"].get("harden", {}).get("metrics") or {}
    for v in cfg.variants:
        if isinstance(harden.get(v), dict) and harden[v].get("warning"):
            body.append(f"**Warning** ({v}): {harden[v]['warning']}.")
    _plot_curves(rows, cfg.variants, metric_col, figs / "validation.png")
    return "\n\n".join(["## Training (Algorithm 1)",
                        table(["variant", "best epoch", f"best {metric_col}", f"last {metric_col}", "mean λ at best"], summary),
                        "![validation curves](validation.png)", *body])


def _plot_curves(rows: list[dict], variants: list[str], col: str, path: Path) -> None:
    fig = figure(6.4, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for v in variants:
        vr = [r for r in rows if r["variant"] == v]
        ax.plot([int(r["epoch"]) for r in vr], [float(r[col]) for r in vr], marker="o", ms=3, label=v)
    ax.set(xlabel="epoch", ylabel=col, title="validation metric per epoch")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, path)


def section_swap(cfg: Config, run: RunDir) -> str | None:
    swap = _json(run.file("swap", "swap.json"))
    if swap is None:
        return None
    swapped_to = {v: run.variant(v)["swapped_to"] for v in swap}
    rows = [[v, swapped_to[v] or "no swap (not a gate)", r["val_before"], r["val_after"], r["val_after"] - r["val_before"], r["test_before"],
             r["test_after"], r["argmax_agreement"], r["max_logit_change"]] for v, r in swap.items()]
    return "\n\n".join(["## Swap to ReLU (best checkpoint, no weight update)",
                        table(["variant", "swap to", "val before", "val after", "Δ val", "test before", "test after", "argmax agreement (val)", "max |Δ logit| (val)"], rows)])


def _targets(cfg: Config, run: RunDir) -> dict[str, float]:
    """λ_target per hardened variant, as the train stage recorded it (each gate family has its own)."""
    facts = run.manifest().get("variants", {})
    return {v: f["lambda_target"] for v, f in facts.items() if f.get("lambda_target")}


def run_report(cfg: Config, run: RunDir) -> dict[str, Any]:
    """The overview, then each stage's own section in run order (a stage that has not run returns None
    and is left out, never filled in)."""
    from pipeline.stages import STAGES, resolve

    sections = {"overview": section_overview(cfg, run)}
    for name, stage in STAGES.items():
        if stage.report:
            sections[name] = resolve(stage.report)(cfg, run)
    parts = [text for text in sections.values() if text]
    atomic_write_text(run.file("report", "report.md"), "\n\n".join(parts) + "\n")
    return {"sections": [k for k, text in sections.items() if text]}
