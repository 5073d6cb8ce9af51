"""auto_LiRPA's CROWN on a timm ViT's weights, inside auto_LiRPA's own venv (`auto_lirpa_setup.sh`):
`crown_vit.py` runs it beside ours, one job per process (so that a pass past its limit is killed, not waited for).

    PYTHONPATH=benchmarks/peers/stand_ins .peers/auto_lirpa/bin/python benchmarks/peers/lirpa_vit.py job.json out.json

Imports numpy, torch, auto_LiRPA and `plain_vit.py` beside it (the project is not installed in the peer's venv). A job:
{"name", "state" (the timm model's state_dict, torch.save), "arch" (`PlainViT`'s arguments), "npz" (lo, hi: the box
in the input's shape; C (rows, classes), d (rows,): the spec rows C y + d; x, y: a test input and timm's float32
outputs on it), "bound_opts", "method", "threads"}. The model is checked first (its outputs on x within 1e-4 of
timm's), built once outside the clock (`BoundedModule`), then one timed `compute_bounds(C=C, method=…)` (every
intermediate bound and the spec rows'). Recorded: seconds, the spec rows' lower bounds, the peak resident memory,
and per softmax, LayerNorm and ReLU node the widest and largest input bound of that pass (where it blew up or not)."""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str]) -> int:
    import auto_LiRPA
    from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm
    from plain_vit import PlainViT

    job, dest = json.loads(Path(argv[1]).read_text()), Path(argv[2])
    torch.set_num_threads(int(job.get("threads", 1)))
    data = np.load(job["npz"])
    model = PlainViT(**job["arch"]).eval()
    model.load_state_dict(torch.load(job["state"]))
    x_ref = torch.from_numpy(data["x"]).float()
    with torch.no_grad():
        agree = float((model(x_ref) - torch.from_numpy(data["y"]).float()).abs().max())
    if agree > 1e-4:
        raise SystemExit(f"error: PlainViT's outputs differ from timm's by {agree:.3g}: not the same model")
    lo, hi = torch.from_numpy(data["lo"]).float(), torch.from_numpy(data["hi"]).float()
    C = torch.from_numpy(data["C"]).float()[None]
    x = (lo + hi) / 2
    t0 = time.perf_counter()
    bounded = BoundedModule(model, torch.zeros_like(x), bound_opts=job.get("bound_opts", {}), device="cpu")
    build = time.perf_counter() - t0
    bx = BoundedTensor(x, PerturbationLpNorm(x_L=lo, x_U=hi))
    error, spec_lower = "", None
    t0 = time.perf_counter()
    try:
        lb, _ = bounded.compute_bounds(x=(bx,), C=C, method=job.get("method", "CROWN"), bound_upper=False)
        spec_lower = (lb.detach().double().reshape(-1).numpy() + data["d"]).tolist()
    except Exception as e:  # what stopped the pass is the finding
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    seconds = time.perf_counter() - t0
    nodes = []
    for node in bounded.nodes():
        kind = type(node).__name__
        if kind not in ("BoundSoftmax", "BoundExp", "BoundLayerNormalization", "BoundRelu") or not node.inputs:
            continue
        pre = node.inputs[0]
        lower, upper = getattr(pre, "lower", None), getattr(pre, "upper", None)
        if lower is None or upper is None:
            nodes.append({"node": node.name, "op": kind, "bounded": False})
            continue
        width = (upper - lower).detach().double()
        entry = {"node": node.name, "op": kind, "bounded": True, "units": int(width.numel()),
                 "max_width": float(width.max()), "mean_width": float(width.mean()),
                 "max_abs": float(torch.maximum(lower.abs(), upper.abs()).max())}
        if kind == "BoundRelu":
            entry["unstable"] = int(((lower < 0) & (upper > 0)).sum())
        nodes.append(entry)
    import importlib.metadata as md

    out = {"name": job["name"], "bound_opts": job.get("bound_opts", {}), "method": job.get("method", "CROWN"),
           "build_s": build, "seconds": seconds, "error": error, "spec_lower": spec_lower,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "agree_with_timm": agree,
           "nodes": nodes, "version": f"auto_LiRPA {auto_LiRPA.__version__}, torch {torch.__version__}, "
                                       f"numpy {md.version('numpy')}"}
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"auto_LiRPA {out['method']} {out['bound_opts']}: {job['name']}: {seconds:.2f} s, "
          f"{'error ' + error if error else 'min spec lower %.4g' % min(spec_lower)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
