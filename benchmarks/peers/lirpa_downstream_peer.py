"""auto_LiRPA's view of a run's shipped networks, inside the peer's environment: CROWN and α-CROWN lower bounds of every
robustness property's margins, and the ReLUs left unstable after the CROWN pass. Run by
benchmarks/peers/lirpa_downstream.py, which writes the jobs and reads the answers back; this file imports only numpy,
onnx, torch, onnx2pytorch and auto_LiRPA (the project is not importable in the peer's environment).

    PYTHONPATH=benchmarks/peers/stand_ins:<auto_LiRPA site> python benchmarks/peers/lirpa_downstream_peer.py jobs.json out.json

A job: {"name", "onnx", "npz"}; the npz holds per ε (key suffix _<i>) the boxes lo, hi (samples × inputs), the spec
C (samples × classes−1 × classes: y_label − y_j), and "eps", "shape" (one example's input shape).

Per network and ε, CROWN is one batched compute_bounds over all samples (auto_LiRPA's default bound options: patches
mode for convolutions, sparse intermediate bounds and alphas). α-CROWN (auto_LiRPA's defaults: 20 iterations, Adam at
lr 0.5, intermediate layers' alphas optimized too) then runs as α,β-CROWN runs its first α-CROWN pass: a sample CROWN
certifies counts as certified (α-CROWN's first iteration is that CROWN bound and it keeps the best), one whose margin
at the box's centre is not positive (misclassified: α,β-CROWN's attack ends there first) as not certified, and every
other sample is its own compute_bounds call that stops once all its margins are positive (stop_criterion_all(0),
α,β-CROWN's criterion for such a property). One call per sample because auto_LiRPA sizes a batch's sparse alphas by
the union of its samples' unstable neurons, so on the CNNs a batched call costs more than the single calls together;
the optimisation per sample is the batched one's (each sample's alphas get only its own margins' gradient), so the
certified fractions are those of one batched call.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import torch

ITERATIONS = 20  # auto_LiRPA's default for α-CROWN, stated so that a change of its default shows here


def bounds(net, lo, hi, C, method: str) -> tuple[torch.Tensor, float, object]:
    """The margins' lower bounds (samples × classes−1) by `method` on the boxes [lo, hi], the seconds compute_bounds
    took, and the BoundedModule (its ReLU inputs hold this pass's intermediate bounds)."""
    from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm
    from auto_LiRPA.utils import stop_criterion_all

    x = (lo + hi) / 2
    opts = {"iteration": ITERATIONS, "stop_criterion_func": stop_criterion_all(0.0)}
    bounded = BoundedModule(net, torch.zeros_like(x), device="cpu", verbose=0, bound_opts={"optimize_bound_args": opts})
    t0 = time.perf_counter()
    lb, _ = bounded.compute_bounds(x=(BoundedTensor(x, PerturbationLpNorm(x_L=lo, x_U=hi)),), C=C, method=method,
                                   bound_upper=False)
    return lb.detach(), time.perf_counter() - t0, bounded


def unstable(bounded, n: int) -> list[int]:
    """Per sample the ReLUs whose input interval straddles 0 after the pass that built `bounded`."""
    from auto_LiRPA.operators import BoundRelu

    per = [((node.inputs[0].lower < 0) & (node.inputs[0].upper > 0)).reshape(n, -1).sum(1)
           for node in bounded.nodes() if isinstance(node, BoundRelu)]
    return (torch.stack(per).sum(0) if per else torch.zeros(n)).int().tolist()


def one_eps(net, lo, hi, C, eps: float) -> dict:
    """One network at one ε: CROWN over all samples, then α-CROWN on each sample CROWN left."""
    n = len(lo)
    lb, crown_seconds, bounded = bounds(net, lo, hi, C, "CROWN")
    crown = (lb > 0).all(dim=1)
    res = {"eps": eps, "samples": n, "crown_certified": crown.int().tolist(), "crown_seconds": crown_seconds,
           "crown_unstable": unstable(bounded, n), "crown_lower": lb.tolist()}
    del bounded
    alpha, alpha_seconds = crown.clone(), 0.0
    with torch.no_grad():  # a sound lower bound never exceeds the margin at the box's centre, so there it must be > 0
        centre = torch.einsum("sjk,sk->sj", C, net((lo + hi) / 2)).min(dim=1).values
    left = [s for s in range(n) if not crown[s] and centre[s] > 0]
    for s in left:
        lb_s, seconds, _ = bounds(net, lo[s:s + 1], hi[s:s + 1], C[s:s + 1], "alpha-CROWN")
        alpha[s] = bool((lb_s > 0).all())
        alpha_seconds += seconds
    res.update({"alpha_crown_certified": alpha.int().tolist(), "alpha_crown_seconds": alpha_seconds,
                "alpha_crown_samples": len(left)})
    return res


def main(argv: list[str]) -> int:
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
            row["eps"].append(one_eps(net, lo, hi, torch.from_numpy(data[f"C_{i}"]).float(), eps))
        out.append(row)
        print(f"auto_LiRPA: {job['name']}: " + ", ".join(
            f"ε {r['eps']:g} CROWN {sum(r['crown_certified'])}/{r['samples']} α-CROWN {sum(r['alpha_crown_certified'])}"
            f" ({r['crown_seconds'] + r['alpha_crown_seconds']:.1f} s)" for r in row["eps"]), flush=True)
    import importlib.metadata as md

    version = f"auto_LiRPA {auto_LiRPA.__version__}, onnx2pytorch {md.version('onnx2pytorch')}, torch {torch.__version__}"
    dest.write_text(json.dumps({"version": version, "rows": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
