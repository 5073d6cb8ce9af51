"""The stage runner: runs the selected stages of a run in order over its run directory, recording status,
times, outputs (sha256) and metrics in the manifest; finished stages are skipped and an interrupted one
resumes (the stage itself picks up its partial work).
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable

import torch

from . import config as config_mod
from . import distributed
from .config import Config
from .errors import PipelineError
from .rundir import RunDir, now
from .stages import DISTRIBUTED, STAGES, expand_redo, selected, validate


def create(cfg: Config, argv: list[str] | None = None) -> RunDir:
    """A new run directory for a validated config; under torchrun rank 0 creates it, the others open it."""
    validate(cfg)
    if distributed.world().distributed:
        return RunDir.open(distributed.on_main(lambda: RunDir.create(cfg, argv=argv).path))
    return RunDir.create(cfg, argv=argv)


def resume(path: str, overrides: list[str] | None = None) -> RunDir:
    """Reopen a run directory with its own config.json; overrides (e.g. a lower lr after a NaN) are
    validated, then recorded in config.json and the manifest."""
    run = RunDir.open(path)
    validate(run.cfg)
    if overrides:
        validate(config_mod.apply_overrides(run.cfg, overrides))
        if distributed.world().main:
            run.record_resume(overrides)
    return run


def run_pipeline(cfg: Config, run: RunDir, redo: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    # Under torchrun every rank runs the DISTRIBUTED stages together; rank 0 alone writes the
    # manifest and runs the other stages (the rest return after the last distributed stage).
    world = distributed.world()
    mark = run.mark_stage if world.main else (lambda *a, **k: None)
    log = log if world.main else (lambda msg: None)
    device = str(distributed.resolve_device(cfg.device))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    results: dict[str, Any] = {}
    redo = expand_redo(redo or [])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in redo if world.main else []:  # old outputs move to superseded/ so nothing stale is resumed and nothing is lost
        d = run.file(STAGES[name].directory)
        if d.is_dir():
            d.rename(run.dir("superseded") / f"{d.name}-{stamp}")
        if run.stage_status(name) is not None:
            run.mark_stage(name, status="pending")
    status = distributed.broadcast({s: run.stage_status(s) for s in STAGES} if world.main else None)
    for name in selected(cfg):
        stage = STAGES[name]
        if status[name] == "done":
            log(f"[{name}] done already, skipped")
            continue
        if world.distributed:
            if name not in DISTRIBUTED:
                if not world.main:
                    continue
            else:
                distributed.barrier()  # rank 0 has written everything earlier stages left
        log(f"[{name}] {stage.help}")
        started = time.time()
        mark(name, status="running", started=now(), device=device, seed=cfg.seed)
        try:
            metrics = stage.fn()(cfg, run)
        except BaseException as exc:
            msg = str(exc) if isinstance(exc, PipelineError) else "".join(traceback.format_exception_only(exc)).strip()
            mark(name, status="failed" if not isinstance(exc, KeyboardInterrupt) else "interrupted",
                 ended=now(), seconds=round(time.time() - started, 3), error=msg)
            raise
        mark(name, status="done", ended=now(), seconds=round(time.time() - started, 3),
             outputs=run.record_outputs(name, stage.directory) if world.main else {}, metrics=metrics, error=None)
        log(f"[{name}] done in {time.time() - started:.1f}s")
        results[name] = metrics
    return results
