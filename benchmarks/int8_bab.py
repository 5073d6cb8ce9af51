"""Grid splits in branch and bound (issue 41 item 1, `bab.Settings.grid_values`) side by side with ReLU splits alone: the
int8 properties a run's verify stage left open, each through the stage's chain ("auto": CROWN, the attack, α-CROWN,
branch and bound) with the same per-property limit, once per setting, one process. Per property and setting: the
answer, the seconds, the domains branch and bound bounded and its global lower bound (the least lower bound over the
domains left open; the message's number).

    python -m benchmarks.int8_bab RUN [RUN ...] [--timeout 10] [--grid 0 4 4:2] [--all] [--only VARIANT:SAMPLE:EPS ...]
        [--out benchmarks/int8-results/bab.json]

`--decompose`: instead, for each of those properties, where CROWN's margin bound loses to the roundings, by how many
grid indices a unit may take: for the worst row, each grid rounding unit's coefficient |A| times its used line's
distance from the identity (y = x) at its interval's middle (the first-order cost of its noise), summed per bucket of
index counts. Deterministic (no budget).

`--ties`: instead, for each of those properties, onnxruntime on `TIE_ROUNDS` batches of 2000 inputs from the box's
float32 corners (the first half of each batch, after the first, 5% of the pixels flipped from the worst point so far): how
many give the label's logit exactly equal to the largest other one (a tie: the property's unsafe set is reached, so
no certificate exists) and how many strictly below (a counterexample), and the least margin. Seeded.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import re
import time
from pathlib import Path


def _properties(runs: list[Path], everything: bool, only: list[str] = ()):
    """(run, its verify folder, details.csv row) of each int8 property the runs' verify stages left open (all with
    `everything`; those named VARIANT:SAMPLE:EPS in `only`, when given)."""
    from analysis.robustness.properties import is_int8

    for r in runs:
        out = r / "verify"
        rows = [x for x in csv.DictReader(open(out / "details.csv")) if is_int8(x["variant"]) and x["stage"] != "clean"]
        if not everything:
            rows = [x for x in rows if x["result"] not in ("sat", "unsat")]
        if only:
            rows = [x for x in rows if f"{x['variant']}:{x['sample']}:{x['eps']}" in only]
        for x in rows:
            yield r, out, x


def run(runs: list[Path], timeout: float, grids: list[str], everything: bool, only: list[str]) -> list[dict]:
    from analysis.verification import bab
    from analysis.verification.registry import get_verifier

    original = bab.bab
    res = []
    for r, out, x in _properties(runs, everything, only):
        row = {"run": r.name, "variant": x["variant"], "sample": int(x["sample"]), "eps": float(x["eps"]),
               "stage_result": x["result"]}
        for g in grids:
            seen: dict = {}

            values, _, cands = g.partition(":")

            def with_grid(b, spec, disjuncts, expired, left, settings=None, *a, _v=int(values), _c=int(cands or 0),
                          _seen=seen, **k):
                out = original(b, spec, disjuncts, expired, left, dataclasses.replace(
                    settings or bab.Settings(), grid_values=_v, grid_candidates=_c), *a, **k)
                _seen.update(out[3])
                return out

            bab.bab = with_grid
            try:
                t0 = time.perf_counter()
                ans = get_verifier("auto").verify(out / "onnx" / f"{x['variant']}.onnx", out / x["vnnlib"], timeout_s=timeout)
                row[f"grid{g}"] = ans.status
                row[f"grid{g}_seconds"] = round(time.perf_counter() - t0, 2)
                m = re.search(r"global lower bound (-?[0-9.e+-]+)", ans.message)
                row[f"grid{g}_global_lower"] = float(m.group(1)) if m else None
                for k in ("domains", "rounds", "leaf_lps", "grid_splits"):
                    row[f"grid{g}_{k}"] = seen.get(k)
                row[f"grid{g}_message"] = ans.message[-300:]
            finally:
                bab.bab = original
        res.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items() if "message" not in k), flush=True)
    return res


BUCKETS = ((1, 1), (2, 2), (3, 4), (5, 16), (17, 10**9))
TIE_ROUNDS = 60


def ties(runs: list[Path], everything: bool, only: list[str]) -> list[dict]:
    import numpy as np

    from analysis.verification.vnnlib import read_vnnlib_all
    from quantize import ort as ort_util

    res = []
    for r, out, x in _properties(runs, everything, only):
        spec = read_vnnlib_all(out / x["vnnlib"])[0]
        sess = ort_util.session(out / "onnx" / f"{x['variant']}.onnx")
        # the box's ends in float32, moved inward where rounding took them out (a witness must lie in the box)
        lb, ub, label = spec.lb.astype(np.float32), spec.ub.astype(np.float32), int(x["label"])
        lb = np.where(lb < spec.lb, np.nextafter(lb, np.float32(np.inf)), lb).astype(np.float32)
        ub = np.where(ub > spec.ub, np.nextafter(ub, np.float32(-np.inf)), ub).astype(np.float32)
        rng = np.random.default_rng(0)
        best, worst, tie, below, n = np.inf, None, 0, 0, 0
        for it in range(TIE_ROUNDS):
            pts = np.where(rng.random((2000, lb.size)) < 0.5, lb, ub).astype(np.float32)
            if worst is not None:
                flip = rng.random((1000, lb.size)) < 0.05
                pts[:1000] = np.where(flip, np.where(worst == lb, ub, lb), worst)
            shape = [d if isinstance(d, int) else -1 for d in sess.get_inputs()[0].shape]
            y = ort_util.infer(sess, pts.reshape(-1, *shape[1:]))
            m = y[:, label] - np.delete(y, label, axis=1).max(1)
            tie, below, n = tie + int((m == 0).sum()), below + int((m < 0).sum()), n + len(m)
            if m.min() < best:
                best, worst = float(m.min()), pts[int(np.argmin(m))].copy()
        row = {"run": r.name, "variant": x["variant"], "sample": int(x["sample"]), "eps": float(x["eps"]),
               "inputs": n, "ties": tie, "strictly_below": below, "least_margin": best}
        res.append(row)
        print(row, flush=True)
    return res


def decompose(runs: list[Path], everything: bool) -> list[dict]:
    import torch

    from analysis.verification.bounds import Bounder, Spec
    from analysis.verification.ops import Rounding
    from analysis.verification.readers import from_onnx
    from analysis.verification.vnnlib import read_vnnlib_all

    res = []
    for r, out, x in _properties(runs, everything, ()):
        spec = read_vnnlib_all(out / x["vnnlib"])[0]
        b = Bounder(from_onnx(out / "onnx" / f"{x['variant']}.onnx"), spec.lb, spec.ub)
        b.crown()
        C, _ = Spec.from_disjuncts(spec.disjuncts, "cpu")
        low = b.spec_bounds(C)
        w = int(torch.argmin(low))
        rec: dict = {}
        b.backward(C.C[w:w + 1], b.net.output, record=rec)
        loss = {f"{lo}-{hi}" if hi < 10**9 else f">{lo - 1}": 0.0 for lo, hi in BUCKETS}
        for s in range(len(b.sites)):
            op = b.op(s)
            if not (isinstance(op, Rounding) and op.step is not None):
                continue
            l, u = b.pre[s]
            klo, khi = op.k_range(l, u)
            n = khi - klo + 1
            al, bl, au, bu = b.relaxation(s)
            mid = (l + u) / 2
            A = rec[s][0]
            gap = torch.where(A > 0, mid - (al * mid + bl), (au * mid + bu) - mid).clamp(min=0)
            for (lo, hi), key in zip(BUCKETS, loss):
                loss[key] += float((A.abs() * gap)[(n >= lo) & (n <= hi)].sum())
        row = {"run": r.name, "variant": x["variant"], "sample": int(x["sample"]), "eps": float(x["eps"]),
               "crown_margin": float(low[w]), "loss_by_indices": {k: round(v, 4) for k, v in loss.items()}}
        res.append(row)
        print(row, flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--grid", nargs="+", default=["0", "4"],
                    help="per pass bab.Settings.grid_values[:grid_candidates] (0: ReLU splits only; candidates default 0)")
    ap.add_argument("--all", action="store_true", help="every int8 property, not only those the stage left open")
    ap.add_argument("--only", nargs="*", default=[], metavar="VARIANT:SAMPLE:EPS", help="these properties alone")
    ap.add_argument("--decompose", action="store_true", help="the margin's loss to the roundings by index count instead")
    ap.add_argument("--ties", action="store_true", help="exact ties and counterexamples among corner inputs instead")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/int8-results/bab.json"))
    a = ap.parse_args()
    if a.decompose or a.ties:
        res = decompose(a.runs, a.all) if a.decompose else ties(a.runs, a.all, a.only)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"properties": res}, indent=1))
        return
    res = run(a.runs, a.timeout, a.grid, a.all, a.only)
    summary = {f"grid{g}": {s: sum(r[f"grid{g}"] == s for r in res) for s in ("unsat", "sat", "timeout", "unknown")}
               for g in a.grid}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"timeout_s": a.timeout, "grids": a.grid, "summary": summary, "properties": res}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
