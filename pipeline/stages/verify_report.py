"""The verify stage's section of report.md (`report_section`, read from ``verify/summary.json``): the certified
fraction per network and ε, how the swapped ReLU networks were decided, the figure of certified, falsified and open
fractions per network kind, and the chain per property.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analysis.robustness.chain import fractions
from analysis.robustness.properties import ROUTES, is_int8
from analysis.verification.bounds import unbounded_below
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


def _first_pass_lines(s: dict[str, Any]) -> list[str]:
    """What one bound pass of each network cost (measured on its first property), and the stage's line when a budget
    could not cover one pass per property."""
    out = []
    for part, rec in (s.get("first_pass") or {}).items():
        costs = ", ".join(f"{name} {'≥ ' if not c['finished'] else ''}{c['seconds']:.3g} s"
                          for name, c in rec["costs"].items())
        if not costs:
            continue
        what = "int8 models" if part == "int8" else "float networks"
        line = (f"One bound pass (CROWN) per {what[:-1]}, measured on its first property: {costs}; estimated "
                f"{rec['needed_s']:.1f} s for every property's pass against `{rec['setting']}` = {rec['budget_s']:g} s.")
        if not rec["covered"]:
            line += (f" **The budget did not cover it**: `{rec['setting']}` = {rec['would_s']} would (the stage said so "
                     "in its log); the properties left without a finished pass say `budget` below.")
        out.append(line)
    return out


def _margin(value: Any) -> str:
    """A margin bound as the table shows it: "—" when none finished, "−∞" when it has no finite bound (an unknown
    unit's ±`bounds.UNKNOWN`, e.g. an int8 LayerNorm's float32 error; details.csv's message says which)."""
    if value in ("", None):
        return "—"
    return "−∞" if unbounded_below(value) else f"{float(value):.3g}"


def _open_section(rows: Sequence[dict[str, Any]]) -> str:
    """Each open property's reason and best margin bound, grouped per model, network and ε."""
    if not rows:
        return "Open properties: none: every property was decided."
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["network"], r["eps"]), []).append(r)
    body = []
    for (model, network, eps), sel in groups.items():
        reasons: dict[str, int] = {}
        for r in sel:
            reasons[r["reason"] or r["result"]] = reasons.get(r["reason"] or r["result"], 0) + 1
        margins = ", ".join(f"{r['sample']}: " + _margin(r["margin_lb"]) + (f" ({r['bound']})" if r.get("bound") else "")
                            for r in sorted(sel, key=lambda r: r["sample"]))
        body.append([model, network, f"{eps:g}", len(sel), ", ".join(f"{k} {n}" for k, n in reasons.items()), margins])
    return ("Open properties, why, and the best margin bound found per sample (> 0 would prove it; in brackets the "
            "last bound pass that finished, or `bab`: branch and bound's global lower bound over the domains it left open, "
            "where that is higher; −∞: no finite bound, details.csv's message says why): `budget` = no bound "
            "pass finished in the time the property had, "
            "`timeout` = the search after its bounds ran out, `unknown` = an incomplete method ended undecided, "
            "`tie` = the model gives two top logits exactly equal at a point of the box (no certificate exists; a "
            "counterexample must be strict, and the search for one had the property's time). "
            "Per property in `verify/details.csv` (`reason`, `bound`, `margin_lb`) and `verify/smooth.csv`.\n\n"
            + table(["model", "network", "ε", "open", "why", "margin bound per sample"], body))


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
    missing = s.get("not_verified") or {}
    out = ["## Verification (L∞ local robustness)"]
    if missing:  # first, before any table: what was not verified at all
        out.append("**Not verified** (no property of these networks was checked):\n\n"
                   + "\n".join(f"- `{m}`: {why}" for m, why in missing.items()))
    smooth_dec = s["decided"].get("smooth") if "smooth_routes" in s["decided"] else None
    also = (f", {smooth_dec['decided']} of {smooth_dec['properties']} smooth ones (either route)"
            if smooth_dec and smooth_dec["properties"] else "")
    out += [f"Properties: {s['sample_selection']}; the true class's logit beats every other on the L∞ box of radius ε "
           f"clipped to the input range {s['input_range']} (ε in {s['eps_units']}). Time: one budget of {s['budget_s']:g} s "
           f"for the float networks, shared by their properties: first one bound pass for every property (CROWN, the "
           f"properties of a network batched, then α-CROWN where there is time), then what is still open, nearest to a "
           f"decision first (the attack a probe with a small share of each turn, then branch and bound; easy ones "
           f"first, what they leave to the hard ones{cap}; {clock} seconds per property, {s['jobs']} worker "
           f"process(es)); solving took {s['solve_seconds']:.1f} s. Decided: {dec['decided']} of {dec['properties']} "
           f"float ReLU properties{also}. Certified = unsat (proved); falsified = sat (a counterexample, re-checked in "
           f"float32 on the network itself; a sample the network already misclassifies counts as falsified)."]
    out += _first_pass_lines(s)
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
                 "every requantization (`analysis/verification/readers/qdq.py`): clamp(x, lo, hi) = hi − ReLU(hi − lo − "
                 "ReLU(x − lo)), two ReLUs per requantized unit (the ReLU the quantizer absorbed is the lower end), the "
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
    if s.get("open") is not None:
        out.append(_open_section(s["open"]))
    if s.get("chain"):
        crow = [[c["variant"], c["sample"], c["eps"], c["smooth_direct"], c["smooth_via_relu"], c["relu"], c["int8"],
                 c["carries_over"]] for c in s["chain"]]
        out.append("The chain, per property (`verify/chain.csv`): what is proven about each network, from the smooth one "
                   "the user trained to the int8 model that ships (unsat = proven robust, sat = a re-checked counterexample):"
                   "\n\n" + table(["variant", "sample", "ε", "smooth (direct)", "smooth (via swap)", "float ReLU", "int8",
                                    "what carries over"], crow))
    if "not_verified" not in s:  # written before the stage listed them at the top
        for v, m in s["models"].items():
            if not m.get("onnx"):
                out.append(f"`{v}`: {m['note']}")
        for v, m in s.get("smooth_models", {}).items():
            if not m.get("network"):
                out.append(f"`{v}` (smooth): {m['note']}")
    if s["conflicts"]:
        out.append(f"**Verifiers disagree** (one proved, another falsified) on: {', '.join(s['conflicts'])}.")
    return "\n\n".join(out)
