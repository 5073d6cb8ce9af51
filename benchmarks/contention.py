"""The default run's train + harden on a shared CPU: idle, then beside one competing process that keeps every
core busy (a torch matrix-product loop with as many threads as cores), both with the default `threads=0`
(auto: the cores not already busy when the run starts). Writes benchmarks/contention.json and CONTENTION.md.

    python -m benchmarks.contention                 # the default run (minutes)
    python -m benchmarks.contention train.epochs=4  # overrides for both runs

Goal (GPU issue, CPU part): train + harden beside the competing process ≤ 2.5× its idle time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GOAL = 2.5

HOG = r"""
import os, torch
torch.set_num_threads(os.cpu_count())
a = torch.randn(1024, 1024)
while True:
    a = (a @ a).tanh_()
"""


def _train_harden(out: Path, name: str, overrides: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", f"out_dir={out}", f"name={name}",
                           "stages=train,harden", *overrides], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"pipeline run failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    stages = json.loads((out / name / "manifest.json").read_text())["stages"]
    return {"wall_s": round(wall, 1), "train_harden_s": round(stages["train"]["seconds"] + stages["harden"]["seconds"], 1),
            "threads": stages["train"].get("threads")}


def main(argv: list[str] | None = None) -> int:
    overrides = list(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="contention-") as tmp:
        load_before = os.getloadavg()
        idle = _train_harden(Path(tmp), "idle", overrides)
        hog = subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(5)  # the competitor at full speed before the run samples the busy cores (threads=0)
            load_busy = os.getloadavg()
            busy = _train_harden(Path(tmp), "busy", overrides)
        finally:
            hog.kill()
            hog.wait()
    ratio = busy["train_harden_s"] / idle["train_harden_s"]
    result = {"cores": os.cpu_count(), "overrides": overrides, "idle": idle, "busy": busy, "ratio": round(ratio, 3),
              "goal": GOAL, "met": ratio <= GOAL, "load_before": load_before, "load_with_competitor": load_busy,
              "competitor": "one process: a 1024×1024 torch matrix-product loop on every core",
              "date": time.strftime("%Y-%m-%d %H:%M")}
    (HERE / "contention.json").write_text(json.dumps(result, indent=1) + "\n")
    (HERE / "CONTENTION.md").write_text(
        "# Train + harden on a shared CPU\n\n"
        f"`python -m benchmarks.contention {' '.join(overrides)}`, {result['date']}, {result['cores']} cores, default `threads=0` (auto).\n\n"
        "| | train + harden (s) | threads chosen | 1-min load at start |\n|---|---|---|---|\n"
        f"| idle | {idle['train_harden_s']} | {idle['threads']} | {load_before[0]:.2f} |\n"
        f"| beside one process keeping every core busy | {busy['train_harden_s']} | {busy['threads']} | {load_busy[0]:.2f} |\n\n"
        f"Ratio {ratio:.2f}× (goal ≤ {GOAL}×: {'met' if ratio <= GOAL else 'missed'}).\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
