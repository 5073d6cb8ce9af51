"""What the verify stage's answers say together, per property: the chain from the smooth network the user trained
(both routes) through the float ReLU network to the int8 model that ships, and what carries over (`chain_rows`,
written to ``verify/chain.csv``); properties that one verifier proved and another falsified (`conflicts`); the
certified, falsified and open fractions per network kind (`fractions`, the report's figure).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analysis.verification.bounds import unbounded_below
from analysis.verification.vnnlib import format_real

from .properties import int8_name, is_int8, property_name


CHAIN_FIELDS = ["variant", "sample", "eps", "smooth_direct", "smooth_via_relu", "relu", "int8", "carries_over"]


def chain_rows(variants: Sequence[str], relu_rows: list[dict[str, Any]], smooth_rows: list[dict[str, Any]],
               verifier: str) -> list[dict[str, Any]]:
    """Per variant, sample and ε: what is proven about each network of the chain (smooth by both routes, the float
    ReLU network, the int8 model) and one sentence on what carries over: where a float ReLU proof does not reach the
    int8 model, why, with both margin bounds from the rows (details.csv's `reason` and `margin_lb`)."""
    rows = {(r["variant"], int(r["sample"]), format_real(float(r["eps"]))): r for r in relu_rows
            if r["verifier"] == verifier}
    res = {k: r["result"] or "—" for k, r in rows.items()}
    smo = {(r["variant"], int(r["sample"]), format_real(float(r["eps"])), r["route"]): r["result"] or "—" for r in smooth_rows}
    keys = sorted({(v, s, e) for (v, s, e) in res if not is_int8(v)} | {(v, s, e) for (v, s, e, _) in smo},
                  key=lambda t: (list(variants).index(t[0]) if t[0] in variants else len(variants), float(t[2]), t[1]))
    out = []
    for v, smp, e in keys:
        row = {"variant": v, "sample": smp, "eps": e, "smooth_direct": smo.get((v, smp, e, "direct"), "—"),
               "smooth_via_relu": smo.get((v, smp, e, "via-relu"), "—"), "relu": res.get((v, smp, e), "—"),
               "int8": res.get((int8_name(v), smp, e), "—")}
        row["carries_over"] = _carries(row, rows.get((v, smp, e)), rows.get((int8_name(v), smp, e)))
        out.append(row)
    return out


def _bound(row: dict[str, Any] | None) -> float | None:
    """A row's best margin bound: None when no bound pass finished; -inf when it has no finite bound."""
    if not row or row.get("margin_lb") in ("", None):
        return None
    m = float(row["margin_lb"])
    return -float("inf") if unbounded_below(m) else m


def _not_carried(relu: dict[str, Any] | None, q: dict[str, Any] | None) -> str:
    """Why a float ReLU proof stops short of the int8 model, from the int8 row's reason and both margin bounds."""
    if q is None or (q["result"] or "—") == "—":
        return "no int8 model was verified"
    if q.get("reason") == "tie":
        return ("not carried to int8: two of its logits tie exactly at a point of the box, so no proof exists, and no "
                "strict counterexample was found")
    mq, mr = _bound(q), _bound(relu)
    if q.get("reason") == "budget" or mq is None:
        return "not carried to int8: no bound pass on it finished in its budget (`verify.int8_budget_s`)"
    if mq == -float("inf"):
        return "not carried to int8: its margin has no finite bound through the rounding (details.csv's message says why)"
    # a float proof by branch and bound keeps its root pass's negative bound in the row: no number to set beside
    float_m = (f" against the float ReLU network's {mr:.3g}" if mr is not None and mr > 0 else
               ", where the float ReLU network's proof needed branch and bound" if relu and relu.get("stage") == "bab" else "")
    return f"not carried to int8: its best margin bound through the rounding is {mq:.3g}{float_m}"


def _carries(r: dict[str, Any], relu_row: dict[str, Any] | None, int8_row: dict[str, Any] | None) -> str:
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
        return ("proven for the float ReLU network" + (" and the smooth one" if smooth else "") + "; "
                + _not_carried(relu_row, int8_row))
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


def not_verified(models: dict[str, Any], smooth_models: dict[str, Any]) -> dict[str, str]:
    """{model: why} for every network this stage did not verify: a variant whose swap left it smooth, a ReLU or int8
    graph the engine does not read (the reader's own words: the node, what it met, the fix), a smooth network not
    certified; the smooth ones as `<variant> (smooth)`."""
    out = {name: m["note"].removeprefix("not verified: ") for name, m in models.items() if not m.get("onnx")}
    out.update({f"{name} (smooth)": m["note"].removeprefix("not certified: ")
                for name, m in smooth_models.items() if not m.get("network")})
    return out


def open_rows(relu_rows: Sequence[dict[str, Any]], smooth_rows: Sequence[dict[str, Any]], verifier: str
              ) -> list[dict[str, Any]]:
    """Every open property (the first verifier's rows; a smooth property only when neither route decided it, once per
    route): its network, why it is open and the best margin bound found (> 0 would have proved it)."""
    out = []
    for r in relu_rows:
        if r["verifier"] == verifier and r["result"] not in ("sat", "unsat"):
            out.append({"model": r["variant"], "network": "int8" if is_int8(r["variant"]) else "float ReLU",
                        "sample": int(r["sample"]), "eps": float(r["eps"]), "result": r["result"],
                        "reason": r.get("reason", ""), "bound": r.get("bound", ""), "margin_lb": r.get("margin_lb", "")})
    decided = {(r["variant"], r["sample"], r["eps"]) for r in smooth_rows if r["result"] in ("sat", "unsat")}
    for r in smooth_rows:
        if (r["variant"], r["sample"], r["eps"]) not in decided:
            out.append({"model": r["variant"], "network": f"smooth ({r['route']})", "sample": int(r["sample"]),
                        "eps": float(r["eps"]), "result": r["result"], "reason": r.get("reason", ""),
                        "bound": r.get("bound", ""), "margin_lb": r.get("margin_lb", "")})
    return out


def either_route(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per smooth property (variant, sample, ε): decided when either route decided it."""
    out: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = (r["variant"], r["sample"], r["eps"])
        if key not in out or r["result"] in ("sat", "unsat"):
            out[key] = r
    return list(out.values())


def decided(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    d = sum(r["result"] in ("sat", "unsat") for r in rows)
    return {"properties": len(rows), "decided": d, "fraction": d / len(rows) if rows else None}
