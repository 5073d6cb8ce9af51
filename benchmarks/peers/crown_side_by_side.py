"""One CROWN pass, ours beside auto_LiRPA's, on the same ONNX file and the same L∞ boxes (issue 40 item 2): the time
of the pass (every intermediate bound and the spec rows' bounds) and its tightness (the spec rows' lower bounds,
the output bounds' mean width, the ReLUs whose input interval still crosses 0).

    flock /tmp/heavy.lock .venv/bin/python -m benchmarks.peers.crown_side_by_side --run runs/preact1632 \\
        --network lambda_gelu.onnx --properties 3 --repeat 5 --venv /work/peers/auto_lirpa \\
        --out benchmarks/peers/crown-preact1632

The boxes and spec rows are the run's own properties: the first `--properties` rows of `verify/instances.csv` whose
ONNX file is `verify/onnx/<network>` (the verifiers' form of the float ReLU network) and their VNN-LIB files. The
spec rows are `Spec.from_disjuncts` of the property (a disjunct is excluded when some row's lower bound is > 0),
given to auto_LiRPA as its C matrix and offset. Ours runs in this process (`Bounder`: IBP, `crown()`, then the spec
rows), auto_LiRPA in its venv (`lirpa_crown.py`, onnx2pytorch → `BoundedModule`), one after the other in the same lock
hold, one torch thread each; auto_LiRPA twice, in its default convolutional mode (patches) and in matrix mode. Each
pass `--repeat` times, the minimum and median reported; a tool's build of its model (reading the ONNX file,
`BoundedModule`) is outside the clock and reported apart.

Writes `--out`/result.json (every number, the machine, the commands) and `--out`/SUMMARY.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from analysis.verification.bounds import Bounder, Spec
from analysis.verification.readers import from_onnx
from analysis.verification.vnnlib import read_instances_csv, read_vnnlib_all
from pipeline.atomic_io import atomic_write_text

from .. import common

ROOT = Path(__file__).resolve().parents[2]
STAND_INS = Path(__file__).resolve().parent / "stand_ins"
MODES = ("patches", "matrix")


def properties(run: Path, network: str, count: int) -> list[dict[str, Any]]:
    """The run's first `count` properties on verify/onnx/<network>: name, onnx path, box, spec rows."""
    verify = run / "verify"
    out = []
    for onnx_rel, vnnlib_rel, _t in read_instances_csv(verify / "instances.csv"):
        if Path(onnx_rel).name != network:
            continue
        for k, spec in enumerate(read_vnnlib_all(verify / vnnlib_rel)):
            C = np.concatenate([A for A, _ in spec.disjuncts])
            d = -np.concatenate([b for _, b in spec.disjuncts])
            out.append({"name": f"{Path(vnnlib_rel).stem}" + (f"#{k}" if k else ""), "onnx": str(verify / onnx_rel),
                        "lo": spec.lb, "hi": spec.ub, "C": C, "d": d, "owner": [j for j, (A, _) in enumerate(spec.disjuncts)
                                                                               for _ in range(A.shape[0])]})
        if len(out) >= count:
            break
    if not out:
        raise SystemExit(f"error: no property of {network} in {verify / 'instances.csv'}")
    return out[:count]


def ours(props: list[dict[str, Any]], repeat: int) -> list[dict[str, Any]]:
    rows = []
    for p in props:
        t0 = time.perf_counter()
        net = from_onnx(onnx.load(p["onnx"]))
        build = time.perf_counter() - t0
        spec = Spec(p["C"], p["d"])
        times, b = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            b = Bounder(net, p["lo"], p["hi"])  # IBP
            b.crown()  # every site's input bounds
            lower = b.spec_bounds(spec)  # the spec rows
            times.append(time.perf_counter() - t0)
        n = b.net.nodes[b.net.output].op.out_size
        eye = torch.eye(n, dtype=torch.float64)
        both = b.backward(torch.cat([eye, -eye]), b.net.output)
        x = torch.as_tensor((p["lo"] + p["hi"]) / 2, dtype=torch.float64)[None]
        y = b.net.forward(x)[0]
        olb, oub = both[:n], -both[n:]
        rows.append({"name": p["name"], "build_s": build, "seconds": times, "spec_lower": lower.tolist(),
                     "unstable": b.result().unstable(), "out_lower": olb.tolist(), "out_upper": oub.tolist(),
                     "centre_inside": bool(((olb <= y) & (y <= oub)).all())})
        print(f"ours: {p['name']}: {min(times):.3f} s, unstable {sum(rows[-1]['unstable'])}", flush=True)
    return rows


def lirpa(props: list[dict[str, Any]], repeat: int, venv: Path, work: Path, threads: int) -> dict[str, Any]:
    jobs = []
    for i, p in enumerate(props):
        npz = work / f"p{i}.npz"
        shape = [int(d.dim_value) for d in onnx.load(p["onnx"]).graph.input[0].type.tensor_type.shape.dim][1:]
        np.savez(npz, lo=p["lo"], hi=p["hi"], C=p["C"], d=p["d"], shape=np.array(shape))
        for mode in MODES:
            jobs.append({"name": p["name"], "onnx": p["onnx"], "npz": str(npz), "conv_mode": mode, "repeat": repeat,
                         "threads": threads})
    (work / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": str(STAND_INS), "OMP_NUM_THREADS": str(threads)}
    subprocess.run([str(venv / "bin" / "python"), str(Path(__file__).with_name("lirpa_crown.py")), str(work / "jobs.json"),
                    str(work / "out.json")], env=env, check=True)
    return json.loads((work / "out.json").read_text())


def _stats(ts: list[float]) -> dict[str, float]:
    return {"min": round(min(ts), 4), "median": round(statistics.median(ts), 4)}


def _width(r: dict[str, Any]) -> float:
    return float(np.mean(np.array(r["out_upper"]) - np.array(r["out_lower"])))


def summarize(props, our_rows, peer, meta) -> tuple[dict[str, Any], str]:
    table = []
    for p, o in zip(props, our_rows):
        entry = {"property": p["name"], "rows": len(p["d"]),
                 "ours": {"seconds": _stats(o["seconds"]), "build_s": round(o["build_s"], 3),
                          "unstable": o["unstable"], "unstable_total": sum(o["unstable"]),
                          "spec_lower": o["spec_lower"], "out_mean_width": _width(o), "centre_inside": o["centre_inside"]}}
        for r in peer["rows"]:
            if r["name"] != p["name"]:
                continue
            gap = np.array(o["spec_lower"]) - np.array(r["spec_lower"])
            entry[f"auto_LiRPA {r['conv_mode']}"] = {
                "seconds": _stats(r["seconds"]), "build_s": round(r["build_s"], 3), "unstable": r["unstable"],
                "unstable_total": sum(r["unstable"]), "spec_lower": r["spec_lower"], "out_mean_width": _width(r),
                "centre_inside": r["centre_inside"],
                # ours minus theirs, per spec row: > 0 where ours is tighter
                "ours_minus_theirs_spec_lower": {"min": float(gap.min()), "mean": float(gap.mean()), "max": float(gap.max())}}
        table.append(entry)
    result = {"meta": meta, "peer_version": peer["version"], "properties": table}
    lines = [f"# One CROWN pass: ours and auto_LiRPA's, same ONNX, same boxes", "",
             f"Made by `{meta['command']}` on {meta['commit']} ({meta['cpu']}, {meta['cores']} cores shared, torch threads "
             f"{meta['threads']} each; load {meta['load_before']} → {meta['load_after']}). Peer: {peer['version']}.", "",
             f"Network: `{meta['onnx']}` (the run's verifiers' form of the float ReLU network); boxes and spec rows: the "
             f"run's first {len(props)} properties on it. Seconds: one CROWN pass (every intermediate bound and the spec "
             f"rows'), min (median) of {meta['repeat']}; the model's build is outside the clock. Spec lower: the mean over "
             f"rows of the lower bound of C y + d (a disjunct is excluded when some row's is > 0). Width: the mean width "
             f"of the output bounds (CROWN, no C). Unstable: ReLUs whose input interval crosses 0 after the pass.", "",
             "| property | tool | seconds | spec lower (mean) | ours − theirs per row (min / mean) | output width | unstable ReLUs |",
             "|---|---|---|---|---|---|---|"]
    for e in table:
        for tool in ["ours", *(f"auto_LiRPA {m}" for m in MODES)]:
            if tool not in e:
                continue
            v = e[tool]
            gap = v.get("ours_minus_theirs_spec_lower")
            gap_cell = "" if gap is None else f"{gap['min']:+.2e} / {gap['mean']:+.2e}"
            lines.append(f"| {e['property']} | {tool} | {v['seconds']['min']:.3f} ({v['seconds']['median']:.3f}) | "
                         f"{np.mean(v['spec_lower']):.4f} | {gap_cell} | {v['out_mean_width']:.4f} | {v['unstable_total']} |")
    lines += ["", "Per-site unstable counts (ours | auto_LiRPA patches):", ""]
    for e in table:
        if "auto_LiRPA patches" in e:
            lines.append(f"- {e['property']}: {e['ours']['unstable']} | {e['auto_LiRPA patches']['unstable']}")
    return result, "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--network", default="lambda_gelu.onnx", help="a file name in the run's verify/onnx/")
    ap.add_argument("--properties", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--venv", type=Path, required=True, help="auto_LiRPA's venv (auto_lirpa_setup.sh)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ours-only", action="store_true", help="skip auto_LiRPA (profiling ours)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    props = properties(args.run, args.network, args.properties)
    load0 = common.load()
    our_rows = ours(props, args.repeat)
    if args.ours_only:
        return 0
    with tempfile.TemporaryDirectory(prefix="crown-sbs-") as tmp:
        peer = lirpa(props, args.repeat, args.venv, Path(tmp), args.threads)
    meta = {"command": "python -m benchmarks.peers.crown_side_by_side " + " ".join(argv if argv is not None else sys.argv[1:]),
            "commit": common.commit(), "cpu": common.cpu_name(), "cores": os.cpu_count(), "threads": args.threads,
            "load_before": load0, "load_after": common.load(), "onnx": str(Path(props[0]["onnx"]).relative_to(args.run.parent)),
            "repeat": args.repeat, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": common.machine()}
    result, md = summarize(props, our_rows, peer, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "result.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(args.out / "SUMMARY.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
