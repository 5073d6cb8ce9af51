"""The verify stage on a GPU for the models the CPU measurements quote (issue 40's goals), ready for a lent machine.

    python -m benchmarks.gpu_verify_models --out $OUT                  # on the GPU machine (gpu_verify.sh, MODELS=1)
    python -m benchmarks.gpu_verify_models --device cpu --only cnn1632 --out /tmp/gvm train.epochs=1 verify.budget_s=5
                                                                  # the same path on a CPU, shortened

Each run of `analysis.robustness.coverage.MEASURED` (the runs the README's "decided" column quotes, one home for which
runs those are) is made again from its own committed config.json, every stage, with `verify.device=<device>` (train
and harden on the run's `device`, auto: the GPU there), under `--run-s` seconds each. Then, per run, this device's
verify stage beside the committed CPU one: float ReLU, smooth and int8 properties decided, the seconds (the CPU run's
solve seconds from its summary, this run's verify stage from its manifest) and each part's first pass (one CROWN pass per network, measured on its first property). The trained weights differ
from the CPU run's (another device's arithmetic), so the comparison is of the same recipe, not the same network.
Writes models.json and models.md into --out; the table is printed last.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def measured() -> dict[str, Path]:
    """{run name: its committed folder (summary.json, config.json)} for every run the coverage table quotes."""
    from analysis.robustness.coverage import BENCHMARKS, MEASURED

    return {Path(f).name: BENCHMARKS / f for folders in MEASURED.values() for f in folders}


def stage_facts(summary: dict[str, Any], seconds: float | None) -> dict[str, Any]:
    d = summary["decided"]
    return {"decided": {k: f"{d[k]['decided']}/{d[k]['properties']}" for k in ("relu", "smooth", "int8") if k in d},
            "seconds": seconds, "first_pass": {part: {"needed_s": fp.get("needed_s"), "covered": fp.get("covered")}
                                                for part, fp in summary.get("first_pass", {}).items()}}


def run_one(name: str, folder: Path, work: Path, device: str, limit_s: float, python: str,
            overrides: list[str]) -> dict[str, Any]:
    config = json.loads((folder / "config.json").read_text())
    config.update(name=name, out_dir=str(work))
    cfg = work / f"{name}.config.json"
    cfg.write_text(json.dumps(config))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([python, "-m", "pipeline.cli", "run", "-c", str(cfg), f"verify.device={device}", *overrides],
                              capture_output=True, text=True, timeout=limit_s)
        status = "finished" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
    except subprocess.TimeoutExpired:
        status = f"stopped at {limit_s:.0f} s"
    wall = time.perf_counter() - t0
    run = work / name
    out: dict[str, Any] = {"status": status, "wall_s": round(wall, 1)}
    if (run / "verify" / "summary.json").is_file():
        manifest = json.loads((run / "manifest.json").read_text())
        out["device"] = stage_facts(json.loads((run / "verify" / "summary.json").read_text()),
                                    manifest["stages"]["verify"].get("seconds"))
        out["verify_device"] = manifest["stages"]["verify"].get("device")
    cpu = json.loads((folder / "summary.json").read_text())  # a committed run keeps its summary, not its manifest:
    out["cpu"] = stage_facts(cpu, round(cpu["solve_seconds"] + cpu.get("int8_solve_seconds", 0), 1))  # solve seconds
    return out


def markdown(rows: dict[str, dict[str, Any]], device: str) -> str:
    lines = [f"# The verify stage on {device} beside the committed CPU runs", "",
             "| run | status | float ReLU (cpu → here) | smooth | int8 | verify s (cpu solve → here stage) | first pass covered here |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        cpu, here = r["cpu"], r.get("device") or {"decided": {}, "seconds": None, "first_pass": {}}
        cell = lambda k: f"{cpu['decided'].get(k, '—')} → {here['decided'].get(k, '—')}"  # noqa: E731
        covered = ", ".join(f"{p}: {'yes' if f['covered'] else 'no'}" for p, f in here["first_pass"].items()) or "—"
        lines.append(f"| {name} | {r['status']} | {cell('relu')} | {cell('smooth')} | {cell('int8')} | "
                     f"{cpu['seconds']} → {here['seconds']} | {covered} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu-verify-models-out", help="where models.json and models.md go")
    p.add_argument("--device", default="cuda", help="verify.device for every run (cuda | cuda:N | cpu)")
    p.add_argument("--only", default="", help="comma-separated run names (default: every measured run)")
    p.add_argument("--run-s", type=float, default=240.0, help="seconds each run may take, every stage")
    p.add_argument("--work", default="/tmp/gpu-verify-models", help="where the runs are made")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="more config overrides for every run (a quick "
                   "check: train.epochs=1 verify.budget_s=5)")
    a = p.parse_args(argv)
    runs = measured()
    if a.only:
        unknown = sorted(set(a.only.split(",")) - set(runs))
        if unknown:
            raise SystemExit(f"--only: no measured run {', '.join(unknown)}; the measured runs: {', '.join(runs)}")
        runs = {k: v for k, v in runs.items() if k in a.only.split(",")}
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    rows = {}
    for name, folder in runs.items():
        print(f"[gpu_verify_models] {name}", flush=True)
        rows[name] = run_one(name, folder, work, a.device, a.run_s, sys.executable, a.overrides)
        (out / "models.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows, a.device)
    (out / "models.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
