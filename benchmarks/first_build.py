"""Does the fused CPU kernel pay for itself? Its one-time build (a fresh cache, in a fresh process), and the
same `pipeline run` three ways, in turn, `reps` times: the kernel already built (every run after the first),
the first run on a machine (the build inside it), and the eager kernel (no build ever). The kernel only
changes the train and harden stages, so those are what the runs time (`stages=train,harden`)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from .common import load
from .end_to_end import bench_pipeline

KERNELS = {"cpp, built": {"LAMBDA_GELU_KERNEL": "cpp"}, "cpp, first run (builds)": {"LAMBDA_GELU_KERNEL": "cpp"},
           "eager": {"LAMBDA_GELU_KERNEL": "eager"}}


def bench_build(cache: str) -> dict[str, Any]:
    """`python -m pipeline.kernels.cpu` (what .ci/setup runs) into an empty cache: the build, timed from outside."""
    load0 = load()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeline.kernels.cpu"], capture_output=True, text=True,
                          env={**os.environ, "LAMBDA_GELU_CACHE": cache})
    return {"command": "LAMBDA_GELU_CACHE=<empty dir> python -m pipeline.kernels.cpu", "returncode": proc.returncode,
            "wall_s": round(time.perf_counter() - t0, 2), "output": proc.stdout.strip(), "load_before": load0, "load_after": load()}


def bench_first_build(overrides: list[str], reps: int = 2) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in KERNELS}
    with tempfile.TemporaryDirectory() as build_cache:
        build = bench_build(build_cache)
    for _ in range(reps):
        for label, env in KERNELS.items():
            with tempfile.TemporaryDirectory() as fresh:
                extra = {"LAMBDA_GELU_CACHE": fresh} if "first run" in label else {}
                runs[label].append(bench_pipeline(overrides, env={**env, **extra}))
    median = {k: statistics.median(r["wall_s"] for r in rs) for k, rs in runs.items()}
    saved = median["eager"] - median["cpp, built"]
    return {"build": build, "reps": reps, "runs": runs, "median_wall_s": median, "saved_per_run_s": round(saved, 2),
            "first_run_extra_s": round(median["cpp, first run (builds)"] - median["cpp, built"], 2),
            "runs_to_pay_back": (build["wall_s"] / saved) if saved > 0 else None}
