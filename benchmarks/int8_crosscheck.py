"""Cross-check the verify stage's int8 answers on a run: every int8 unsat property attacked with many restarts on the
float surrogate and by dense random sampling, every candidate run through onnxruntime on the int8 model itself; every
int8 sat witness re-run there. A wrong unsat would show as a misclassified point; none may appear. The properties
left open (timeouts) get the same attack: a point found there is a counterexample the verifier missed (not a wrong
answer), none found says the open ones are likely robust and undecided only for the bounds' sake.

    python -m benchmarks.int8_crosscheck RUN_DIR [--restarts 50] [--samples 4000] [--out benchmarks/int8-results/crosscheck.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np

from analysis.verification import attack
from analysis.verification.problem import float32_in_box
from analysis.verification.readers import from_onnx
from analysis.verification.vnnlib import read_vnnlib_all
from analysis.robustness.properties import is_int8
from quantize import ort as ort_util


def crosscheck(run: Path, restarts: int, samples: int, seed: int = 0) -> dict:
    out = run / "verify"
    rows = [r for r in csv.DictReader(open(out / "details.csv")) if is_int8(r["variant"])]
    rng = np.random.default_rng(seed)
    nets, sessions = {}, {}
    checked = {"unsat": 0, "sat": 0, "open": 0}
    wrong: list[str] = []
    open_falsified: list[str] = []
    t0 = time.perf_counter()
    for r in rows:
        if r["result"] not in ("unsat", "sat", "timeout", "unknown"):
            continue
        onnx_path = out / "onnx" / f"{r['variant']}.onnx"
        if r["variant"] not in nets:
            nets[r["variant"]], sessions[r["variant"]] = from_onnx(onnx_path), ort_util.session(onnx_path)
        net, sess = nets[r["variant"]], sessions[r["variant"]]
        spec = read_vnnlib_all(out / r["vnnlib"])[0]
        name = f"{r['variant']} sample {r['sample']} eps {r['eps']}"
        if r["result"] == "sat":
            text = (out / r["witness"]).read_text() if r["witness"] else ""
            xs = [float(t.split()[1].rstrip(")")) for t in text.replace("(", "\n(").splitlines() if t.startswith("(X_")]
            y = ort_util.forward_flat(sess, np.asarray(xs, dtype=np.float32).astype(np.float64))
            inside = bool(np.all(np.asarray(xs) >= spec.lb) and np.all(np.asarray(xs) <= spec.ub))
            if not (inside and spec.violation(y) < 0):
                wrong.append(f"{name}: the sat witness does not reproduce in onnxruntime")
            checked["sat"] += 1
            continue
        pts = [float32_in_box(rng.uniform(spec.lb, spec.ub), spec.lb, spec.ub) for _ in range(samples)]
        x, _v = attack.pgd(net, spec, steps=60, restarts=restarts, margin=0.0, seed=int(rng.integers(1 << 30)))
        if x is not None:
            pts.append(float32_in_box(x, spec.lb, spec.ub))
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in sess.get_inputs()[0].shape][1:]
        ys = ort_util.infer(sess, np.asarray(pts, dtype=np.float32).reshape(len(pts), *shape)).reshape(len(pts), -1)
        found = bool(spec.violations(ys).min() < 0)
        if r["result"] == "unsat":
            checked["unsat"] += 1
            if found:
                wrong.append(f"{name}: unsat, but onnxruntime misclassifies a point of the box")
        else:
            checked["open"] += 1
            if found:
                open_falsified.append(f"{name}: left {r['result']}, onnxruntime misclassifies a point of the box")
    return {"run": str(run), "restarts": restarts, "samples_per_property": samples, "checked": checked,
            "wrong": wrong, "open_falsified": open_falsified, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--restarts", type=int, default=50)
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/int8-results/crosscheck.json"))
    a = ap.parse_args()
    res = crosscheck(a.run, a.restarts, a.samples)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
