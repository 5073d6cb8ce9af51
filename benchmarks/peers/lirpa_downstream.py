"""An outside verifier's view of the downstream study: auto_LiRPA's CROWN and α-CROWN certified fractions and its unstable
ReLU counts on each run's shipped float ReLU networks, as the verify stage ships them (`verify/onnx/<variant>.onnx`), on
the same boxes (the first `downstream.samples` validation examples, each verify.epsilons, clipped to the data's range).
Writes `<run>/downstream/lirpa.json`, which `pipeline report` tabulates beside our verifier's numbers
(`analysis/downstream_study.py`).

    python benchmarks/peers/lirpa_downstream.py RUN_DIR... [--peer-python PY] [--peer-path DIR]

The peer runs in its own process (`lirpa_downstream_peer.py`): `--peer-python` is the interpreter of auto_LiRPA's
environment (default: .peers/auto_lirpa/bin/python from auto_lirpa_setup.sh), `--peer-path` an extra PYTHONPATH entry
where auto_LiRPA and onnx2pytorch are installed (e.g. a `pip install --target` folder used with this project's own
interpreter, which already has torch). A run whose lirpa.json exists is skipped (--force redoes it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pipeline.atomic_io import atomic_write_json
from pipeline.data import dataset_for
from pipeline.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / "benchmarks" / "peers" / "lirpa_downstream_peer.py"
STAND_INS = ROOT / "benchmarks" / "peers" / "stand_ins"


def jobs_for(run_path: Path, tmp: Path) -> tuple[list[dict], dict]:
    """The peer's jobs for one run (one per float ReLU network the verify stage shipped) and the setting they share."""
    run = RunDir.open(run_path)
    cfg = run.cfg
    summary = run.read_json("verify", "summary.json")
    if summary is None:
        raise FileNotFoundError(f"{run_path}: no verify/summary.json (an unfinished run): skipped")
    data = dataset_for(cfg)
    n = min(cfg.downstream.samples or cfg.verify.samples, len(data.val.y))
    xs = data.val.x[:n].double().numpy().reshape(n, -1)
    ys = data.val.y[:n].numpy().astype(int)
    lo_dom = np.broadcast_to(np.asarray(data.info.input_low, dtype=np.float64), xs.shape[1:])
    hi_dom = np.broadcast_to(np.asarray(data.info.input_high, dtype=np.float64), xs.shape[1:])
    shape = tuple(data.info.input_shape)
    jobs = []
    for name, m in summary["models"].items():
        if m.get("network") != "relu" or not m.get("onnx"):
            continue
        k = _classes(run, summary, name)
        arrays = {"shape": np.array(shape), "eps": np.array(cfg.verify.epsilons, dtype=np.float64)}
        for i, eps in enumerate(cfg.verify.epsilons):
            arrays[f"lo_{i}"] = np.maximum(xs - eps, lo_dom)
            arrays[f"hi_{i}"] = np.minimum(xs + eps, hi_dom)
            C = np.zeros((n, k - 1, k))
            for s, y in enumerate(ys):
                others = [j for j in range(k) if j != y]
                C[s, np.arange(k - 1), y] = 1.0
                C[s, np.arange(k - 1), others] = -1.0
            arrays[f"C_{i}"] = C
        npz = tmp / f"{run_path.name}-{name}.npz"
        np.savez(npz, **arrays)
        jobs.append({"name": name, "onnx": str(run.file("verify", m["onnx"])), "npz": str(npz)})
    return jobs, {"samples": n, "epsilons": list(cfg.verify.epsilons), "labels": ys.tolist()}


def _classes(run: RunDir, summary: dict, name: str) -> int:
    import onnx

    graph = onnx.load(run.file("verify", summary["models"][name]["onnx"])).graph
    return int(graph.output[0].type.tensor_type.shape.dim[-1].dim_value)


def record(peer: dict, setting: dict) -> dict:
    """lirpa.json: per variant and ε the certified fractions by CROWN and α-CROWN, the mean unstable ReLUs, each
    method's seconds and how many samples α-CROWN ran on (those CROWN did not certify; lirpa_downstream_peer.py)."""
    out = {"version": peer["version"], "samples": setting["samples"], "variants": {}}
    for row in peer["rows"]:
        out["variants"][row["name"]] = [
            {"eps": r["eps"], "samples": r["samples"],
             "crown_certified": sum(r["crown_certified"]) / r["samples"],
             "alpha_crown_certified": sum(r["alpha_crown_certified"]) / r["samples"],
             "crown_unstable_mean": float(np.mean(r["crown_unstable"])),
             "crown_seconds": r["crown_seconds"], "alpha_crown_seconds": r["alpha_crown_seconds"],
             "alpha_crown_samples": r["alpha_crown_samples"]} for r in row["eps"]]
    return out


def run_peer(jobs: list[dict], tmp: Path, peer_python: str, peer_path: str = "") -> dict:
    """The peer's answers to `jobs` (lirpa_downstream_peer.py in auto_LiRPA's interpreter, files under `tmp`)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(STAND_INS), peer_path) if p))
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    subprocess.run([peer_python, str(PEER), str(tmp / "jobs.json"), str(tmp / "out.json")], env=env, check=True)
    return json.loads((tmp / "out.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--peer-python", default=str(ROOT / ".peers" / "auto_lirpa" / "bin" / "python"))
    ap.add_argument("--peer-path", default="")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    if not Path(args.peer_python).is_file():
        print(f"error: no peer interpreter at {args.peer_python}; build it with benchmarks/peers/auto_lirpa_setup.sh "
              "or pass --peer-python", file=sys.stderr)
        return 2
    for run_path in args.runs:
        dest = run_path / "downstream" / "lirpa.json"
        if dest.is_file() and not args.force:
            print(f"{run_path}: lirpa.json exists, skipped")
            continue
        with tempfile.TemporaryDirectory(prefix="lirpa-") as tmp:
            try:
                jobs, setting = jobs_for(run_path, Path(tmp))
            except FileNotFoundError as e:
                print(e)
                continue
            peer = run_peer(jobs, Path(tmp), args.peer_python, args.peer_path)
        atomic_write_json(dest, record(peer, setting))
        print(f"{run_path}: {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
