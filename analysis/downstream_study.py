"""The downstream study, tabulated by `pipeline report` from finished runs (configs/sweeps/downstream-*.toml; each run's
record is its downstream stage's `downstream/downstream.json`, `analysis/downstream.py`, and where
benchmarks/peers/lirpa_downstream.py ran, auto_LiRPA's view in `downstream/lirpa.json`): per benchmark and variant,
every measure as mean ± 95% t-interval over seeds, paired differences (same benchmark and seed) of each annealed
variant against ReLU trained from scratch and against the smooth network of its family swapped directly, and
certified-accuracy-vs-ε curves with their bands. Nothing is measured here; a run without the record takes no part.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import render
from pipeline.rundir import RunDir

from . import downstream as ds_mod
from .stats import CONFIDENCE, mean_ci

# annealed variant -> the directly swapped smooth network of its family; every one is also paired with "relu"
PAIRS = {"lambda_gelu": "gelu", "lambda_swish": "silu"}
BASELINE = "relu"
NAMES = {"lambda_gelu": "λ-GELU annealed → ReLU", "gelu": "GELU swapped", "relu": "ReLU from scratch",
         "lambda_swish": "λ-Swish annealed → ReLU", "silu": "SiLU swapped"}
ORDER = list(NAMES)


def measures(v: dict[str, Any]) -> dict[str, float]:
    """One variant's record flattened to the study's scalar measures (NaN where the run has none)."""
    nan = math.nan
    i8, sp = v.get("int8") or {}, v.get("sparsity") or {}
    out = {"int8 test drop (pt)": i8.get("test_drop_pt", nan), "int8 argmax agreement": i8.get("test_argmax_agreement", nan),
           "logits SQNR (dB)": i8.get("output_sqnr_db", nan), "mean APoZ": sp.get("apoz_mean", nan),
           "pruned losslessly": sp.get("pruned_fraction", nan), "pruned latency ratio": sp.get("latency_ratio", nan)}
    for kind, label in (("relu", "float"), ("int8", "int8")):
        for c in (v.get("verify") or {}).get(kind, []):
            e = f"{c['eps']:g}"
            out[f"{label} certified @ {e}"] = c["certified"]
            out[f"{label} falsified @ {e}"] = c["falsified"]
            out[f"{label} median s/decided @ {e}"] = c["median_decided_seconds"] if c["median_decided_seconds"] is not None else nan
        r = (v.get("radius") or {}).get(kind)
        if r:
            out[f"{label} median certified radius"] = r["median_proved"] if r["median_proved"] is not None else nan
    for p in v.get("lirpa") or []:  # auto_LiRPA's view (benchmarks/peers/lirpa_downstream.py), where it was run
        e = f"{p['eps']:g}"
        out[f"auto_LiRPA CROWN certified @ {e}"] = p["crown_certified"]
        out[f"auto_LiRPA α-CROWN certified @ {e}"] = p["alpha_crown_certified"]
        out[f"auto_LiRPA unstable ReLUs @ {e}"] = p["crown_unstable_mean"]
    for u in (v.get("unstable") or {}).get("relu", []):
        e = f"{u['eps']:g}"
        out[f"unstable ReLUs @ {e}"] = u["unstable_mean"] if u["unstable_mean"] is not None else nan
        for j, layer in enumerate(u["layers"]):
            out[f"layer {j} stable @ {e}"] = layer["active"] + layer["dead"]
    return {k: (float(x) if x is not None else nan) for k, x in out.items()}


def collect(paths: list[Path]) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    """{benchmark: {variant: {seed: that variant's record}}} over every run with a downstream record."""
    out: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for p in paths:
        run = RunDir.open(p)
        rec = run.read_json("downstream", "downstream.json")
        if not rec:
            continue
        cfg = run.cfg
        bench = f"{cfg.data.name}/{cfg.model.name}" + (f" ({cfg.data.subset})" if cfg.data.subset else "")
        peer = (run.read_json("downstream", "lirpa.json") or {}).get("variants", {})
        details = run.file("verify", "details.csv")
        never = ds_mod.unposed(ds_mod.read_details(details)) if details.exists() else {}
        for v, r in rec["variants"].items():
            out.setdefault(bench, {}).setdefault(v, {})[cfg.seed] = {
                **r, "lirpa": peer.get(v), "unposed": {"float": never.get(v, 0), "int8": never.get(f"{v}-int8", 0)}}
    return out


def _pm(m: tuple[float, float, float, int], scale: float = 1.0, digits: int = 3) -> str:
    if m[3] == 0 or math.isnan(m[0]):
        return "—"
    s = f"{scale * m[0]:.{digits}f}"
    return s + ("" if math.isnan(m[2]) else f" ± {scale * m[2]:.{digits}f}")


def rows(study: dict[str, dict[str, dict[int, dict[str, Any]]]]) -> dict[str, Any]:
    """Per benchmark: per variant and measure mean_ci over seeds; per pair (annealed, other) and measure mean_ci of the
    per-seed differences annealed − other (seeds both have)."""
    out: dict[str, Any] = {}
    for bench, variants in sorted(study.items()):
        flat = {v: {s: measures(r) for s, r in seeds.items()} for v, seeds in variants.items()}
        keys = list(dict.fromkeys(k for per in flat.values() for m in per.values() for k in m))
        table = {v: {k: mean_ci(m.get(k, math.nan) for m in per.values()) for k in keys} for v, per in flat.items()}
        pairs = {}
        for a, own in PAIRS.items():
            for b in (BASELINE, own):
                if a in flat and b in flat:
                    seeds = sorted(set(flat[a]) & set(flat[b]))
                    pairs[f"{a} − {b}"] = {k: mean_ci(flat[a][s].get(k, math.nan) - flat[b][s].get(k, math.nan)
                                                       for s in seeds) for k in keys}
        out[bench] = {"measures": keys, "variants": table, "pairs": pairs,
                      "seeds": {v: sorted(per) for v, per in flat.items()}}
    return out


def _curves(variants: dict[str, dict[int, dict[str, Any]]], kind: str) -> dict[str, tuple[np.ndarray, list]]:
    """Per variant: the curve's ε and per ε the mean_ci of certified accuracy over seeds."""
    out = {}
    for v, seeds in variants.items():
        curves = [r["radius"][kind]["curve"] for r in seeds.values() if (r.get("radius") or {}).get(kind)]
        if not curves:
            continue
        eps = np.array([c["eps"] for c in curves[0]])
        out[v] = (eps, [mean_ci(cv[i]["certified"] for cv in curves if len(cv) == len(eps)) for i in range(len(eps))])
    return out


def plot_curves(path: Path, title: str, curves: dict[str, tuple[np.ndarray, list]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for v, (eps, cis) in sorted(curves.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else 9):
        m = np.array([c[0] for c in cis]) * 100
        h = np.nan_to_num(np.array([c[2] for c in cis]) * 100)
        ax.plot(eps, m, label=NAMES.get(v, v))
        ax.fill_between(eps, m - h, m + h, alpha=0.2)
    ax.set_xlabel("ε (L∞, data units)")
    ax.set_ylabel("certified accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(study: dict[str, Any], numbers: dict[str, Any], out: Path | None) -> list[str]:
    if not numbers:
        return []
    md = ["## Downstream: does hardening pay after the swap?", "",
          (f"Per benchmark and variant, mean ± {CONFIDENCE:.0%} t-interval over seeds (no ± with one seed). Paired: "
           "annealed − other on the same seed. Verification columns: the verify stage's properties (first validation "
           "examples); radii: bisection over sound answers, a censored radius counted at eps_max (a lower bound). "
           "Fractions are shares (×100 = %). Seconds per decided property are the verify stage's: a network's "
           "properties, every ε together, share its batched first bound pass evenly, so where that pass decides most "
           "of them the median is the pass's cost per property, the same at every ε."), ""]
    for bench, t in numbers.items():
        variants = sorted(t["variants"], key=lambda v: ORDER.index(v) if v in ORDER else 9)
        md += [f"### {bench}", "", "Seeds: " + ", ".join(f"{NAMES.get(v, v)} {len(t['seeds'][v])}" for v in variants), ""]
        md += unposed_lines(study[bench])
        md += [render.table(["measure", *(NAMES.get(v, v) for v in variants)],
                            [[k, *(_pm(t["variants"][v][k]) for v in variants)] for k in t["measures"]]), ""]
        if t["pairs"]:
            pairs = list(t["pairs"])
            md += ["Paired differences (an interval that excludes 0 supports a difference; one that contains it does not):", "",
                   render.table(["measure", *pairs], [[k, *(_pm(t["pairs"][p][k]) for p in pairs)] for k in t["measures"]]), ""]
            md += support_lines(t["pairs"]) + [""]
        for kind, label in (("relu", "float ReLU"), ("int8", "int8")):
            curves = _curves(study[bench], kind)
            if curves and out is not None:
                name = f"downstream-{''.join(ch if ch.isalnum() else '-' for ch in bench)}-{kind}.png"
                plot_curves(out / name, f"{bench}: certified accuracy vs ε, {label} (band: {CONFIDENCE:.0%} t-interval)", curves)
                md += [f"![certified accuracy vs ε, {bench}, {label}]({name})", ""]
    return md


def unposed_lines(variants: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """A warning where a run's verify budget ran out before every property was posed (reason "budget"): those
    networks' certified and falsified shares then depend on the order of verification, and the line names them."""
    hit = [f"{NAMES.get(v, v)} seed {s} {kind} {n}" for v, seeds in sorted(variants.items()) for s, r in sorted(seeds.items())
           for kind, n in (r.get("unposed") or {}).items() if n]
    if not hit:
        return []
    return [("**Not measured where the budget ran out:** properties never posed (reason `budget` in the run's "
             "verify/details.csv): " + "; ".join(hit) + ". Their networks' certified and falsified shares count them as "
             "neither, so at those seeds they say in which order the networks were verified; rerun the point with a "
             "larger `verify.budget_s` / `verify.int8_budget_s`, on a machine that is not loaded."), ""]


def support_lines(pairs: dict[str, dict[str, tuple]]) -> list[str]:
    """One line per pair: the measures whose interval excludes 0, and how many contain it."""
    out = []
    for p, ms in pairs.items():
        apart = [f"{k} ({_pm(m)})" for k, m in ms.items() if m[3] >= 2 and not math.isnan(m[2]) and abs(m[0]) > m[2]]
        undecided = sum(1 for m in ms.values() if m[3] >= 2 and not math.isnan(m[2]) and abs(m[0]) <= m[2])
        few = sum(1 for m in ms.values() if m[3] < 2)
        out.append(f"- {p}: " + (("interval excludes 0 for " + "; ".join(apart)) if apart else "no interval excludes 0")
                   + f"; {undecided} contain 0" + (f"; {few} with fewer than 2 paired seeds (no interval)" if few else "") + ".")
    return out


def sections(paths: list[Path], out: Path | None = None) -> tuple[list[str], dict[str, Any]]:
    study = collect(paths)
    numbers = rows(study)
    return markdown(study, numbers, out), numbers
