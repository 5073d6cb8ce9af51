"""`pipeline report`: the paper's Section IV regenerated from run directories: report.md, the tables (.md, .png),
the figures and numbers.json (everything the Markdown shows, machine-readable)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import lambda_stats, render
from pipeline.errors import PipelineError
from pipeline.atomic_io import atomic_write_text

from .. import downstream_study, studies
from ..stats import CONFIDENCE
from .figures import plot_figure3, plot_table, plot_tc_heatmap
from .runs import MODES, Record, _by_benchmark, _learned_tc, collect, run_dirs
from .reference import PAPER_TC
from .tables import (COMPARISON_HEADER, ROW_KINDS, TABLE1_HEADER, TABLE2_HEADER, _num, comparison_cells, comparisons,
                     side_by_side, spearman_curves, support_lines, table1, table1_cells, table2, table2_cells, tc_grid)

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
    down_md, numbers["downstream"] = downstream_study.sections(run_dirs(paths), out)
    md += down_md

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
    the uniform mode's λ per layer over epochs (pipeline.lambda_stats.plot_lambda)."""
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
    lambda_stats.plot_lambda(np.mean([r.lambdas[:n] for r in ref], axis=0), out / name,
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
