"""auto_LiRPA's view of a run's shipped networks, inside the peer's environment: CROWN and α-CROWN lower bounds of every
robustness property's margins, and the ReLUs left unstable after the CROWN pass. Run by
benchmarks/peers/lirpa_downstream.py, which writes the jobs and reads the answers back; this file imports only numpy,
onnx, torch, onnx2pytorch and auto_LiRPA (the project is not importable in the peer's environment).

    PYTHONPATH=benchmarks/peers/stand_ins:<auto_LiRPA site> python benchmarks/peers/lirpa_downstream_peer.py jobs.json out.json

A job: {"name", "onnx", "npz"}; the npz holds per ε (key suffix _<i>) the boxes lo, hi (samples × inputs), the spec
C (samples × classes−1 × classes: y_label − y_j), and "eps", "shape" (one example's input shape). The module is built
once per network; each ε is one batched compute_bounds per method.
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

    torch.set_num_threads(1)
    jobs, dest = json.loads(Path(argv[1]).read_text()), Path(argv[2])
    out = []
    for job in jobs:
        data = np.load(job["npz"])
        shape = tuple(int(v) for v in data["shape"])
        net = ConvertModel(onnx.load(job["onnx"]), experimental=True).eval()
        row = {"name": job["name"], "eps": []}
        for i, eps in enumerate(data["eps"].tolist()):
            lo = torch.from_numpy(data[f"lo_{i}"]).float().reshape(-1, *shape)
            hi = torch.from_numpy(data[f"hi_{i}"]).float().reshape(-1, *shape)
            C = torch.from_numpy(data[f"C_{i}"]).float()
            x = (lo + hi) / 2
            res = {"eps": eps, "samples": int(len(x))}
            for method in ("CROWN", "alpha-CROWN"):
                bounded = BoundedModule(net, torch.zeros_like(x), device="cpu", verbose=0,
                                        bound_opts={"optimize_bound_args": {"iteration": 20}})
                bx = BoundedTensor(x, PerturbationLpNorm(x_L=lo, x_U=hi))
                t0 = time.perf_counter()
                lb, _ = bounded.compute_bounds(x=(bx,), C=C, method=method, bound_upper=False)
                seconds = time.perf_counter() - t0
                lb = lb.detach().double().numpy()
                key = "crown" if method == "CROWN" else "alpha_crown"
                res[f"{key}_certified"] = (lb > 0).all(axis=1).astype(int).tolist()
                res[f"{key}_seconds"] = seconds
                if method == "CROWN":  # the ReLU inputs' bounds of this pass: units whose interval straddles 0
                    per = []
                    for node in bounded.nodes():
                        if isinstance(node, BoundRelu):
                            pre = node.inputs[0]
                            per.append(((pre.lower < 0) & (pre.upper > 0)).reshape(len(x), -1).sum(1))
                    res["crown_unstable"] = (torch.stack(per).sum(0) if per else torch.zeros(len(x))).int().tolist()
            row["eps"].append(res)
        out.append(row)
        print(f"auto_LiRPA: {job['name']}: " + ", ".join(
            f"ε {r['eps']:g} CROWN {sum(r['crown_certified'])}/{r['samples']} α-CROWN {sum(r['alpha_crown_certified'])}"
            for r in row["eps"]), flush=True)
    import importlib.metadata as md

    version = f"auto_LiRPA {auto_LiRPA.__version__}, onnx2pytorch {md.version('onnx2pytorch')}, torch {torch.__version__}"
    dest.write_text(json.dumps({"version": version, "rows": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
