"""The paper's tables from records: Table I (best validation score, epoch, mean λ, drift), Table II (the selected
checkpoint before and after the swap, validation and test), the paired comparisons of the shipped networks, the
(t, c) grid of Figure 1, the Spearman curves of Figure 3, their Markdown cells, what the intervals support, and the
side-by-side with the paper's own numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import lambda_stats
from pipeline.evaluate import METRICS

from ..stats import mean_ci as _stats
from .runs import MODES, Collection, Record, _by_benchmark, _learned_tc
from .reference import PAPER_TABLE1, PAPER_TABLE2, PAPER_TC, paper_row

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
    if r.is_relu:
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
            rho = np.array([[s["rho"] for s in lambda_stats.spearman_over_epochs(by_mode[m1][k].lambdas, by_mode[m2][k].lambdas)]
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


def pm(ms: tuple[float, ...] | None, digits: int = 4) -> str:
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
                    pm(r["bvs"], d), pm(r.get("test"), d), f"{r['epoch']:.1f}", pm(r["lambda"], 2), pm(r["drift"], 2),
                    str(r["seeds"])])
    return out


TABLE2_HEADER = ["Benchmark", "T", "Row", "val original", "val swapped", "Δ val", "test original", "test swapped", "Δ test",
                 "argmax agr. (val)", "not hardened", "seeds"]


def table2_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        d = _digits(r["metric"])
        out.append([f"{r['benchmark']} ({r['metric']})", str(r["epochs"]), r["mode"],
                    *(pm(r[f"{sp}_{w}"], d) for sp in ("val", "test") for w in ("original", "substituted", "change")),
                    _num(r["agreement"], 4), f"{r['not_hardened']}/{r['seeds']}" if r["hardness_min"] is not None else "-",
                    str(r["seeds"])])
    return out


COMPARISON_HEADER = ["Benchmark", "A", "B", "A − B (test, after the swap)", "paired seeds", "what the interval says"]


def comparison_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[f"{r['benchmark']} ({r['metric']})", r["a"], r["b"], pm(r["difference"], _digits(r["metric"])), str(r["seeds"]),
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
            parts.append(f"the swap of {key} changes test {r['metric']} by {pm(r['test_change'], _digits(r['metric']))} "
                         f"over {n} seeds: {what}")
            if r["not_hardened"]:
                parts.append(f"{r['not_hardened']} of {r['seeds']} {key} checkpoints were selected before λ reached λ_target")
        mine = [c for c in comp if c["benchmark"] == bench]
        for c in mine:
            if c["outcome"] in ("better", "worse"):
                parts.append(f"the shipped {c['a']} is {c['outcome']} than {c['b']} on test "
                             f"({pm(c['difference'], _digits(c['metric']))}, the interval excludes 0)")
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
