"""What the staircase hull's lines (`ops.Rounding.hull_lines`, issue 41 item 1) change on a run's int8 properties: the
margin bound of every int8 property of `RUN/verify` by CROWN, by α-CROWN with the ReLU slopes alone optimized (the
stage's default) and by α-CROWN with the grid roundings' lines optimized too (`Bounder.OPTIMIZE_ROUNDING`), the same
box and graph, one process, 30 steps each. Deterministic (no budget, no search): the margin bounds, how many are > 0,
and how many grid rounding units had free slopes (`Rounding.slope_range`, at most `FREE_CORNERS` corners).

    python -m benchmarks.int8_hull RUN [RUN ...] [--limit N] [--out benchmarks/int8-results/hull.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np
import torch


def margins(run: Path, limit: int = 0) -> dict:
    from analysis.robustness.properties import is_int8
    from analysis.verification.bounds import Bounder, Spec
    from analysis.verification.nonlinear import OutOfDomain
    from analysis.verification.ops import Rounding
    from analysis.verification.readers import from_onnx
    from analysis.verification.vnnlib import read_vnnlib_all

    out = run / "verify"
    rows = [r for r in csv.DictReader(open(out / "details.csv")) if is_int8(r["variant"])]
    rows = rows[:limit] if limit else rows
    nets: dict[str, object] = {}
    res = []
    for r in rows:
        if r["variant"] not in nets:
            nets[r["variant"]] = from_onnx(out / "onnx" / f"{r['variant']}.onnx")
        net = nets[r["variant"]]
        spec = read_vnnlib_all(out / r["vnnlib"])[0]
        row = {"variant": r["variant"], "sample": int(r["sample"]), "eps": float(r["eps"]), "stage_result": r["result"]}
        C, owner = Spec.from_disjuncts(spec.disjuncts, "cpu")
        orig = Bounder.OPTIMIZE_ROUNDING

        def best_of(low):
            best = [-np.inf] * len(spec.disjuncts)
            for v, j in zip(low.tolist(), owner):
                best[j] = max(best[j], v)
            return float(min(best))

        try:
            for name in ("relu", "hull"):
                Bounder.OPTIMIZE_ROUNDING = name == "hull"
                t0 = time.perf_counter()
                b = Bounder(net, spec.lb, spec.ub)
                b.crown()
                if name == "relu":
                    row["crown"] = best_of(b.spec_bounds(C))
                row[name] = best_of(b.alpha_spec(C, owner, 30, 0.1))
                row[f"{name}_seconds"] = round(time.perf_counter() - t0, 2)
                if name == "hull":
                    free = grid = 0
                    for s, k in enumerate(b.sites):
                        op = b.net.nodes[k].op
                        if isinstance(op, Rounding) and op.step is not None:
                            (lo_a, lo_b), (up_a, up_b) = op.slope_range(*b.pre[s])
                            free += int(((lo_b > lo_a) | (up_b > up_a)).sum())
                            grid += lo_a.numel()
                    row["free_units"], row["grid_units"] = free, grid
        except OutOfDomain as e:
            row["note"] = str(e).splitlines()[0]
            row.setdefault("relu", None)
            row.setdefault("hull", None)
        finally:
            Bounder.OPTIMIZE_ROUNDING = orig
        res.append(row)
        print(f"{row['variant']} sample {row['sample']} eps {row['eps']}: CROWN {row.get('crown')}, "
              f"α-CROWN {row['relu']} -> {row['hull']} "
              f"({row.get('free_units', 0)}/{row.get('grid_units', 0)} units with free slopes)", flush=True)

    def pos(key):
        return sum(1 for r in res if r[key] is not None and r[key] > 0)

    raised = [r["hull"] - r["relu"] for r in res if r["hull"] is not None and r["relu"] is not None]
    return {"run": str(run), "properties": len(res), "decided_crown": pos("crown"), "decided_alpha_relu": pos("relu"),
            "decided_alpha_hull": pos("hull"),
            "margin_raised": f"{sum(d > 1e-9 for d in raised)}/{len(raised)}",
            "raise_median": float(np.median(raised)) if raised else None,
            "raise_max": float(max(raised)) if raised else None,
            "lowered": sum(d < -1e-9 for d in raised), "rows": res}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--limit", type=int, default=0, help="the first N int8 properties of each run (0: all)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/int8-results/hull.json"))
    a = p.parse_args()
    torch.set_num_threads(1)
    allres = [margins(r, a.limit) for r in a.runs]
    for r in allres:
        print(json.dumps({k: v for k, v in r.items() if k != "rows"}))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(allres, indent=1) + "\n")


if __name__ == "__main__":
    main()
