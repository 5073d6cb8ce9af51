"""A `pipeline run` child process for tests/test_run_lock_signals.py (not a test module).

    python tests/_held_run.py VARIANT:EPOCH ACTION pipeline-run-arguments...

Right after the checkpoint of VARIANT:EPOCH (the train stage's fault-injection point, the one reproducible
place to act: epochs take milliseconds) it does ACTION: `pause` writes PAUSED beside the run's out_dir
argument's folder and sleeps until killed; `TERM` or `INT` sends that signal to itself, as Slurm or Ctrl-C would.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pipeline.train_loop as train_mod
from pipeline.cli import main

if __name__ == "__main__":
    at, action, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    out = Path(next(a.split("=", 1)[1] for a in argv if a.startswith("out_dir=")))

    def act(variant: str, epoch: int) -> None:
        if f"{variant}:{epoch}" != at:
            return
        if action == "pause":
            (out / "PAUSED").write_text(str(os.getpid()))
            time.sleep(600)
        else:
            os.kill(os.getpid(), getattr(signal, f"SIG{action}"))
            time.sleep(5)  # the handler runs at the next bytecode; this is never reached to its end

    train_mod._fault_injection = act
    # a shell starts background jobs with SIGINT ignored, and Python keeps an ignored SIGINT: restore what a
    # terminal's Ctrl-C meets, so the test does not depend on how the suite was launched
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main(["run", *argv]))
