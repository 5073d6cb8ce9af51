"""The stage runner: runs the selected stages of a run (`pipeline/stages/`) in order over its run directory,
recording status, times, outputs (sha256) and metrics in the manifest; finished stages are skipped and an interrupted
one resumes (the stage itself picks up its partial work). With the stages and the CLI it is the top layer.
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable

import torch

from . import activations, data, distributed, models, plugins
from . import config as config_mod
from .config import Config
from .config import validate as validate_fields
from .data import dataset_for
from .cores import choose_threads
from .errors import CheckpointError, PipelineError
from .atomic_io import hold, release
from .rundir import RunDir, now
from .stages import DISTRIBUTED, STAGES, check_names, check_outputs, expand_redo, first_readers, selected


def validate(cfg: Config) -> Config:
    """Everything a run checks before it starts: fields, registry names (plug-ins registered first), and each
    stage's own hook."""
    validate_fields(cfg)
    plugins.load()
    data.check_config(cfg.data)
    models.check_config(cfg.model)
    activations.check_names(cfg.variants)
    check_names(cfg.stages)
    for stage in STAGES.values():
        if stage.validate:
            stage.validate(cfg)
    return cfg


def create(cfg: Config, argv: list[str] | None = None) -> RunDir:
    """A new run directory for a config that has passed every check that can be made before training:
    fields, registry names, the device and the data (loaded once here, cached for the stages). Nothing is
    created for a config that cannot run. Under torchrun rank 0 creates it and the others open it."""
    validate(cfg)
    distributed.resolve_device(cfg.device)
    dataset_for(cfg)
    if distributed.world().distributed:
        run = RunDir.open(distributed.on_main(lambda: RunDir.create(cfg, argv=argv).path))
    else:
        run = RunDir.create(cfg, argv=argv)
    if distributed.world().main:
        hold(run.path)  # until run_pipeline ends: an existing run of the same name may be running elsewhere
    return run


# Which stage first reads each config section, from what each stage declares it reads (`Stage.reads`).
FIRST_STAGE = first_readers()
# Keys that may change while their stages are under way or partly done: they change no shape and no schedule,
# only how the remaining epochs run (the usual fix after a divergence is a lower train.lr), and every stage
# listed still reads them.
TUNABLE = {"train.lr": ("train", "harden"), "train.grad_clip": ("train", "harden"),
           "train.divergence_factor": ("train", "harden"), "train.precision": ("train", "harden"),
           "train.compile": ("train", "harden"), "train.compile_mode": ("train", "harden"),
           "train.cuda_graph": ("train", "harden"), "data.eval_batch_size": tuple(STAGES)}
FREE = {"stages", "device", "threads"}  # what to run, and where: never changes a result's meaning
NEVER = {"name", "out_dir"}


def _changed_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [k for key in old for k in _changed_keys(old[key], new[key], f"{prefix}{key}.")]
    return [prefix[:-1]] if old != new else []


def check_overrides(run: RunDir, new: Config, redo: list[str]) -> list[dict[str, str]]:
    """Which `--resume` overrides can apply to what exists, and from which stage; raises for the others with
    the `--redo` that would apply them. A key whose first stage is done, or has started and would change
    shape or schedule mid-way, cannot apply to the files it already wrote."""
    redone = set(expand_redo(redo))
    accepted = []
    for key in _changed_keys(run.cfg.to_dict(), new.to_dict()):
        if key in NEVER:
            raise PipelineError(f"{key} cannot change on --resume (it names the run directory); start a new run instead")
        if key in FREE or key.split(".")[0] in FREE:
            accepted.append({"key": key, "from_stage": "now"})
            continue
        readers = TUNABLE.get(key)
        if readers:
            pending = [s for s in readers if s in redone or run.stage_status(s) != "done"]
            if pending:
                accepted.append({"key": key, "from_stage": pending[0]})
                continue
            first = readers[0]
        else:
            first = FIRST_STAGE[key.split(".")[0]]
            status = run.stage_status(first)
            if first in redone or status in (None, "pending"):
                accepted.append({"key": key, "from_stage": first})
                continue
        state = "is done" if run.stage_status(first) == "done" else "has started"
        raise PipelineError(f"{key} takes effect from the {first} stage, which {state} in {run.path}; apply it with "
                            f"`pipeline run --resume {run.path} {key}=... --redo {first}` (the old outputs move to superseded/)")
    return accepted


def resume(path: str, overrides: list[str] | None = None, redo: list[str] | None = None) -> RunDir:
    """Reopen a run directory with its own config.json. Overrides (e.g. a lower lr after a divergence) are
    checked against what the run has done before anything is written; accepted ones go into config.json
    and the manifest with the stage they take effect from. The run directory is held for this process from
    here to the end of `run_pipeline` (a second process is refused with this one's pid)."""
    RunDir.open(path)  # "not a run directory" before anything is created in it
    if distributed.world().main:
        hold(path)
    try:
        return _reopen(path, overrides, redo)
    except BaseException:
        release(path)
        raise


def _reopen(path: str, overrides: list[str] | None, redo: list[str] | None) -> RunDir:
    run = RunDir.open(path)
    validate(run.cfg)
    if overrides:
        new = validate(config_mod.apply_overrides(config_mod.from_dict(run.cfg.to_dict()), overrides))
        accepted = check_overrides(run, new, redo or [])
        distributed.resolve_device(new.device)
        run.cfg = new
        if distributed.world().main:
            run.record_resume(overrides, accepted)
    return run


def closing_lines(run: RunDir) -> list[str]:
    """What a run must not end in silence about, from the manifest's stage metrics, repeated at its end: a selected
    checkpoint below its λ_target (train/harden), an int8 model below quantize.agreement_floor, every network the verify
    stage did not verify, with its reason."""
    stages = run.manifest()["stages"]
    out = []
    for name in ("train", "harden"):
        for variant, m in (stages.get(name, {}).get("metrics") or {}).items():
            if isinstance(m, dict) and m.get("warning"):
                out.append(f"WARNING ({name}) {m['warning']}")
    for warning in (stages.get("int8", {}).get("metrics") or {}).get("warnings") or []:
        out.append(f"WARNING (int8) {warning}")
    for model, why in ((stages.get("verify", {}).get("metrics") or {}).get("not_verified") or {}).items():
        out.append(f"NOT VERIFIED {model}: {why}")
    return out


def run_pipeline(cfg: Config, run: RunDir, redo: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the selected stages (`_run_stages`) holding the run directory, which is let go at the end: `create`
    and `resume` took it already, a direct caller takes it here."""
    main = distributed.world().main
    if main:
        hold(run.path)
    try:
        return _run_stages(cfg, run, redo, log)
    finally:
        if main:
            release(run.path)


def _run_stages(cfg: Config, run: RunDir, redo: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    # Under torchrun every rank runs the DISTRIBUTED stages together; rank 0 alone writes the
    # manifest and runs the other stages (the rest return after the last distributed stage).
    world = distributed.world()
    mark = run.mark_stage if world.main else (lambda *a, **k: None)
    log = log if world.main else (lambda msg: None)
    resolved = distributed.resolve_device(cfg.device)  # once per run; every stage reads it from run.device
    run.device = resolved
    device = str(resolved)
    threads = choose_threads(cfg.threads)
    torch.set_num_threads(threads)
    results: dict[str, Any] = {}
    redo = expand_redo(redo or [])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in redo if world.main else []:  # old outputs move to superseded/ so nothing stale is resumed and nothing is lost
        d = run.file(STAGES[name].directory)
        if d.is_dir():
            dest, k = run.dir("superseded") / f"{d.name}-{stamp}", 1
            while dest.exists():  # two redos within one second: keep both, never rename onto the first
                dest, k = run.dir("superseded") / f"{d.name}-{stamp}-{k}", k + 1
            d.rename(dest)
        if run.stage_status(name) is not None:
            run.mark_stage(name, status="pending", before={})
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
        log(f"[{name}] {stage.describe(cfg)}")
        started = time.time()
        # What the stage directory held when the stage first started (a resumed stage keeps its first snapshot),
        # so the manifest records every file the stage wrote, across interruptions.
        before = (run.manifest()["stages"].get(name, {}).get("before") or run.snapshot(stage.directory)) if world.main else {}
        mark(name, status="running", started=now(), device=stage.device(device, cfg), threads=threads, seed=cfg.seed, before=before)
        try:
            metrics = stage.run(cfg, run)
        except CheckpointError as exc:  # name the stage that wrote the file, so the advice leads to a correct run
            writer = run.writer_of(exc.path) if world.main and exc.path else None
            msg = f"{exc}; rerun the stage that wrote it: `pipeline run --resume {run.path} --redo {writer or name}`"
            mark(name, status="failed", ended=now(), seconds=round(time.time() - started, 3), error=msg)
            raise CheckpointError(msg, exc.path) from None
        except BaseException as exc:
            msg = str(exc) if isinstance(exc, PipelineError) else "".join(traceback.format_exception_only(exc)).strip()
            mark(name, status="failed" if not isinstance(exc, KeyboardInterrupt) else "interrupted",
                 ended=now(), seconds=round(time.time() - started, 3), error=msg)
            raise
        outputs = run.record_outputs(name, stage.directory, before) if world.main else {}
        # a file the stage's declaration does not match is the stage's bug, not the user's: said in one line and
        # recorded, never a reason to throw the finished stage away (the e2e tests hold the built-in stages to it)
        mismatch = check_outputs(name, run, cfg.variants, outputs) if world.main else None
        if mismatch:
            log(f"warning: {mismatch}")
        mark(name, status="done", ended=now(), seconds=round(time.time() - started, 3), outputs=outputs, metrics=metrics,
             error=None, outputs_mismatch=mismatch)
        log(f"[{name}] done in {time.time() - started:.1f}s")
        results[name] = metrics
    return results
