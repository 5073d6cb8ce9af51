"""The verify stage's answers on run directories, cross-checked outside the verifier (issue 35's measurements):

- per model (the stage's categories: each variant's float ReLU network and its `-int8` model): properties, answers,
  the share decided (sat or unsat), and the margin bound of each open one (details.csv);
- every sat: its witness (verify/counterexamples/) re-run in onnxruntime on its float32 input: inside the box, and
  strictly in the unsafe set (max over the disjunct's rows of A·y − b < 0 for some disjunct);
- every unsat: attacked through onnxruntime at random points and corners of the box: a point in the unsafe set would
  be a wrong answer;
- every smooth network's unsat (either route, smooth.csv): the same attack on the smooth model's float32 ONNX
  (export/<variant>/smooth/model.onnx, the export stage's file of train/<variant>/best.pt) over the same box;
- every open property: why (details.csv's `reason`: budget, timeout, unknown, error) and its margin bound.

    python -m benchmarks.verify_check runs/cnn runs/preact runs/deit --out benchmarks/verify-results/builtin.json
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from analysis.verification.vnnlib import parse_witness, read_vnnlib
from quantize import ort as ort_util

ATTACK_POINTS = 3000  # uniform points per unsat property, plus as many corners


def _run(sess, x: np.ndarray) -> np.ndarray:
    """Flat inputs [N, n] through a session; one at a time when the file fixes its batch at 1 (the verifier's export)."""
    meta = sess.get_inputs()[0]
    dims = [d if isinstance(d, int) and d > 0 else -1 for d in meta.shape]
    if dims and dims[0] == 1:
        return np.concatenate([sess.run(None, {meta.name: xi.reshape(dims).astype(np.float32)})[0].reshape(1, -1)
                               for xi in x]).astype(np.float64)
    dims[0] = -1
    return sess.run(None, {meta.name: x.reshape([len(x)] + dims[1:]).astype(np.float32)})[0].astype(np.float64)


def _attack_points(spec, rng: np.random.Generator) -> np.ndarray:
    """ATTACK_POINTS uniform points of the box and as many random corners."""
    return np.concatenate([rng.uniform(spec.lb, spec.ub, (ATTACK_POINTS, spec.lb.size)),
                           np.where(rng.random((ATTACK_POINTS, spec.lb.size)) < 0.5, spec.lb, spec.ub)])


def check_run(run: Path, seed: int = 0) -> dict:
    verify = run / "verify"
    summary = json.loads((verify / "summary.json").read_text())
    first = summary["verifiers"][0]  # the verifier results.csv is written for
    # a float model's rows and its int8 model's share their property files: a row is its category's and its file's
    details = {(r["variant"], r["vnnlib"]): r for r in csv.DictReader(open(verify / "details.csv")) if r["verifier"] == first}
    rows = list(csv.reader(open(verify / "results.csv")))
    rng = np.random.default_rng(seed)
    models: dict[str, dict] = {}
    sessions: dict[str, object] = {}
    for category, onnx, vnnlib, _prep, result, seconds in rows:
        m = models.setdefault(category, {"onnx": onnx, "properties": 0, "counts": {}, "seconds": 0.0, "open_margins": {},
                                         "witnesses_checked": 0, "witnesses_strict": 0, "unsat_attacked": 0,
                                         "wrong": []})
        m["properties"] += 1
        m["counts"][result] = m["counts"].get(result, 0) + 1
        m["seconds"] += float(seconds)
        if onnx not in sessions:
            sessions[onnx] = ort_util.session(verify / onnx)
        sess = sessions[onnx]
        spec = read_vnnlib(verify / vnnlib)
        if result == "sat":
            witness = verify / "counterexamples" / f"{category}__{Path(vnnlib).stem}.counterexample"
            x, _ = parse_witness(witness.read_text())
            y = _run(sess, x[None])[0]
            inside = spec.in_box(x.astype(np.float32).astype(np.float64))
            m["witnesses_checked"] += 1
            if inside and spec.violation(y) < 0:
                m["witnesses_strict"] += 1
            else:
                m["wrong"].append(f"{vnnlib}: witness {'outside the box' if not inside else 'not strictly unsafe'}")
        elif result == "unsat":
            v = spec.violations(_run(sess, _attack_points(spec, rng)))
            m["unsat_attacked"] += 1
            if np.any(v <= 0):
                m["wrong"].append(f"{vnnlib}: unsat, but onnxruntime finds an unsafe point")
        else:
            d = details.get((category, vnnlib), {})
            margin = d.get("margin_lb", "")
            m["open_margins"][Path(vnnlib).stem] = float(margin) if margin not in ("", None) else None
            why = d.get("reason") or result
            m.setdefault("open_reasons", {})[why] = m.setdefault("open_reasons", {}).get(why, 0) + 1
    for m in models.values():
        decided = m["counts"].get("sat", 0) + m["counts"].get("unsat", 0)
        m["decided"] = decided
        m["decided_fraction"] = round(decided / max(m["properties"], 1), 3)
        m["seconds"] = round(m["seconds"], 1)
    notes = {k: v.get("note") for k, v in summary.get("models", {}).items() if v.get("note")}
    return {"run": str(run), "models": models, "smooth": check_smooth(run, rng), "not_verified": notes,
            "epsilons": summary.get("epsilons"), "samples": summary.get("samples")}


def check_smooth(run: Path, rng: np.random.Generator) -> dict:
    """The smooth networks' unsats (either route), attacked in onnxruntime on the export stage's smooth ONNX; the open
    ones' reasons."""
    verify = run / "verify"
    path = verify / "smooth.csv"
    if not path.is_file():
        return {}
    rows = list(csv.DictReader(open(path)))
    out: dict[str, dict] = {}
    sessions: dict[str, object] = {}
    by_prop: dict[tuple, list[dict]] = {}
    for r in rows:
        by_prop.setdefault((r["variant"], r["sample"], r["eps"]), []).append(r)
    for (variant, sample, eps), sel in by_prop.items():
        m = out.setdefault(variant, {"properties": 0, "decided": 0, "unsat_attacked": 0, "open_reasons": {}, "wrong": []})
        m["properties"] += 1
        results = {r["route"]: r["result"] for r in sel}
        if not any(v in ("sat", "unsat") for v in results.values()):
            for r in sel:
                why = f"{r['route']}: {r.get('reason') or r['result']}"
                m["open_reasons"][why] = m["open_reasons"].get(why, 0) + 1
            continue
        m["decided"] += 1
        if "unsat" not in results.values():
            continue
        onnx = run / "export" / variant / "smooth" / "model.onnx"
        if not onnx.is_file():
            m["wrong"].append(f"{variant}: no smooth ONNX to attack ({onnx})")
            continue
        if variant not in sessions:
            sessions[variant] = ort_util.session(onnx)
        spec = read_vnnlib(verify / "vnnlib" / f"{variant}_{sample}_{eps}.vnnlib")
        v = spec.violations(_run(sessions[variant], _attack_points(spec, rng)))
        m["unsat_attacked"] += 1
        if np.any(v <= 0):
            m["wrong"].append(f"{variant}_{sample}_{eps}: smooth unsat ({results}), but onnxruntime finds an unsafe point "
                              f"(margin {float(v.min()):.3g})")
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    out = {str(r): check_run(r) for r in a.runs}
    for run, res in out.items():
        print(f"== {run} (ε {res['epsilons']}, {res['samples']} samples)")
        for name, m in res["models"].items():
            opn = {k: (round(v, 3) if v is not None else None) for k, v in m["open_margins"].items()}
            print(f"  {name:22s} {m['properties']:3d} properties {m['counts']} decided {m['decided_fraction']:.0%} "
                  f"witnesses strict {m['witnesses_strict']}/{m['witnesses_checked']} unsat attacked {m['unsat_attacked']} "
                  f"wrong {len(m['wrong'])}" + (f"; open {m.get('open_reasons')}, margins {opn}" if opn else ""))
        for name, m in res.get("smooth", {}).items():
            print(f"  {name + ' (smooth)':22s} {m['properties']:3d} properties decided {m['decided']} (either route) "
                  f"unsat attacked {m['unsat_attacked']} wrong {len(m['wrong'])}; open {m['open_reasons']}")
        for name, note in res["not_verified"].items():
            print(f"  {name:22s} {note}")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
