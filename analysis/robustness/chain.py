"""What the verify stage's answers say together, per property: the chain from the smooth network the user trained
(both routes) through the float ReLU network to the int8 model that ships, and what carries over (`chain_rows`,
written to ``verify/chain.csv``); properties that one verifier proved and another falsified (`conflicts`); the
certified, falsified and open fractions per network kind (`fractions`, the report's figure).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analysis.verification.vnnlib import format_real

from .properties import int8_name, is_int8, property_name


CHAIN_FIELDS = ["variant", "sample", "eps", "smooth_direct", "smooth_via_relu", "relu", "int8", "carries_over"]


def chain_rows(variants: Sequence[str], relu_rows: list[dict[str, Any]], smooth_rows: list[dict[str, Any]],
               verifier: str) -> list[dict[str, Any]]:
    """Per variant, sample and ε: what is proven about each network of the chain (smooth by both routes, the float
    ReLU network, the int8 model) and one sentence on what carries over."""
    res = {(r["variant"], int(r["sample"]), format_real(float(r["eps"]))): r["result"] or "—" for r in relu_rows
           if r["verifier"] == verifier}
    smo = {(r["variant"], int(r["sample"]), format_real(float(r["eps"])), r["route"]): r["result"] or "—" for r in smooth_rows}
    keys = sorted({(v, s, e) for (v, s, e) in res if not is_int8(v)} | {(v, s, e) for (v, s, e, _) in smo},
                  key=lambda t: (list(variants).index(t[0]) if t[0] in variants else len(variants), float(t[2]), t[1]))
    out = []
    for v, smp, e in keys:
        row = {"variant": v, "sample": smp, "eps": e, "smooth_direct": smo.get((v, smp, e, "direct"), "—"),
               "smooth_via_relu": smo.get((v, smp, e, "via-relu"), "—"), "relu": res.get((v, smp, e), "—"),
               "int8": res.get((int8_name(v), smp, e), "—")}
        row["carries_over"] = _carries(row)
        out.append(row)
    return out


def _carries(r: dict[str, Any]) -> str:
    smooth = "unsat" in (r["smooth_direct"], r["smooth_via_relu"])
    relu, q = r["relu"], r["int8"]
    if q == "unsat":
        head = "proven for the int8 model itself"
        rest = "and for every float network before it" if smooth and relu == "unsat" else (
            "and for the float ReLU network" if relu == "unsat" else
            "while the float ReLU network is falsified: quantization changed the answer" if relu == "sat" else
            "while the float ReLU network is undecided")
        return f"{head}, {rest}"
    if q == "sat":
        if relu == "unsat":
            return "the float ReLU proof does not carry over: the int8 model misclassifies a point of the box (witness re-checked in onnxruntime)"
        return "falsified for the int8 model (witness re-checked in onnxruntime)" + (
            ", and for the float ReLU network" if relu == "sat" else "")
    if relu == "unsat":
        return "proven for the float ReLU network" + (" and the smooth one" if smooth else "") + \
            "; not carried to int8 (its bound through the rounding did not close, or no int8 model was verified)"
    if smooth:
        return "proven for the smooth network only"
    return "nothing proven" if relu != "sat" else "falsified for the float ReLU network"


def conflicts(rows: list[dict[str, Any]]) -> list[str]:
    """Properties that one verifier proved and another falsified (there should be none)."""
    seen: dict[tuple, set[str]] = {}
    for r in rows:
        seen.setdefault((r["variant"], int(r["sample"]), format_real(float(r["eps"]))), set()).add(r["result"])
    return [property_name(v, s, float(e)) for (v, s, e), st in seen.items() if {"sat", "unsat"} <= st]


def fractions(chain: Sequence[dict[str, Any]]) -> dict[tuple[str, str, float], dict[str, float]]:
    """(network kind, variant, ε) -> the fraction of its properties certified, falsified and open, from the chain rows
    (one per property; "—" where a network has no answer: left out). The smooth network: certified when either route
    proved the property, falsified when one found a counterexample (no route proves what another falsified)."""
    counts: dict[tuple[str, str, float], dict[str, int]] = {}
    for c in chain:
        smooth = [c["smooth_direct"], c["smooth_via_relu"]]
        answers = {"relu": c["relu"], "int8": c["int8"],
                   "smooth": "unsat" if "unsat" in smooth else "sat" if "sat" in smooth else
                             ("—" if all(v == "—" for v in smooth) else "open")}
        for kind, res in answers.items():
            if res in ("—", "", None):
                continue
            n = counts.setdefault((kind, c["variant"], float(c["eps"])), {"certified": 0, "falsified": 0, "open": 0})
            n["certified" if res == "unsat" else "falsified" if res == "sat" else "open"] += 1
    return {k: {o: v / sum(n.values()) for o, v in n.items()} for k, n in counts.items()}
