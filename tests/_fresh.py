"""Run code as a user runs it: in a fresh Python process with nothing imported before it, this checkout first on the
path (PYTHONPATH), in a given folder. The README's and docs' blocks run through `run_fresh`, so an import that only
works after another module was imported (as by the test process itself) fails here as it would for the user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRESH_TIMEOUT_S = 600


def run_fresh(code: str, cwd: Path, timeout: float = FRESH_TIMEOUT_S) -> str:
    """Run `code` in a new interpreter in `cwd`; its stdout, or AssertionError with the last lines of its stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise AssertionError(f"the code exited {proc.returncode} in a fresh process:\n{tail}")
    return proc.stdout
