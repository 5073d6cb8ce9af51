"""How fine the activation grids must be for the bounds to close (issue 41; docs/architecture.md, "Sixteen-bit
activations"): CROWN's margin bound on each of a run's int8 properties with every grid rounding's step and error bound
scaled by f, as a grid of 8 − log2(f) bits over the same calibrated range would give (f = 1/4: 10 bits, 1/256: 16
bits). A diagnostic of the relaxation on a hypothetical model: the input's own quantization and the float32 terms are
left as they are, and no answer here certifies anything.

    python -m benchmarks.int8_grid_scale RUN [--factors 1 0.25 0.0625 0.015625 0.00390625] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def measure(run: Path, factors: list[float]) -> dict[str, list]:
    from analysis.verification import bounds, ops
    from analysis.verification.readers import from_onnx
    from analysis.verification.vnnlib import read_vnnlib_all

    out: dict[str, list] = {}
    for onnx_file in sorted((run / "verify" / "onnx").glob("*-int8.onnx")):
        variant = onnx_file.stem.removesuffix("-int8")
        net = from_onnx(onnx_file)
        grids = [(n.op, n.op.E.clone(), n.op.step.clone()) for n in net.nodes[1:]
                 if isinstance(n.op, ops.Rounding) and n.op.step is not None]
        props = sorted((run / "verify" / "vnnlib").glob(f"{variant}_*.vnnlib"))
        for f in factors:
            for op, E, s in grids:
                op.E, op.step = E * f, s * f
            margins: list = []
            for vn in props:
                spec = read_vnnlib_all(vn)[0]
                b = bounds.Bounder(net, spec.lb, spec.ub)
                rows, owner = bounds.Spec.from_disjuncts(spec.disjuncts, b.device)
                try:
                    b.crown()
                    best = [-np.inf] * len(spec.disjuncts)
                    for v, j in zip(b.spec_bounds(rows).tolist(), owner):
                        best[j] = max(best[j], v)
                    margins.append(round(min(best), 4))
                except Exception as e:  # noqa: BLE001 (an overflow is a measurement: no finite bound)
                    margins.append(type(e).__name__)
            finite = [m for m in margins if isinstance(m, float)]
            print(f"{variant} f={f:g}: CROWN proves {sum(m > 0 for m in finite)}/{len(margins)}, median margin "
                  f"{np.median(finite) if finite else float('nan'):.3g}", flush=True)
            out[f"{variant}@{f:g}"] = margins
        out[f"{variant}:properties"] = [p.stem for p in props]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--factors", type=float, nargs="+", default=[1, 0.25, 0.0625, 0.015625, 0.00390625])
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    res = {"run": a.run.name, "factors": a.factors, "margins": measure(a.run, a.factors)}
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
