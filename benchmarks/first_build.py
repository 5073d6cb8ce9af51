"""Does the fused CPU kernel pay for itself? Its one-time build (a fresh cache, in a fresh process), and the
same `pipeline run` three ways: the kernel already built (every run after the first), the first run on a
machine (the build inside it), and the eager kernel (no build ever). Runs in turn, one process each."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from .common import load
from .end_to_end import bench_pipeline


def bench_build(cache: str) -> dict[str, Any]:
    """`python -m pipeline.kernels.cpu` (what .ci/setup runs) into an empty cache: the build, timed from outside."""
    env = {"LAMBDA_GELU_CACHE": cache}
    load0 = load()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeline.kernels.cpu"], capture_output=True, text=True, env={**os.environ, **env})
    return {"command": "LAMBDA_GELU_CACHE=<empty dir> python -m pipeline.kernels.cpu", "returncode": proc.returncode,
            "wall_s": round(time.perf_counter() - t0, 2), "output": proc.stdout.strip(), "load_before": load0, "load_after": load()}


def bench_first_build(overrides: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as build_cache, tempfile.TemporaryDirectory() as run_cache:
        build = bench_build(build_cache)
        runs = {"cpp, built": bench_pipeline(overrides, env={"LAMBDA_GELU_KERNEL": "cpp"}),
                "cpp, first run (builds)": bench_pipeline(overrides, env={"LAMBDA_GELU_KERNEL": "cpp", "LAMBDA_GELU_CACHE": run_cache}),
                "eager": bench_pipeline(overrides, env={"LAMBDA_GELU_KERNEL": "eager"})}
    saved = runs["eager"]["wall_s"] - runs["cpp, built"]["wall_s"]
    return {"build": build, "runs": runs, "saved_per_run_s": round(saved, 2),
            "runs_to_pay_back": (build["wall_s"] / saved) if saved > 0 else None}
