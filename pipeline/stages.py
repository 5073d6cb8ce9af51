"""Stage registry and runner. A stage is `fn(cfg, run) -> metrics` that writes only under its own
directory; the runner records status, times, outputs (sha256) and metrics in the manifest, skips
finished stages and resumes an interrupted one (the stage itself picks up its partial work).
"""

from __future__ import annotations

import importlib
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .config import Config
from .errors import PipelineError
from .rundir import RunDir, _now


@dataclass(frozen=True)
class Stage:
    target: str  # "module:function", imported on use so `pipeline stages` stays fast
    directory: str  # where the stage writes (train and harden share train/)
    help: str

    def fn(self) -> Callable[[Config, RunDir], dict[str, Any]]:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


# In run order.
STAGES: dict[str, Stage] = {
    "train": Stage("pipeline.train:run_train", "train", "learn weights and λ for the first 25% of epochs (Algorithm 1, line 1)"),
    "harden": Stage("pipeline.train:run_harden", "train", "freeze s, anneal λ linearly to λ_target, keep the best-validation checkpoint"),
    "check": Stage("analysis.check:run_check", "check", "bounds: sympy closed forms, per-layer check on validation pre-activations, swap certificate"),
    "swap": Stage("pipeline.swap:run_swap", "swap", "replace every gate of the best checkpoint by ReLU and re-evaluate, no weight update"),
    "export": Stage("quantize.export:run_export", "export", "fp32 ONNX (opset 20, onnxsim, dynamic batch) of the smooth and the swapped models, checked against PyTorch"),
    "int8": Stage("quantize.int8:run_int8", "quantize", "onnxruntime static int8 (QDQ, per-channel): accuracy, size, latency, op counts, SQNR"),
    "sparsity": Stage("analysis.sparsity:run_sparsity", "sparsity", "APoZ of the swapped ReLU models, dead units pruned losslessly and exported"),
    "verify": Stage("analysis.verify:run_verify", "verify", "L∞ robustness of the swapped float ReLU models (VNN-COMP layout, Marabou/MILP, unstable ReLUs)"),
    "report": Stage("analysis.report:run_report", "report", "report.md with tables and figures from every stage above"),
}


# Stages every torchrun rank runs together (data-parallel training); the others run on rank 0 only.
DISTRIBUTED = {"train", "harden"}


def selected(cfg: Config) -> list[str]:
    return [s for s in STAGES if not cfg.stages or s in cfg.stages]


def expand_redo(names: list[str]) -> list[str]:
    """Redoing a stage redoes every later one, and starts at the first stage sharing its directory."""
    order = list(STAGES)
    for n in names:
        if n not in STAGES:
            raise PipelineError(f"--redo {n}: unknown stage; choose from {', '.join(order)}")
    if not names:
        return []
    first = min(order.index(n) for n in names)
    first = min(i for i, s in enumerate(order) if STAGES[s].directory == STAGES[order[first]].directory)
    return order[first:]


def run_pipeline(cfg: Config, run: RunDir, redo: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    from . import distributed
    from .train import resolve_device

    # Under torchrun every rank runs the DISTRIBUTED stages together; rank 0 alone writes the
    # manifest and runs the other stages (the rest return after the last distributed stage).
    world = distributed.world()
    mark = run.mark_stage if world.main else (lambda *a, **k: None)
    log = log if world.main else (lambda msg: None)
    device = str(resolve_device(cfg.device))
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
        mark(name, status="running", started=_now(), device=device, seed=cfg.seed)
        try:
            metrics = stage.fn()(cfg, run)
        except BaseException as exc:
            msg = str(exc) if isinstance(exc, PipelineError) else "".join(traceback.format_exception_only(exc)).strip()
            mark(name, status="failed" if not isinstance(exc, KeyboardInterrupt) else "interrupted",
                 ended=_now(), seconds=round(time.time() - started, 3), error=msg)
            raise
        mark(name, status="done", ended=_now(), seconds=round(time.time() - started, 3),
             outputs=run.record_outputs(name, stage.directory) if world.main else {}, metrics=metrics, error=None)
        log(f"[{name}] done in {time.time() - started:.1f}s")
        results[name] = metrics
    return results
