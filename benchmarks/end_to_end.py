"""Wall time of `pipeline run` in a subprocess, and where it goes: per-stage seconds from the run's
manifest (`stages.<name>.seconds`), plus the process start-up and everything outside the stages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import load


def bench_pipeline(overrides: list[str], timeout_s: float = 3600.0, keep_dir: Path | None = None,
                   env: dict[str, str] | None = None) -> dict[str, Any]:
    """`env`: extra environment variables for the run (e.g. the kernel choice or a fresh kernel cache)."""
    with tempfile.TemporaryDirectory() as d:
        out_dir = Path(keep_dir) if keep_dir else Path(d)
        cmd = [sys.executable, "-m", "pipeline.cli", "run", *overrides, f"out_dir={out_dir}", "name=bench-e2e"]
        load0 = load()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})})
        wall = time.perf_counter() - t0
        manifest_path = out_dir / "bench-e2e" / "manifest.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    stages = {name: {"seconds": s.get("seconds"), "status": s.get("status"), "threads": s.get("threads")}
              for name, s in manifest.get("stages", {}).items()}
    in_stages = sum(s["seconds"] or 0.0 for s in stages.values())
    res: dict[str, Any] = {
        "command": " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), "pipeline", "run", *overrides]),
        "returncode": proc.returncode,
        "wall_s": round(wall, 2), "stages": stages, "stages_total_s": round(in_stages, 2),
        "outside_stages_s": round(wall - in_stages, 2), "load_before": load0, "load_after": load(),
    }
    if proc.returncode != 0:
        res["stderr_tail"] = proc.stderr.strip().splitlines()[-20:]
    return res
