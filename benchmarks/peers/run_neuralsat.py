"""Run the peer verifier neuralsat 0.2.17 (installed by neuralsat_setup.sh) on every instance of a VNN-COMP
folder and write a VNN-COMP results.csv beside its witnesses, to compare row by row with `pipeline vnncomp`.

    .venv/bin/python -m benchmarks.peers.run_neuralsat runs/standins/mnist_fc --timeout 30 --jobs 2 \\
        --out runs/peers/mnist_fc-30s/neuralsat.csv [--rows 0:30]

One process per instance (neuralsat's own `main.py`, on the CPU, one torch / OpenMP / MKL thread), `--jobs` of
them at a time, each limited to the instance's limit (or `--timeout`) by neuralsat's --timeout and killed
`--grace` seconds after it. Flags: `--disable_stabilize` (its MIP tightening overruns the limit on the
size-limited Gurobi licence that comes with gurobipy), `--export_cex`; `--no-mip-verify` also turns off its
whole-network MIP on nets with at most 2 ReLU layers, which that licence refuses for 784-input nets.

Times: run_time is neuralsat's own clock (its last line of output, "<result>,<seconds>"), which starts after
its Python imports and covers reading the network and the property and verifying, as its --timeout does; the
process start-up before it (torch, gurobipy, onnx imports: seconds per instance, since every instance is a
new process) is left out, as the project's one `pipeline vnncomp` process pays its imports once and reports
reading the network as prepare_time. The whole-process wall time is kept in the JSON beside the CSV.
prepare_time is 0 (neuralsat has no separate preparation step). An answer given after the limit counts as
`timeout` (the answer itself is kept in the JSON). A process that dies without an answer is `error`, its
last line of output in the JSON.

Every sat witness is checked here in onnxruntime (`check_witness`): X inside the box (within float32 rounding),
the model's float32 output at X inside the unsafe set (tolerance 0), and how far the witness's Y values are
from it. results.csv is rewritten after every instance, so a killed run keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable

import numpy as np

from analysis.verification.problem import BOX_TOL
from analysis.verification.vnncomp import witness_path, write_results
from analysis.verification.vnnlib import parse_witness, read_instances_csv, read_vnnlib_all
from pipeline.atomic_io import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".peers" / "neuralsat"
ANSWERS = ("sat", "unsat", "timeout", "unknown")
_LAST = re.compile(r"^(\w+),([0-9.]+)$")  # neuralsat's last line of output: "<status>,<seconds>"


def source_dir(python: Path) -> Path:
    """neuralsat's source folder (its wheel installs a top-level package `src`; main.py runs from inside it)."""
    out = subprocess.run([str(python), "-c", "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('src').origin))"],
                         capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        raise SystemExit(f"error: neuralsat is not installed for {python}; run benchmarks/peers/neuralsat_setup.sh")
    return Path(out.stdout.strip())


def check_witness(onnx_path: Path, vnnlib_path: Path, witness: Path) -> dict[str, Any]:
    """A sat witness re-checked in onnxruntime on its X as float32: box excess (0 when inside), the unsafe
    margin (`VnnlibSpec.violation`: <= 0 means unsafe), and the largest |Y_witness - Y_onnxruntime|. Valid: the
    margin is <= 0 (tolerance 0) and the excess <= `problem.BOX_TOL` (a float32 X next to a float64 bound can
    round outside it by ~1e-8)."""
    from quantize import ort as ort_util

    x, y_w = parse_witness(witness.read_text())
    x32 = x.astype(np.float32)
    specs = read_vnnlib_all(vnnlib_path)
    sess = ort_util.session(onnx_path)
    y = ort_util.forward_flat(sess, x32.astype(np.float64))
    excess = [float(np.max(np.maximum(s.lb - x32, 0) + np.maximum(x32 - s.ub, 0))) for s in specs]
    k = int(np.argmin(excess))
    margin = specs[k].violation(y)
    return {"box_excess": excess[k], "unsafe_margin": margin, "valid": bool(excess[k] <= BOX_TOL and margin <= 0),
            "y_diff": float(np.max(np.abs(y - y_w))) if y_w.size == y.size else None}


def run_process(cmd: list[str], cwd: Path, env: dict[str, str], kill_after: float,
                memory_bytes: int | None = None) -> tuple[str, float, bool, int]:
    """One peer process on the CPU with one torch / OpenMP / MKL thread (`env` added to ours), killed after
    `kill_after` wall seconds: its stdout and stderr together, wall seconds, whether it was killed, its exit code.
    `memory_bytes` caps its address space, so that a peer that outgrows the machine fails alone instead of drawing the
    kernel's out-of-memory killer onto other jobs."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               **env)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    t0 = time.perf_counter()
    killed = False
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          preexec_fn=cap if memory_bytes else None) as proc:
        try:
            out, _ = proc.communicate(timeout=kill_after)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            killed = True
    return out, time.perf_counter() - t0, killed, proc.returncode


def run_one(python: Path, src: Path, folder: Path, onnx_rel: str, vnnlib_rel: str, limit: float, grace: float,
            log_dir: Path, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """One neuralsat process on one instance: its answer, wall seconds, and the witness text when sat."""
    with tempfile.TemporaryDirectory(prefix="neuralsat_") as tmp:
        result_file = Path(tmp) / "result.txt"
        cmd = [str(python), "main.py", "--net", str((folder / onnx_rel).resolve()), "--spec", str((folder / vnnlib_rel).resolve()),
               "--timeout", f"{limit:g}", "--device", "cpu", "--result_file", str(result_file), "--export_cex",
               "--disable_stabilize", "--verbosity", "1"]
        if settings:
            (Path(tmp) / "settings.json").write_text(json.dumps(settings))
            cmd += ["--setting_file", str(Path(tmp) / "settings.json")]
        out, wall, killed, returncode = run_process(cmd, src, {}, limit + grace)
        stem = witness_path(log_dir / "x.csv", onnx_rel, vnnlib_rel).stem
        atomic_write_text(log_dir / f"{stem}.log", out)
        lines = result_file.read_text().splitlines() if result_file.is_file() else []
        answer = lines[0].strip() if lines else None
        last = next((m for m in (_LAST.match(s.strip()) for s in reversed(out.splitlines())) if m), None)
        row: dict[str, Any] = {"onnx": onnx_rel, "vnnlib": vnnlib_rel, "limit": limit, "wall": wall, "killed": killed,
                               "answer": answer, "self_reported_seconds": float(last.group(2)) if last else None,
                               "returncode": returncode}
        if answer == "sat" and len(lines) > 1:
            row["witness"] = "sat\n" + "\n".join(lines[1:]) + "\n"
        if answer is None:
            tail = [s for s in out.splitlines() if s.strip()]
            row["message"] = "killed after the grace period" if killed else (tail[-1][:300] if tail else f"exit {returncode}")
        return row


def run_time(row: dict[str, Any]) -> float:
    """The peer's own seconds (after its imports), or the process's wall seconds where it printed none."""
    return row["self_reported_seconds"] if row["self_reported_seconds"] is not None else row["wall"]


def scored(row: dict[str, Any]) -> str:
    """The result that counts: the answer if given within the limit, else timeout; error without an answer."""
    if row["answer"] is None:
        return "timeout" if row["killed"] else "error"
    if row["answer"] not in ANSWERS:
        return "error"
    if row["answer"] in ("sat", "unsat") and run_time(row) > row["limit"]:
        return "timeout"
    return row["answer"]


def select_rows(rows: list[tuple[str, str, float]], spec: str | None) -> list[tuple[str, str, float]]:
    """The rows `--rows START:END` names (a Python slice of instances.csv's rows; all when None)."""
    if not spec:
        return rows
    a, _, b = spec.partition(":")
    return rows[slice(int(a) if a else None, int(b) if b else None)]


def run_rows(folder: Path, rows: list[tuple[str, str, float]], out: Path, category: str, jobs: int,
             timeout: float | None, run: Callable[[str, str, float, Path], dict[str, Any]], about: dict[str, Any]) -> None:
    """A peer on every row, `jobs` at a time: `run(onnx, vnnlib, limit, log_dir)` returns `run_one`'s row; each row is
    scored, its sat witness kept and checked in onnxruntime, and `out` (VNN-COMP's results.csv) and the JSON beside it
    (`about`, the folder, the rows) rewritten after every instance, so a killed run keeps what it finished."""
    log_dir = out.parent / f"{out.stem}-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    done: dict[int, dict[str, Any]] = {}

    def finish(i: int, row: dict[str, Any]) -> None:
        row["result"] = scored(row)
        wit = row.pop("witness", None)
        if row["result"] == "sat" and wit is not None:
            path = witness_path(out, row["onnx"], row["vnnlib"])
            atomic_write_text(path, wit)
            try:
                row["witness_check"] = check_witness(folder / row["onnx"], folder / row["vnnlib"], path)
            except (ValueError, OSError) as e:
                row["witness_check"] = {"valid": False, "error": str(e).splitlines()[0]}
        done[i] = row
        ordered = [done[k] for k in sorted(done)]
        write_results(out, [{"category": category, "onnx": r["onnx"], "vnnlib": r["vnnlib"], "prepare_time": 0.0,
                             "result": r["result"], "run_time": run_time(r)} for r in ordered])
        atomic_write_text(out.with_suffix(".json"), json.dumps({**about, "folder": str(folder), "jobs": jobs,
                                                                "rows": ordered}, indent=2) + "\n")
        print(f"{Path(row['onnx']).stem} {Path(row['vnnlib']).stem}: {row['result']} ({row['answer']}) "
              f"{run_time(row):.1f} s, process {row['wall']:.1f} s", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run, o, v, float(timeout if timeout is not None else t), log_dir): i
                   for i, (o, v, t) in enumerate(rows)}
        for fut in as_completed(futures):
            finish(futures[fut], fut.result())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="VNN-COMP benchmark folder (instances.csv, onnx/, vnnlib/)")
    p.add_argument("--out", required=True, help="results.csv to write; witnesses go to counterexamples/ beside it")
    p.add_argument("--timeout", type=float, default=None, help="wall seconds per instance (default: instances.csv's)")
    p.add_argument("--jobs", type=int, default=1, help="instances run at once (one core each)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds past the limit before a process is killed")
    p.add_argument("--rows", default=None, metavar="START:END", help="only these rows of instances.csv (Python slice)")
    p.add_argument("--instances", default="instances.csv")
    p.add_argument("--category", default=None, help="the category column (default: the folder's name)")
    p.add_argument("--python", default=str(VENV / "bin" / "python"), help="the neuralsat venv's python")
    p.add_argument("--no-mip-verify", action="store_true",
                   help="neuralsat's use_mip_verify off: on networks with at most 2 ReLU layers it otherwise tries one "
                        "MIP of the whole network first, which the size-limited Gurobi licence refuses on 784-input nets "
                        "(\"Model too large for size-limited license\"; neuralsat then exits with an error)")
    args = p.parse_args(argv)
    folder, python = Path(args.folder), Path(args.python)
    if not python.is_file():
        print(f"error: {python} is missing; run benchmarks/peers/neuralsat_setup.sh first", file=sys.stderr)
        return 2
    if not (folder / args.instances).is_file():
        print(f"error: {folder / args.instances} is missing: a VNN-COMP benchmark folder lists its instances there", file=sys.stderr)
        return 2
    src = source_dir(python)
    rows_in = select_rows(read_instances_csv(folder / args.instances), args.rows)
    flags = "--device cpu --disable_stabilize --export_cex" + (" use_mip_verify=false" if args.no_mip_verify else "")
    settings = {"use_mip_verify": False} if args.no_mip_verify else None
    run_rows(folder, rows_in, Path(args.out), args.category or folder.name, args.jobs, args.timeout,
             lambda o, v, limit, log_dir: run_one(python, src, folder, o, v, limit, args.grace, log_dir, settings),
             {"tool": "neuralsat 0.2.17", "flags": flags})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
