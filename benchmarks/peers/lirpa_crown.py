"""auto_LiRPA's CROWN on ONNX files and boxes, inside auto_LiRPA's own venv (`auto_lirpa_setup.sh`):
benchmarks/peers/crown_side_by_side.py runs it beside ours.

    PYTHONPATH=benchmarks/peers/stand_ins /work/peers/auto_lirpa/bin/python benchmarks/peers/lirpa_crown.py jobs.json out.json

Imports only numpy, onnx, torch, onnx2pytorch and auto_LiRPA (the project is not installed in the peer's venv). A job:
{"name", "onnx", "npz", "conv_mode", "repeat"}; the npz holds the box (lo, hi, the ONNX input's shape) and the spec rows
C (rows, outputs) and d (rows,) whose lower bounds of C y + d are compared. Per job and repeat, one timed
`compute_bounds(method="CROWN", C=C)` on a fresh `BoundedModule` state (every intermediate bound and the spec rows'; the
module is built once, outside the clock, as a verifier builds it once per network), then, untimed, the output bounds
without C (their widths) and the ReLU inputs' bounds of that pass (how many units cross 0).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import torch


def main(argv: list[str]) -> int:
    from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm
    from auto_LiRPA.operators import BoundRelu
    from onnx2pytorch import ConvertModel

    import auto_LiRPA

    jobs, dest = json.loads(Path(argv[1]).read_text()), Path(argv[2])
    torch.set_num_threads(int(jobs[0].get("threads", 1)) if jobs else 1)
    rows = []
    for job in jobs:
        data = np.load(job["npz"])
        shape = tuple(int(v) for v in data["shape"])
        lo = torch.from_numpy(data["lo"].reshape(1, *shape)).float()
        hi = torch.from_numpy(data["hi"].reshape(1, *shape)).float()
        C = torch.from_numpy(data["C"]).float()[None]
        d = data["d"]
        x = (lo + hi) / 2
        net = ConvertModel(onnx.load(job["onnx"]), experimental=True).eval()
        t0 = time.perf_counter()
        bounded = BoundedModule(net, torch.zeros_like(x), bound_opts={"conv_mode": job["conv_mode"]}, device="cpu")
        build = time.perf_counter() - t0
        times = []
        lb = None
        for _ in range(int(job["repeat"])):
            bx = BoundedTensor(x, PerturbationLpNorm(x_L=lo, x_U=hi))
            t0 = time.perf_counter()
            lb, _ub = bounded.compute_bounds(x=(bx,), C=C, method="CROWN", bound_upper=False)
            times.append(time.perf_counter() - t0)
        spec_lower = (lb.detach().double().reshape(-1).numpy() + d).tolist()
        unstable = []
        for node in bounded.nodes():
            if isinstance(node, BoundRelu):
                pre = node.inputs[0]
                unstable.append(int(((pre.lower < 0) & (pre.upper > 0)).sum()))
        bx = BoundedTensor(x, PerturbationLpNorm(x_L=lo, x_U=hi))
        olb, oub = bounded.compute_bounds(x=(bx,), method="CROWN")
        # the model as loaded (float32) at the box's centre: its outputs must lie inside the output bounds
        with torch.no_grad():
            y = net(x).reshape(-1)
        rows.append({"name": job["name"], "conv_mode": job["conv_mode"], "build_s": build, "seconds": times,
                     "spec_lower": spec_lower, "unstable": unstable,
                     "out_lower": olb.detach().double().reshape(-1).tolist(),
                     "out_upper": oub.detach().double().reshape(-1).tolist(),
                     "centre_inside": bool(((olb.reshape(-1) <= y) & (y <= oub.reshape(-1))).all())})
        print(f"auto_LiRPA {job['conv_mode']}: {job['name']}: {min(times):.3f} s, unstable {sum(unstable)}", flush=True)
    import importlib.metadata as md

    version = f"auto_LiRPA {auto_LiRPA.__version__}, onnx2pytorch {md.version('onnx2pytorch')}, torch {torch.__version__}"
    dest.write_text(json.dumps({"version": version, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
