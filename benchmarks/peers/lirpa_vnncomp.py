"""auto_LiRPA's α-CROWN (its `CROWN-Optimized` bounds, no branch and bound: what the library alone decides) on a VNN-COMP
folder's instances, one row per instance in `pipeline vnncomp`'s results format, beside ours on the same rows.

    PYTHONPATH=benchmarks/peers/stand_ins:$LIRPA:. .venv/bin/python -m benchmarks.peers.lirpa_vnncomp FOLDER \\
        --instances instances.csv --timeout 30 --out lirpa.csv

$LIRPA holds auto_LiRPA (its source release, `pip install --no-deps --target $LIRPA SRC`), onnx2pytorch 0.6.0, appdirs
and graphviz (auto_lirpa_setup.sh's packages, installed beside the project's own torch instead of in a venv). Per
instance: the network through onnx2pytorch, the box and the unsafe set from the project's VNN-LIB parser, α-CROWN on
every disjunct's rows at once (lower bounds of A y − b; a disjunct is excluded when some row's bound is > 0), its
`--iterations` steps; "unsat" when every disjunct is excluded, else "unknown" (no attack: it proves
only), "timeout" past the limit, "error" where auto_LiRPA raises (its message on stderr). The network is built once per file, outside the clock, as a verifier builds it once.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import torch


def main(argv: list[str] | None = None) -> int:
    from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm
    from onnx2pytorch import ConvertModel

    from analysis.verification.vnnlib import read_instances_csv, read_vnnlib

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--instances", default="instances.csv")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--conv-mode", choices=["patches", "matrix"], default="patches",
                    help="auto_LiRPA's convolution mode (its patches mode does not take a 1-d Conv; matrix does)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    built: dict[str, tuple[object, tuple[int, ...]]] = {}
    lines = []
    for onnx_rel, vnnlib_rel, _ in read_instances_csv(args.folder / args.instances):
        if onnx_rel not in built:
            model = onnx.load(str(args.folder / onnx_rel))
            dims = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
            net = ConvertModel(model, experimental=True).eval()
            built[onnx_rel] = (BoundedModule(net, torch.zeros(dims), device="cpu",
                                             bound_opts={"optimize_bound_args": {"iteration": args.iterations},
                                                         "conv_mode": args.conv_mode}), tuple(dims))
        bounded, dims = built[onnx_rel]
        spec = read_vnnlib(args.folder / vnnlib_rel)
        t0 = time.perf_counter()
        lo = torch.tensor(spec.lb, dtype=torch.float32).reshape(dims)
        hi = torch.tensor(spec.ub, dtype=torch.float32).reshape(dims)
        A = np.concatenate([a for a, _ in spec.disjuncts])
        b = np.concatenate([bb for _, bb in spec.disjuncts])
        owner = np.concatenate([[k] * a.shape[0] for k, (a, _) in enumerate(spec.disjuncts)])
        x = BoundedTensor((lo + hi) / 2, PerturbationLpNorm(x_L=lo, x_U=hi))
        try:
            lb, _ = bounded.compute_bounds(x=(x,), C=torch.tensor(A, dtype=torch.float32)[None],
                                           method="CROWN-Optimized", bound_upper=False)
        except Exception as exc:  # the peer's own failure is its answer on this row; the other rows still run
            spent = time.perf_counter() - t0
            lines.append(f"{args.folder.name},{onnx_rel},{vnnlib_rel},0.0,error,{spent:.6f}")
            print(f"lirpa: {vnnlib_rel}: error ({spent:.2f} s): {type(exc).__name__}: {str(exc).splitlines()[0]}",
                  file=sys.stderr, flush=True)
            continue
        margins = lb[0].detach().double().numpy() - b
        spent = time.perf_counter() - t0
        excluded = [bool(np.any(margins[owner == k] > 0)) for k in range(len(spec.disjuncts))]
        result = "timeout" if spent > args.timeout else ("unsat" if all(excluded) else "unknown")
        lines.append(f"{args.folder.name},{onnx_rel},{vnnlib_rel},0.0,{result},{spent:.6f}")
        worst = min(float(margins[owner == k].max()) for k in range(len(spec.disjuncts)))
        print(f"lirpa: {vnnlib_rel}: {result} ({spent:.2f} s, smallest margin {worst:.4g})", file=sys.stderr, flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
