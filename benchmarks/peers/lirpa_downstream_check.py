"""The downstream peer cross-checked on one network of one run: auto_LiRPA's CROWN lower bounds of every margin
(lirpa_downstream_peer.py, the job the driver runs) beside ours (`Bounder(...).crown()`, then the margins' rows), on the
same boxes, with both tools' unstable ReLU counts, and both lower bounds checked against onnxruntime's margins at
sampled points of each box (its centre, uniform points and vertices): a bound above a sampled margin is unsound.

    python -m benchmarks.peers.lirpa_downstream_check RUN --network relu --out DIR [--points 2000] [--peer-python PY]

Writes DIR/result.json (per ε and sample both tools' bounds, counts and the sampled minimum) and DIR/SUMMARY.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from analysis.verification.bounds import Bounder, Spec
from analysis.verification.readers import from_onnx
from pipeline.atomic_io import atomic_write_text

from .. import common
from .lirpa_downstream import ROOT, jobs_for, run_peer

# onnxruntime's float32 margins and auto_LiRPA's float32 bounds: a bound may exceed a sampled margin by this much
SOUND_TOL = 1e-4


def sampled_margins(session: ort.InferenceSession, lo: np.ndarray, hi: np.ndarray, C: np.ndarray, shape: tuple,
                    points: int, rng: np.random.Generator) -> np.ndarray:
    """Per margin row the least margin C y over the box's centre, points/2 uniform points and points/2 vertices."""
    half = points // 2
    xs = np.concatenate([((lo + hi) / 2)[None], lo + (hi - lo) * rng.random((half, lo.size)),
                         np.where(rng.random((points - half, lo.size)) < 0.5, lo, hi)])
    name = session.get_inputs()[0].name
    ys = session.run(None, {name: xs.reshape(-1, *shape).astype(np.float32)})[0].astype(np.float64)
    return (ys @ C.T).min(axis=0)


def batch_free(path: str) -> bytes:
    """The ONNX file with a symbolic batch dimension, so that onnxruntime takes all sampled points at once."""
    model = onnx.load(path)
    for v in (*model.graph.input, *model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    del model.graph.value_info[:]  # the exporter's batch-1 shapes of the inner tensors
    return model.SerializeToString()


def check(run: Path, network: str, points: int, peer_python: str, seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lirpa-check-") as tmp:
        jobs, setting = jobs_for(run, Path(tmp))
        job = [j for j in jobs if j["name"] == network]
        if not job:
            raise SystemExit(f"error: {run} has no float ReLU network {network!r}; choose one of "
                             f"{', '.join(j['name'] for j in jobs)}")
        t0 = time.perf_counter()
        peer = run_peer(job, Path(tmp), peer_python)["rows"][0]
        peer_seconds = time.perf_counter() - t0
        data = dict(np.load(job[0]["npz"]))
    shape = tuple(int(v) for v in data["shape"])
    net = from_onnx(onnx.load(job[0]["onnx"]))
    session = ort.InferenceSession(batch_free(job[0]["onnx"]), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    per_eps = []
    for i, eps in enumerate(data["eps"].tolist()):
        theirs = peer["eps"][i]
        rows = []
        for s in range(len(data[f"lo_{i}"])):
            lo, hi, C = data[f"lo_{i}"][s], data[f"hi_{i}"][s], data[f"C_{i}"][s]
            t0 = time.perf_counter()
            b = Bounder(net, lo, hi)
            b.crown()
            ours = b.spec_bounds(Spec(C, np.zeros(len(C)))).cpu().numpy()
            ours_seconds = time.perf_counter() - t0
            sampled = sampled_margins(session, lo, hi, C, shape, points, rng)
            rows.append({"ours_lower": ours.tolist(), "theirs_lower": theirs["crown_lower"][s],
                         "sampled_min": sampled.tolist(), "ours_unstable": sum(b.result().unstable()),
                         "theirs_unstable": theirs["crown_unstable"][s], "ours_seconds": ours_seconds})
        ours_l = np.array([r["ours_lower"] for r in rows])
        theirs_l = np.array([r["theirs_lower"] for r in rows])
        smin = np.array([r["sampled_min"] for r in rows])
        du = np.array([r["ours_unstable"] - r["theirs_unstable"] for r in rows])
        per_eps.append({
            "eps": eps, "samples": len(rows), "rows": rows,
            "ours_crown_certified": int((ours_l > 0).all(axis=1).sum()),
            "theirs_crown_certified": int((theirs_l > 0).all(axis=1).sum()),
            "ours_unstable_mean": float(np.mean([r["ours_unstable"] for r in rows])),
            "theirs_unstable_mean": float(np.mean([r["theirs_unstable"] for r in rows])),
            "unstable_diff_max_abs": int(np.abs(du).max()),
            # ours minus theirs per margin row: > 0 where ours is tighter
            "lower_gap": {"min": float((ours_l - theirs_l).min()), "mean": float((ours_l - theirs_l).mean()),
                          "max": float((ours_l - theirs_l).max())},
            # bound minus the least sampled margin: ≤ SOUND_TOL when sound
            "ours_excess_max": float((ours_l - smin).max()), "theirs_excess_max": float((theirs_l - smin).max()),
            "ours_unsound_rows": int((ours_l - smin > SOUND_TOL).sum()),
            "theirs_unsound_rows": int((theirs_l - smin > SOUND_TOL).sum())})
    return {"run": str(run), "network": network, "points": points, "seed": seed, "sound_tol": SOUND_TOL,
            "peer_seconds": peer_seconds, "samples": setting["samples"], "eps": per_eps}


def summary(res: dict, meta: dict) -> str:
    lines = [f"# auto_LiRPA's CROWN beside ours: `{res['network']}` of {res['run']}", "",
             f"Made by `{meta['command']}` on {meta['commit']} ({meta['cpu']}). The downstream peer's boxes (the run's "
             f"first {res['samples']} validation examples per ε, clipped to the data's range) and margin rows "
             f"(y_label − y_j); each tool's CROWN lower bound of every row; the least margin onnxruntime finds over "
             f"each box's centre, {res['points'] // 2} uniform points and {res['points'] - res['points'] // 2} vertices; "
             f"a row is unsound when its bound exceeds that by more than {res['sound_tol']:g}.", "",
             "| ε | CROWN certified (ours / auto_LiRPA) | unstable ReLUs, mean (ours / auto_LiRPA) | max per-sample "
             "difference | ours − auto_LiRPA per row (min / mean / max) | bound − sampled min, max (ours / auto_LiRPA) "
             "| unsound rows (ours / auto_LiRPA) |", "|---|---|---|---|---|---|---|"]
    for e in res["eps"]:
        g = e["lower_gap"]
        lines.append(f"| {e['eps']:g} | {e['ours_crown_certified']} / {e['theirs_crown_certified']} of {e['samples']} "
                     f"| {e['ours_unstable_mean']:.2f} / {e['theirs_unstable_mean']:.2f} | {e['unstable_diff_max_abs']} "
                     f"| {g['min']:+.2e} / {g['mean']:+.2e} / {g['max']:+.2e} "
                     f"| {e['ours_excess_max']:+.3f} / {e['theirs_excess_max']:+.3f} "
                     f"| {e['ours_unsound_rows']} / {e['theirs_unsound_rows']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--network", default="relu", help="a float ReLU network of the run's verify stage (summary.json)")
    ap.add_argument("--points", type=int, default=2000, help="sampled points per box (half uniform, half vertices)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peer-python", default=str(ROOT / ".peers" / "auto_lirpa" / "bin" / "python"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not Path(args.peer_python).is_file():
        print(f"error: no peer interpreter at {args.peer_python}; build it with benchmarks/peers/auto_lirpa_setup.sh "
              "or pass --peer-python", file=sys.stderr)
        return 2
    res = check(args.run, args.network, args.points, args.peer_python, args.seed)
    meta = {"command": "python -m benchmarks.peers.lirpa_downstream_check " + " ".join(argv if argv is not None else sys.argv[1:]),
            "commit": common.commit(), "cpu": common.cpu_name()}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "result.json", json.dumps({"meta": meta, **res}, indent=1) + "\n")
    md = summary(res, meta)
    atomic_write_text(args.out / "SUMMARY.md", md)
    print(md)
    return 0 if all(e["ours_unsound_rows"] == 0 and e["theirs_unsound_rows"] == 0 for e in res["eps"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
