"""One torchrun worker for tests/test_ddp.py (not a test module).

    torchrun --standalone --nproc_per_node=2 tests/_ddp_worker.py OUT_DIR [overrides...]

Runs `pipeline run` like a user would, with two spies: every file write the pipeline makes
(atomic bytes/text/json/csv and checkpoint saves) is logged per rank, and the model each rank
trained is captured, so the test can compare the ranks' final weights and λ in memory.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

import pipeline.checkpoint as checkpoint_mod
import pipeline.distributed as distributed
import pipeline.atomic_io as atomic_io
import pipeline.stages.train as train_stage
import pipeline.train_loop as train_mod
from pipeline.cli import main


def _spy(out: Path, rank: int) -> tuple[list[str], dict[str, torch.nn.Module]]:
    writes: list[str] = []
    models: dict[str, torch.nn.Module] = {}
    write_bytes, atomic_path, wrap = atomic_io.atomic_write_bytes, atomic_io.atomic_path, distributed.wrap

    def spy_bytes(path, data):
        writes.append(str(path))
        return write_bytes(path, data)

    @contextmanager
    def spy_path(path):
        writes.append(str(path))
        with atomic_path(path) as tmp:
            yield tmp

    def spy_wrap(model, device, find_unused):
        from pipeline.activations import Gate, hardenable_gates

        # One wrap per variant and stage; the harden stage's model is the final one.
        kind = "lambda_gelu" if hardenable_gates(model) else "gelu" if any(isinstance(m, Gate) for m in model.modules()) else "relu"
        models[kind] = model
        return wrap(model, device, find_unused)

    # Every writer in the package ends in one of these two (text/json/csv call atomic_write_bytes).
    atomic_io.atomic_write_bytes = train_mod.atomic_write_bytes = train_stage.atomic_write_bytes = spy_bytes
    atomic_io.atomic_path = checkpoint_mod.atomic_path = spy_path
    distributed.wrap = spy_wrap
    return writes, models


if __name__ == "__main__":
    out, overrides = Path(sys.argv[1]), sys.argv[2:]
    rank = int(os.environ["RANK"])
    writes, models = _spy(out, rank)
    code = main(["run", *overrides])
    # The test's own outputs, outside the run directory.
    torch.save({k: {n: t.detach().cpu().clone() for n, t in m.state_dict().items()} for k, m in models.items()},
               out / f"rank{rank}-state.pt")
    (out / f"rank{rank}-writes.json").write_text(json.dumps({"code": code, "writes": writes}))
    sys.exit(code)
