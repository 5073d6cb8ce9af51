"""What the rounding's hull lines (`ops.Rounding.lines`, issue 41 item 1) change on a run's int8 properties: CROWN's
margin bound of every int8 property of `RUN/verify` with the hull's steep facets and without them (the lines before:
per side x ± E or the snapped end), the same box and graph, one process. Deterministic (no budget, no search): the
margin bounds, how many of them are > 0 (decided by CROWN alone), and the grid rounding units whose lines took a
steep facet.

    python -m benchmarks.int8_hull RUN [RUN ...] [--out benchmarks/int8-results/hull.json]
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
        for name, steep_max in (("before", 0.0), ("hull", Rounding.STEEP_MAX)):
            saved = Rounding.STEEP_MAX
            Rounding.STEEP_MAX = steep_max  # 0: no steep facet is ever used (the lines before this change)
            try:
                t0 = time.perf_counter()
                b = Bounder(net, spec.lb, spec.ub)
                b.crown()
                C, owner = Spec.from_disjuncts(spec.disjuncts, b.device)
                low = b.spec_bounds(C)
                best = [-np.inf] * len(spec.disjuncts)
                for v, j in zip(low.tolist(), owner):
                    best[j] = max(best[j], v)
                row[name] = float(min(best))
                row[f"{name}_seconds"] = round(time.perf_counter() - t0, 2)
                if name == "hull":
                    steep = 0
                    for s, k in enumerate(b.sites):
                        op = b.net.nodes[k].op
                        if isinstance(op, Rounding) and op.step is not None:
                            al, _, au, _ = op.lines(*b.pre[s])
                            steep += int(((al > 1) | (au > 1)).sum())
                    row["steep_units"] = steep
                    row["grid_units"] = sum(b.pre[s][0].numel() for s, k in enumerate(b.sites)
                                            if isinstance(b.net.nodes[k].op, Rounding) and b.net.nodes[k].op.step is not None)
            except OutOfDomain as e:
                row[name] = None
                row[f"{name}_note"] = str(e).splitlines()[0]
            finally:
                Rounding.STEEP_MAX = saved
        res.append(row)
        print(f"{row['variant']} sample {row['sample']} eps {row['eps']}: margin {row['before']} -> {row['hull']} "
              f"({row.get('steep_units', 0)}/{row.get('grid_units', 0)} steep)", flush=True)

    def pos(key):
        return sum(1 for r in res if r[key] is not None and r[key] > 0)

    raised = [r["hull"] - r["before"] for r in res if r["hull"] is not None and r["before"] is not None]
    return {"run": str(run), "properties": len(res), "crown_decided_before": pos("before"), "crown_decided_hull": pos("hull"),
            "margin_raised": f"{sum(d > 1e-9 for d in raised)}/{len(raised)}",
            "raise_median": float(np.median(raised)) if raised else None, "raise_max": float(max(raised)) if raised else None,
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
