"""The verify stage's section of report.md (`report_section`, read from ``verify/summary.json``): the certified
fraction per network and ε, how the swapped ReLU networks were decided, the figure of certified, falsified and open
fractions per network kind, and the chain per property.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analysis.robustness.chain import fractions
from analysis.robustness.properties import ROUTES, is_int8
from pipeline.config import Config
from pipeline.render import figure, pct, save, table
from pipeline.rundir import RunDir

FRACTIONS_PNG = "verify_fractions.png"
KINDS = (("relu", "float ReLU"), ("smooth", "smooth"), ("int8", "int8"))
OUTCOME_COLORS = {"certified": "#2a9d4b", "falsified": "#d1495b", "open": "#b8b8b8"}


def fractions_figure(chain: Sequence[dict[str, Any]], variants: Sequence[str]):
    """One panel per network kind that has answers: at each ε a stacked bar per variant, certified / falsified /
    open fractions of its properties."""
    fr = fractions(chain)
    kinds = [(k, name) for k, name in KINDS if any(key[0] == k for key in fr)]
    eps = sorted({key[2] for key in fr})
    fig = figure(4.2 * max(1, len(kinds)), 3.9)
    for i, (kind, name) in enumerate(kinds):
        ax = fig.add_subplot(1, len(kinds), i + 1)
        vs = [v for v in variants if any(key[:2] == (kind, v) for key in fr)]
        width = 0.8 / max(1, len(vs))
        for j, v in enumerate(vs):
            xs = [e_i + (j - (len(vs) - 1) / 2) * width for e_i in range(len(eps))]
            bottom = [0.0] * len(eps)
            for outcome, color in OUTCOME_COLORS.items():
                h = [fr.get((kind, v, e), {}).get(outcome, 0.0) for e in eps]
                ax.bar(xs, h, width * 0.92, bottom=bottom, color=color, edgecolor="k", linewidth=0.4,
                       label=outcome if j == 0 else None)
                bottom = [b + x for b, x in zip(bottom, h)]
            for x in xs:
                ax.text(x, 1.01, v, rotation=90, ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(eps)), [f"{e:g}" for e in eps])
        ax.set(xlabel="ε", ylim=(0, 1.3), title=f"{name} network")
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
        if i == 0:
            ax.set_ylabel("fraction of properties")
    handles, labels = fig.axes[0].get_legend_handles_labels() if fig.axes else ([], [])
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend below the panels
    return fig


def _sec(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def report_section(cfg: Config, run: RunDir) -> str | None:
    """Markdown for report.md: one certified-fraction table (swapped ReLU networks, and the smooth networks by
    both routes) per eps, how each was decided, and which network each certificate is about. None when the
    verify stage has not run."""
    s = run.read_json("verify", "summary.json")
    if s is None:
        return None
    if "budget_s" not in s:  # written by an older version of this stage
        return "## Verification (L∞ local robustness)\n\nverify/summary.json predates this report; rerun the verify stage."
    clock = "wall-clock" if s["clock"] == "wall" else "CPU"
    main = s["verifiers"][0]
    cap = f", at most {s['timeout_s']:g} s per property" if s["timeout_s"] else ""
    dec = s["decided"]["relu"]
    out = ["## Verification (L∞ local robustness)",
           f"Properties: {s['sample_selection']}; the true class's logit beats every other on the L∞ box of radius ε "
           f"clipped to the input range {s['input_range']} (ε in {s['eps_units']}). Time: one budget of {s['budget_s']:g} s "
           f"for the float networks, shared by their properties (easy ones first, what they leave to the hard ones{cap}; "
           f"{clock} seconds per property, {s['jobs']} worker process(es)); solving took {s['solve_seconds']:.1f} s. "
           f"Decided: {dec['decided']} of {dec['properties']} ReLU properties. Certified = unsat (proved); falsified = "
           f"sat (a counterexample, re-checked in float32 on the network itself; a sample the network already "
           f"misclassifies counts as falsified)."]
    eps_cols = [f"ε = {e:g}" for e in s["epsilons"]]
    rows = []
    for v in [m for m, x in s["models"].items() if x.get("onnx")]:
        cells = []
        for e in s["epsilons"]:
            r = next((t for t in s["table"] if t["variant"] == v and t["eps"] == e and t["verifier"] == main), None)
            cells.append("—" if r is None else f"{pct(r['certified_fraction'])} ({pct(r['falsified_fraction'])} sat)")
        m = s["models"][v]
        base = m.get("variant", v)
        label = f"{base} (ReLU from the start)" if run.variant(base).is_relu else f"{base} swapped to ReLU"
        if is_int8(v):
            rows.append([f"{label}, int8", "int8 ONNX (onnxruntime)", f"`{s['chains'][main]}` on the rounding's relaxation", *cells])
        else:
            rows.append([label, "ReLU ONNX", f"`{s['chains'][main]}`", *cells])
    for v in s.get("smooth_models", {}):
        for route in ROUTES:
            cells = []
            for e in s["epsilons"]:
                r = next((t for t in s["smooth_table"] if t["variant"] == v and t["eps"] == e and t["route"] == route), None)
                cells.append("—" if r is None else f"{pct(r['certified_fraction'])} ({pct(r['falsified_fraction'])} sat)")
            how = ("bounds through its gates (CROWN, α-CROWN)" if route == "direct"
                   else "via the swap: ReLU margin minus the smooth-to-ReLU gap bound")
            rows.append([f"{v} smooth", "smooth (train best.pt)", how, *cells])
    out.append("Certified fraction (falsified in brackets):\n\n" + table(["model", "network", "method", *eps_cols], rows))
    out.append(f"Which network each certificate is about: **ReLU ONNX** = {s['networks']['relu']}; "
               f"**int8 ONNX** = {s['networks'].get('int8', '—')}; "
               f"**smooth** = {s['networks']['smooth']}. The smooth routes: *direct* proves the smooth network itself "
               "through sound linear relaxations of x·Φ(λx); *via the swap* proves the ReLU network with the same weights "
               "and carries the proof over where its margin exceeds the sound bound on |smooth − ReLU| over the box "
               "(per logit, from the pre-activation bounds; each unit adds at most c/λ, exponentially less when its "
               "interval stays away from 0).")
    detail = [[r["variant"], f"{r['eps']:g}", r["verifier"], r["properties"], r["unsat"], r["sat"], r["timeout"],
               r["unknown"] + r["error"], pct(r["decided_fraction"]), _sec(r["median_seconds"]), _sec(r["max_seconds"]),
               "—" if r["mean_unstable_ibp"] is None else f"{r['mean_unstable_ibp']:.1f}",
               "—" if r["mean_unstable_tight"] is None else f"{r['mean_unstable_tight']:.1f}", r["relus"]]
              for r in s["table"]]
    int8_note = (" For an int8 model (its `-int8` rows) the ReLU units are those of the clamps the reader puts after "
                 "every requantization (`analysis/verification/readers.py`): clamp(x, lo, hi) = lo + ReLU(x − lo) − "
                 "ReLU(x − hi), two ReLUs per requantized unit (the ReLU the quantizer absorbed is the lower end), the "
                 "logits' too; hence about twice the float network's count (a network of hidden widths h₁…h_k with K "
                 "outputs: 2·(h₁ + … + h_k + K))." if any(is_int8(v) and m.get("onnx") for v, m in s["models"].items())
                 else "")
    out.append("How the swapped ReLU networks were decided. Unstable ReLUs: units whose input interval crosses 0 over the "
               "box, by IBP and by the tight CROWN/α-CROWN bounds branch and bound starts from, each the **mean** over the "
               "properties a verifier ran on (one decimal). ReLU units: what branch and bound can split." + int8_note +
               "\n\n" + table(
                   ["model", "ε", "verifier", "properties", "unsat", "sat", "timeout", "unknown/error", "decided",
                    f"median {s['clock']} s", f"max {s['clock']} s", "mean unstable (IBP)", "mean unstable (tight)",
                    "ReLU units"], detail))
    if s.get("chain"):
        save(fractions_figure(s["chain"], [m for m in s["models"] if not is_int8(m)]), run.dir("report") / FRACTIONS_PNG,
             layout=False)
        out.append(f"![certified, falsified and open fraction against ε per network]({FRACTIONS_PNG})\n\n"
                   "Per network kind (the float ReLU network after the swap, the smooth network the user trained, the int8 "
                   "model that ships) and variant: the fraction of properties certified (unsat), falsified (sat) and left "
                   "open (timeout, unknown, error) at each ε, with the first verifier. The smooth network counts as "
                   "certified when either route proved it.")
    if "int8" in s["decided"] and s["decided"]["int8"]["properties"]:
        d8 = s["decided"]["int8"]
        took = (f"in {s['int8_solve_seconds']:.1f} s (their own budget of {s['int8_budget_s']:g} s, after the float "
                "networks')") if "int8_solve_seconds" in s else f"in {s['int8_seconds']:.1f} s of solving (summed over properties)"
        out.append(f"int8 models: {d8['decided']} of {d8['properties']} properties decided {took}.")
    if s.get("chain"):
        crow = [[c["variant"], c["sample"], c["eps"], c["smooth_direct"], c["smooth_via_relu"], c["relu"], c["int8"],
                 c["carries_over"]] for c in s["chain"]]
        out.append("The chain, per property (`verify/chain.csv`): what is proven about each network, from the smooth one "
                   "the user trained to the int8 model that ships (unsat = proven robust, sat = a re-checked counterexample):"
                   "\n\n" + table(["variant", "sample", "ε", "smooth (direct)", "smooth (via swap)", "float ReLU", "int8",
                                    "what carries over"], crow))
    for v, m in s["models"].items():
        if not m.get("onnx"):
            out.append(f"`{v}`: {m['note']}")
    for v, m in s.get("smooth_models", {}).items():
        if not m.get("network"):
            out.append(f"`{v}` (smooth): {m['note']}")
    if s["conflicts"]:
        out.append(f"**Verifiers disagree** (one proved, another falsified) on: {', '.join(s['conflicts'])}.")
    return "\n\n".join(out)
