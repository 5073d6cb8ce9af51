"""The `report` stage: one Markdown page (`report/report.md`) and its figures, built only from what
the earlier stages wrote. Each section is a function of the run directory that returns Markdown,
or None when its inputs are absent (a stage that was not run is left out, never filled in).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Callable

from pipeline.activations import swapped_activation
from pipeline.config import Config
from pipeline.hardness import switch_epoch
from pipeline.rundir import RunDir, atomic_path, atomic_write_text
from pipeline.train import target_for

from . import hardness


def _json(path: Path) -> Any | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _fmt(v: Any, digits: int = 4) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.{digits}g}" if abs(v) < 1e-3 or abs(v) >= 1e4 else f"{v:.{digits}f}"
    return str(v)


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(h.replace("|", "\\|") for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


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
        f"λ_target = {target_for(cfg):.3f} ({cfg.harden.criterion}, ε = {cfg.harden.epsilon:g}).",
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
                                 target=target_for(cfg))
            body.append(f"![λ per layer, {v}](lambda_{v}.png)")
            e_s = switch_epoch(cfg.train.epochs, cfg.train.switch_fraction)
            if e_s >= 2:
                learned = table_[:e_s]
                body.append(f"`{v}`: drift of the learned phase V_λ = {hardness.drift(learned):.4f} over epochs 1..{e_s}; "
                            f"λ(e_s) per layer = {', '.join(f'{x:.3f}' for x in learned[-1])}.")
    _plot_curves(rows, cfg.variants, metric_col, figs / "validation.png")
    return "\n\n".join(["## Training (Algorithm 1)",
                        table(["variant", "best epoch", f"best {metric_col}", f"last {metric_col}", "mean λ at best"], summary),
                        "![validation curves](validation.png)", *body])


def _plot_curves(rows: list[dict], variants: list[str], col: str, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for v in variants:
        vr = [r for r in rows if r["variant"] == v]
        ax.plot([int(r["epoch"]) for r in vr], [float(r[col]) for r in vr], marker="o", ms=3, label=v)
    ax.set(xlabel="epoch", ylabel=col, title="validation metric per epoch")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


def section_swap(cfg: Config, run: RunDir) -> str | None:
    swap = _json(run.file("swap", "swap.json"))
    if swap is None:
        return None
    rows = [[v, swapped_activation(v) or "no swap (not a gate)", r["val_before"], r["val_after"], r["val_after"] - r["val_before"], r["test_before"],
             r["test_after"], r["argmax_agreement"], r["max_logit_change"]] for v, r in swap.items()]
    return "\n\n".join(["## Swap to ReLU (best checkpoint, no weight update)",
                        table(["variant", "swap to", "val before", "val after", "Δ val", "test before", "test after", "argmax agreement (val)", "max |Δ logit| (val)"], rows)])


def section_check(cfg: Config, run: RunDir) -> str | None:
    b = _json(run.file("check", "bounds.json"))
    if b is None:
        return None
    out = ["## Bounds (check stage)"]
    for gate, s in b["symbolic"]["gates"].items():
        out.append(f"- gate `{gate}` ({s['label']}): E∞(λ) = `{s['gate_l1']['expr']}`, ∫|ReLU − f_λ| = `{s['act_l1']['expr']}`, "
                   f"sup|ReLU − f_λ| = {s['sup']['c']:.6f}/λ at x = ±{s['sup']['u']:.6f}/λ, Lipschitz {s['lipschitz']['value']:.6f}; "
                   f"λ_target at ε = {b['symbolic']['eps']:g}: " + ", ".join(f"{k} {v:.3f}" for k, v in s["lambda_target"].items()))
    for v, r in b["variants"].items():
        if not r["layers"]:
            out.append(f"`{v}`: {r.get('note', 'no gates')}.")
            continue
        rows = [[l["layer"], l["lambda_mean"], l["max_gap"], l["sup_bound"], l["mean_gap"], l["mean_gap_predicted"], l["gate_error"],
                 l["gate_error_predicted"], l["soft_fraction"], "pass" if l["pass"] else "FAIL"] for l in r["layers"]]
        out.append(f"### `{v}` (best epoch {r.get('epoch')})\n\n" + table(
            ["layer", "λ", "max gap", "c/λ", "mean gap", "p̂(0)/(2λ²)", "E_p|H − g|", "p̂(0)·E∞(λ)", "soft fraction", "verdict"], rows))
        cert = r.get("certificate")
        if cert:
            out.append(f"Swap certificate: any logit moves by at most **{cert['bound_max']:.4g}** (global) when every gate becomes ReLU; "
                       f"measured max change {cert['measured_max_logit_change']:.4g}. "
                       f"{100 * cert['certified_fraction']:.2f}% of validation samples have a top-1 margin above twice the bound "
                       f"(prediction provably unchanged by the swap)" + (
                           f"; per-sample bound: {100 * cert['certified_fraction_per_sample']:.2f}%." if "certified_fraction_per_sample" in cert else "."))
    out.append("![gate error per layer](../check/gate_error.png)")
    return "\n\n".join(out)


def section_verify(cfg: Config, run: RunDir) -> str | None:
    from .verify import report_section

    return report_section(cfg, run)


SECTIONS: list[Callable[[Config, RunDir], str | None]] = [section_overview, section_training, section_check, section_swap,
                                                          section_verify]


def run_report(cfg: Config, run: RunDir) -> dict[str, Any]:
    parts = [s for s in (fn(cfg, run) for fn in SECTIONS) if s]
    atomic_write_text(run.file("report", "report.md"), "\n\n".join(parts) + "\n")
    return {"sections": len(parts)}
