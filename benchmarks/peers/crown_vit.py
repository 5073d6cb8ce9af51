"""One CROWN pass on a timm ViT, ours beside auto_LiRPA's: same weights, same L∞ boxes, same spec rows (issue 40 item
2, on attention). Each pass runs in a process of its own under a wall-clock limit, so that the time, the peak resident
memory and what stopped it (an exception, the limit, the kernel's out-of-memory kill) are each tool's alone.

    flock /tmp/heavy.lock .venv/bin/python -m benchmarks.peers.crown_vit --model vit17 --samples 3 \\
        --venv .peers/auto_lirpa --out benchmarks/peers/crown-vit
    flock /tmp/heavy.lock .venv/bin/python -m benchmarks.peers.crown_vit --model vit64 --samples 1 \\
        --venv .peers/auto_lirpa --out benchmarks/peers/crown-vit

Models (timm `vit_tiny_patch16_224`, depth 2, ReLU MLPs, on sklearn's digits upscaled to img×img, 3 channels):
`vit64` is issue 40's (img 32, patch 4: 65 tokens, dim 64, 2 heads; `benchmarks/vit64.py train` writes its weights),
`vit17` a smaller one both tools can run (img 16, patch 4: 17 tokens, dim 32, 2 heads; trained here, seeded, 30
epochs, if `--weights` is absent). Properties: the first `--samples` test samples at each `--eps`, box clipped to
[0, 1], spec rows y_label − y_j ≥ 0.

Ours: `Bounder(from_torch(model))` then `crown()` and the spec rows, with CROWN's intermediate queries cut as the
verifier does by default (`cut_depth` "default": 1 on a graph as wide as vit64's, none on vit17's) and, with
`--cut-depths`, others; the products' planes as `ops.products.PLANES` says, or each of `--planes`; the LayerNorm
variances' lower bounds from both tangent choices (`ops.norm.Variance.refine_rows`), or with `--variance centre` the
centre's alone (the engine before), or with `--variance optimized` also points optimized per row. auto_LiRPA:
`BoundedModule(PlainViT)` (`plain_vit.py`, checked to give timm's outputs), then
`compute_bounds(C, method="CROWN")`, with its default options and with its batched intermediate bounds
(`crown_batch_size` 512), the way its docs give for a model whose dense pass does not fit in memory, and with that and
its earlier softmax relaxation (`softmax` "complex": exp, sum, division).

Writes `--out`/<model>.json (every number, the machine, the command) and `--out`/<model>.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.atomic_io import atomic_write_text

from .. import common
from ..vit64 import accuracy, digits_rgb, fit, timm_vit

HERE = Path(__file__).resolve().parent
STAND_INS = HERE / "stand_ins"
ARCH = {"vit64": dict(img=32, patch=4, chans=3, dim=64, depth=2, heads=2, classes=10),
        "vit17": dict(img=16, patch=4, chans=3, dim=32, depth=2, heads=2, classes=10)}
WEIGHTS = {"vit64": Path("/tmp/vit64-model.pt"), "vit17": Path("/tmp/vit17-model.pt")}
BATCHED = {"crown_batch_size": 512, "batched_crown_max_vram_ratio": 0.9}
# auto_LiRPA's default softmax relaxation is "lse" (log-sum-exp bounds on the whole row); "complex" is its earlier form,
# the softmax as exp, sum and division (the form of its transformer examples)
PEER_OPTS = {"default": {}, "batched": BATCHED, "batched-complex": {**BATCHED, "softmax": "complex"}}


def model_for(name: str, weights: Path, epochs: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    arch = ARCH[name]
    model = timm_vit(**arch)
    xtr, ytr, xte, yte = digits_rgb(arch["img"])
    if weights.exists():
        model.load_state_dict(torch.load(weights))
        how = f"weights {weights}"
    elif name == "vit64":
        raise SystemExit(f"error: {weights} is missing; make it with: python -m benchmarks.vit64 train --model {weights}")
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=epochs * math.ceil(len(xtr) / 64))
        fit(model, xtr, ytr, epochs, 0, opt, sched)
        torch.save(model.state_dict(), weights)
        how = f"trained here: {epochs} epochs of AdamW (one-cycle, max lr 2e-3, batch 64, seed 0)"
    return model.eval(), {"arch": arch, "weights": how, "acc_train": accuracy(model, xtr, ytr),
                          "acc_test": accuracy(model, xte, yte)}


# -- one pass of ours, in its own process -------------------------------------------------------------------------
def worker(job_path: Path, dest: Path) -> int:
    from analysis.verification.bounds import Bounder, Spec
    from analysis.verification.ops import products
    from analysis.verification.ops.norm import Variance
    from analysis.verification.readers import from_torch

    job = json.loads(job_path.read_text())
    products.PLANES = job["planes"]
    if job["variance"] == "centre":  # the variances' lower bounds from the tangents at c's centre alone
        Variance.refine_rows = lambda self, b, s, idx, n, lo, *a: lo
    if job["variance"] == "optimized":  # and tangent points optimized per row (off by default)
        Variance.STEPS = 20
    torch.set_num_threads(int(job["threads"]))
    data = np.load(job["npz"])
    model = timm_vit(**job["arch"])
    model.load_state_dict(torch.load(job["state"]))
    t0 = time.perf_counter()
    net = from_torch(model, tuple(data["lo"].shape[1:]))
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    b = Bounder(net, data["lo"].reshape(-1), data["hi"].reshape(-1))
    if job["cut_depth"] != "default":
        b.cut_depth = None if job["cut_depth"] == "none" else int(job["cut_depth"])
    error, spec_lower = "", None
    try:
        b.crown()
        spec_lower = b.spec_bounds(Spec(data["C"], data["d"])).tolist()
    except Exception as e:  # what stopped the pass is the finding (an exp that may overflow: OutOfDomain)
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    seconds = time.perf_counter() - t0
    nodes = []
    for s in range(len(b.sites)):
        kind = type(b.op(s)).__name__
        if kind not in ("ExpSums", "ReLU"):
            continue
        lo, hi = b.pre[s]
        w = (hi - lo).double()
        entry = {"site": s, "op": kind, "units": int(w.numel()), "max_width": float(w.max()), "mean_width": float(w.mean()),
                 "max_abs": float(torch.maximum(lo.abs(), hi.abs()).max())}
        if kind == "ReLU":
            entry["unstable"] = int(((lo < 0) & (hi > 0)).sum())
        nodes.append(entry)
    out = {"build_s": build, "seconds": seconds, "error": error, "spec_lower": spec_lower, "cut_depth": b.cut_depth,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "nodes": nodes}
    dest.write_text(json.dumps(out, indent=1) + "\n")
    return 0


def run_limited(cmd: list[str], env: dict[str, str], limit: float, log: Path) -> dict[str, Any]:
    """`cmd` in its own process, killed at `limit` s: its wall time, its own peak RSS (wait4) and how it ended."""
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            proc.kill()

        timer = threading.Timer(limit, kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    ended = "ok" if proc.returncode == 0 else (f"killed at the {limit:.0f} s limit" if killed.is_set() else
                                               "killed by signal 9 (the kernel's out-of-memory kill)" if proc.returncode == -9
                                               else f"exit {proc.returncode}: " + _last_line(log))
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "ended": ended}


def _last_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _softmax_inputs(nodes: list[dict[str, Any]], op: str) -> list[float]:
    return [n["max_abs"] for n in nodes if n["op"] == op and n.get("bounded", True)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker(Path(argv[1]), Path(argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(ARCH), required=True)
    ap.add_argument("--weights", type=Path, default=None, help="the timm model's state_dict (default: /tmp/<model>-model.pt)")
    ap.add_argument("--epochs", type=int, default=30, help="vit17: training epochs when --weights is absent")
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--eps", type=float, nargs="+", default=[0.002])
    ap.add_argument("--cut-depths", nargs="+", default=["default"], help="ours: Bounder.cut_depth per pass (int, none, default)")
    ap.add_argument("--planes", nargs="+", default=["edge"], choices=["edge", "middle"],
                    help="ours: the products' planes (analysis.verification.ops.products.PLANES) per pass")
    ap.add_argument("--variance", nargs="+", default=["both"], choices=["both", "centre", "optimized"],
                    help="ours: a LayerNorm variance's lower bound from both tangent choices (the engine's default), "
                         "the centre's alone, or also tangent points optimized per row (Variance.STEPS 20)")
    ap.add_argument("--peer-opts", nargs="*", default=list(PEER_OPTS), choices=list(PEER_OPTS),
                    help="auto_LiRPA's configurations (none: ours alone)")
    ap.add_argument("--limit", type=float, default=600.0, help="seconds a pass may take before it is killed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--venv", type=Path, default=Path(".peers/auto_lirpa"), help="auto_LiRPA's venv (auto_lirpa_setup.sh)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, meta_model = model_for(args.model, args.weights or WEIGHTS[args.model], args.epochs)
    arch = ARCH[args.model]
    _, _, xte, yte = digits_rgb(arch["img"])
    load0 = common.load()
    rows = []
    with tempfile.TemporaryDirectory(prefix="crown-vit-") as tmp:
        work = Path(tmp)
        torch.save(model.state_dict(), work / "state.pt")
        with torch.no_grad():
            y_ref = model(xte[:4])
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        for eps in args.eps:
            for i in range(args.samples):
                x0, label = xte[i:i + 1], int(yte[i])
                C = -np.eye(arch["classes"])[[j for j in range(arch["classes"]) if j != label]]
                C[:, label] = 1.0
                npz = work / f"p{i}-{eps}.npz"
                np.savez(npz, lo=(x0 - eps).clamp(0, 1).numpy(), hi=(x0 + eps).clamp(0, 1).numpy(), C=C,
                         d=np.zeros(len(C)), x=xte[:4].numpy(), y=y_ref.numpy())
                name = f"sample {i}, eps {eps}"
                runs = [("ours", {"cut_depth": c, "planes": pl, "variance": v}) for pl in args.planes
                        for v in args.variance for c in args.cut_depths]
                runs += [("auto_LiRPA", {"bound_opts": PEER_OPTS[o], "opts": o}) for o in args.peer_opts]
                for tool, opts in runs:
                    job = {"name": name, "state": str(work / "state.pt"), "arch": arch, "npz": str(npz),
                           "threads": args.threads, "method": "CROWN", **opts}
                    (work / "job.json").write_text(json.dumps(job))
                    out = work / "out.json"
                    out.unlink(missing_ok=True)
                    if tool == "ours":
                        cmd = [sys.executable, "-m", "benchmarks.peers.crown_vit", "worker", str(work / "job.json"), str(out)]
                        penv = env
                    else:
                        cmd = [str(args.venv / "bin" / "python"), str(HERE / "lirpa_vit.py"), str(work / "job.json"), str(out)]
                        penv = {**env, "PYTHONPATH": str(STAND_INS)}
                    proc = run_limited(cmd, penv, args.limit, work / "log.txt")
                    res = json.loads(out.read_text()) if out.exists() else {}
                    config = (f"{opts['planes']} planes, variance {opts['variance']}, cut_depth {opts['cut_depth']}" if tool == "ours" else f"{opts['opts']} {opts['bound_opts'] or ''}".strip())
                    row = {"property": name, "sample": i, "eps": eps, "label": label, "tool": tool, "config": config,
                           **proc, **{k: v for k, v in res.items() if k != "peak_rss_mib"}}
                    rows.append(row)
                    low = row.get("spec_lower")
                    print(f"{name}: {tool} {config}: {proc['ended']}, {row.get('seconds', float('nan')):.1f} s pass, "
                          f"{proc['peak_rss_mib']:.0f} MiB, {row.get('error') or ('min spec lower %.4g' % min(low) if low else '')}",
                          flush=True)
    meta = {"command": "python -m benchmarks.peers.crown_vit " + " ".join(argv), "commit": common.commit(),
            "cpu": common.cpu_name(), "cores": os.cpu_count(), "threads": args.threads, "load_before": load0,
            "load_after": common.load(), "limit_s": args.limit, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": common.machine(), "model": meta_model, "peer_opts": {o: PEER_OPTS[o] for o in args.peer_opts}}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / f"{args.model}.json", json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    atomic_write_text(args.out / f"{args.model}.md", summary(args.model, meta, rows))
    print(summary(args.model, meta, rows))
    return 0


def summary(model: str, meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    a = meta["model"]["arch"]
    tokens = (a["img"] // a["patch"]) ** 2 + 1
    lines = [f"# One CROWN pass on a timm ViT ({model}: {tokens} tokens, dim {a['dim']}, depth {a['depth']}, "
             f"{a['heads']} heads), ours and auto_LiRPA's", "",
             f"Made by `{meta['command']}` on {meta['commit']} ({meta['cpu']}, {meta['cores']} cores shared, torch threads "
             f"{meta['threads']}; load {meta['load_before']} → {meta['load_after']}); each pass in its own process, killed at "
             f"{meta['limit_s']:.0f} s. Model: {meta['model']['weights']}; test accuracy {meta['model']['acc_test']:.4f}.", "",
             "Seconds: the pass (every intermediate bound and the spec rows'), the model's build outside it. Peak MiB: the "
             "process's resident peak. Spec lower: the least lower bound of y_label − y_j (> 0 proves the property). "
             "Softmax inputs: the largest |bound| of each block's attention logits after the pass (exp overflows past "
             "~700; ours reads the softmax as sums of exp of logit differences, `ExpSums`).", "",
             "| property | tool | config | ended | pass s | peak MiB | spec lower (min) | softmax inputs, max \\|bound\\| | what stopped it |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nodes = r.get("nodes", [])
        soft = _softmax_inputs(nodes, "ExpSums" if r["tool"] == "ours" else "BoundSoftmax")
        low = r.get("spec_lower")
        lines.append(f"| {r['property']} | {r['tool']} | {r['config']} | {r['ended']} | "
                     f"{r['seconds']:.1f} |" if "seconds" in r else
                     f"| {r['property']} | {r['tool']} | {r['config']} | {r['ended']} | – |")
        lines[-1] += (f" {r['peak_rss_mib']:.0f} | {min(low):.4g} |" if low else f" {r['peak_rss_mib']:.0f} | – |")
        lines[-1] += f" {', '.join(f'{v:.3g}' for v in soft) or '–'} | {r.get('error') or ''} |"
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
