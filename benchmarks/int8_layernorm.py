"""Where an int8 transformer's LayerNorms lose their rows' spread (issue 41 item 2; docs/verification.md, "LayerNorm's
variance from the grid"): one CROWN pass on one property of a run's verify stage (up to where it stops, e.g. an
`OutOfDomain` softmax), then per LayerNorm (its `Variance` node): the mean interval width of its input, the
relaxation's lower bound on each row's variance, the exact minimum of each row's variance over the box of its
intervals (min over c of Σ dist(c, [l_i, u_i])²/N: 0 when the row's intervals share a point, i.e. a constant row lies
in the box), and, in an int8 graph, how many rows' float32 error bound (`LayerNormRounding`) is infinite.

    python -m benchmarks.int8_layernorm RUN VARIANT:SAMPLE:EPS [...] [--out benchmarks/int8-results/layernorm.json]

VARIANT is a verify/onnx file's stem (`lambda_gelu-int8`, or `lambda_gelu` for the float graph beside it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def exact_min_variance(l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of [R, N] intervals, min over points of the box of the row's variance: min over c of
    mean(dist(c, [l_i, u_i])²), a convex piecewise quadratic in c whose minimum is where c is the mean of the
    interval ends that bind (l_i above c, u_i below it); tried at every such candidate."""
    ends = torch.sort(torch.cat([l, u], -1), -1).values  # [R, 2N]: the breakpoints
    best = torch.full(l.shape[:-1], float("inf"), dtype=l.dtype)
    for j in range(ends.shape[-1] + 1):
        # on the piece between breakpoints j-1 and j, the binding ends are fixed: the stationary point, clipped to it
        lo = ends[..., j - 1] if j > 0 else torch.full_like(best, -float("inf"))
        hi = ends[..., j] if j < ends.shape[-1] else torch.full_like(best, float("inf"))
        mid = torch.where(torch.isfinite(lo) & torch.isfinite(hi), (lo + hi) / 2,
                          torch.where(torch.isfinite(lo), lo, hi))[..., None]
        above, below = l > mid, u < mid
        n = (above | below).sum(-1).clamp(min=1)
        c = ((l * above).sum(-1) + (u * below).sum(-1)) / n
        c = torch.minimum(torch.maximum(c, lo), hi)[..., None]
        val = ((l - c).clamp(min=0) ** 2 + (c - u).clamp(min=0) ** 2).mean(-1)
        best = torch.minimum(best, val)
    return best


def measure(run: Path, prop: str) -> dict:
    from analysis.verification.bounds import Bounder
    from analysis.verification.ops.norm import LayerNormRounding, Variance
    from analysis.verification.readers import from_onnx
    from analysis.verification.vnnlib import read_vnnlib_all

    variant, sample, eps = prop.split(":")
    out = run / "verify"
    spec = read_vnnlib_all(out / "vnnlib" / f"{variant.removesuffix('-int8')}_{sample}_{eps}.vnnlib")[0]
    b = Bounder(from_onnx(out / "onnx" / f"{variant}.onnx"), spec.lb, spec.ub)
    try:
        b.crown()
        stopped = ""
    except Exception as e:  # noqa: BLE001 (what stopped the pass is the measurement)
        stopped = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    rows = []
    for si, k in enumerate(b.sites):
        op = b.net.nodes[k].op
        l, u = b.pre[si]
        if isinstance(op, Variance):
            lo, _ = op.interval(l, u)
            (xl, _), (xu, _) = op.split(l), op.split(u)
            exact = exact_min_variance(xl, xu)
            rows.append({"layernorm": op.source, "rows": op.R, "N": op.N, "mean_width": float((xu - xl).mean()),
                         "relaxed_min_variance": [round(float(v), 6) for v in (lo - op.eps)],
                         "exact_min_variance": [round(float(v), 6) for v in exact],
                         "constant_rows_in_box": int((exact <= 1e-12).sum())})
        elif isinstance(op, LayerNormRounding) and rows and rows[-1]["layernorm"] == op.source:
            E = op.bound(l, u).reshape(op.R, op.N)
            rows[-1]["rows_with_infinite_float32_error"] = int(torch.isinf(E).any(1).sum())
    return {"run": run.name, "property": prop, "pass": b.method, "stopped": stopped, "layernorms": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("properties", nargs="+", metavar="VARIANT:SAMPLE:EPS")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/int8-results/layernorm.json"))
    a = ap.parse_args()
    res = []
    for p in a.properties:
        r = measure(a.run, p)
        res.append(r)
        print(f"{p}: pass {r['pass']}{' (' + r['stopped'][:100] + ')' if r['stopped'] else ''}")
        for x in r["layernorms"]:
            print(f"  {x['layernorm']}: mean width {x['mean_width']:.3g}, constant rows in the box "
                  f"{x['constant_rows_in_box']}/{x['rows']}, infinite float32 error rows "
                  f"{x.get('rows_with_infinite_float32_error', '-')}")
    a.out.write_text(json.dumps({"results": res}, indent=1))


if __name__ == "__main__":
    main()
