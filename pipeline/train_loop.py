"""Algorithm 1's loop over one variant of a run (`train_variant`), which the `train` and `harden` stages
(`pipeline/stages/train.py`) call: the train stage for epochs 1..e_s (λ learned), the harden stage for e_s+1..T (s
frozen, λ annealed to λ_target, `harden.method=anneal`; or every gate swapped to ReLU and fine-tuned, `swap`). The
schedule itself is `pipeline.hardener.Hardener`; this module is the loop around it: data order, the optimizer,
checkpoints, selection and its checks. It reads each variant's facts from its record (`pipeline.variant_record`),
which the train stage decides: nothing here derives them again.

Every epoch ends with `last.pt` (weights, optimizer, hardener and selection state, history) written
atomically, so a killed run resumes at the next epoch with the same numbers. Resume state is validated
before it is used: a missing or corrupt `last.pt` falls back to `switch.pt` (the state at e_s, with
`switch_best.pt`) in the harden stage, else the variant restarts from its own epoch 1; never from the middle.

The loop does not wait on the host: loss, accuracy and the first non-finite batch are summed on the device
and read once per epoch. A non-finite loss or a divergence (`train.divergence_factor`) stops the run with the
epoch named, before that epoch's checkpoint is written.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import signal
import time
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import checkpoint, distributed, step_graph
from .config import Config
from .data import Dataset, Split, augment, batches, on_device
from .errors import CheckpointError, TrainingError
from .evaluate import METRICS, evaluate, worst
from .evaluate import loss as cross_entropy
from .hardener import HARDENED_RTOL, Hardener
from .models import build_model, make_spec
from .progress import Progress
from .variant_record import VariantRecord
from .relu_swap import relu_spec, to_relu
from .atomic_io import atomic_write_bytes, atomic_write_csv, atomic_write_json
from .rundir import RunDir
from .schedule import lr_at

# (param groups, train config, capturable: its step may be captured in a CUDA graph, fused: one kernel per parameter
# group and step on CUDA instead of one per foreach operation: the hardness parameters' group costs one launch, not four)
OPTIMIZERS = {
    "sgd": lambda groups, cfg, capturable=False, fused=False: torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum,
                                                                              fused=fused or None),
    "adamw": lambda groups, cfg, capturable=False, fused=False: torch.optim.AdamW(groups, lr=cfg.lr, capturable=capturable,
                                                                                  fused=fused or None),
}
NO_BATCH = 2**62  # "no non-finite batch yet" in the device-side first-bad-batch index


# ---------------------------------------------------------------------------------------------
# One epoch


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The data order of an epoch depends only on (seed, epoch): a resumed run sees the same batches."""
    return torch.Generator().manual_seed(seed * 100_003 + epoch)


class EpochSums:
    """The epoch's running sums on the device, read once at its end: loss·examples, correct predictions, the first
    non-finite batch, and the first batch's loss·examples (the untrained model's loss, before any update)."""

    def __init__(self, device):
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self.first_bad = torch.full((), NO_BATCH, dtype=torch.int64, device=device)
        self.first = torch.zeros((), dtype=torch.float64, device=device)

    def reset(self) -> None:
        self.loss.zero_()
        self.correct.zero_()
        self.first_bad.fill_(NO_BATCH)
        self.first.zero_()


def _step(model, opt, x: torch.Tensor, y: torch.Tensor, b, sums: EpochSums, cfg: Config, device,
          world: distributed.World, dtype, autocast) -> None:
    """One optimizer step on a (global) batch; adds it to `sums`. `b` is the batch index: an int, or a device
    tensor inside a CUDA graph (`pipeline.step_graph`). Nothing here reads the device on the host."""
    with autocast or contextlib.nullcontext():
        if world.distributed:
            loss, stats = _ddp_step(model, x, y, world, device, dtype)
            batch_sum, batch_correct = stats[0], stats[1].long()
        else:
            x, y = _to(x, device, dtype), y.to(device, non_blocking=True)
            logits = model(x)
            loss = cross_entropy(logits, y)
            batch_sum = loss.detach().double() * len(y)
            batch_correct = (logits.argmax(-1) == y).sum()
    sums.first += torch.where(b == 0, batch_sum, 0.0) if isinstance(b, torch.Tensor) else (batch_sum if b == 0 else 0.0)
    sums.first_bad.copy_(torch.minimum(sums.first_bad, torch.where(torch.isfinite(batch_sum), NO_BATCH, b)))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.train.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
    opt.step()
    sums.loss += batch_sum
    sums.correct += batch_correct


def _train_epoch(model, opt, split: Split, cfg: Config, epoch: int, device,
                 world: distributed.World = distributed.World(), hardener: Hardener | None = None,
                 autocast: contextlib.AbstractContextManager | None = None,
                 graphs: step_graph.GraphSteps | None = None) -> dict[str, float]:
    """One pass over `split`. Sums stay on the device (read once at the end); returns the mean loss, the
    top-1 rate, the loss of the first batch before any update, and the first non-finite batch (or None).
    With `graphs`, every full batch is a replay of a captured step (the same kernels; `pipeline.step_graph`)."""
    model.train()
    dtype = torch.float64 if cfg.train.precision == "fp64" else None
    g = epoch_generator(cfg.seed, epoch)
    aug = torch.Generator().manual_seed(2**40 + cfg.seed * 100_003 + epoch) if cfg.data.augment != "none" else None
    n_batches = -(-len(split) // cfg.data.batch_size)
    step_schedule = hardener is not None and cfg.harden.schedule == "step"
    sums = graphs.sums if graphs is not None else EpochSums(device)
    sums.reset()
    per_example = split.y[0].numel() if len(split) else 1

    def before(b: int) -> None:
        if step_schedule:
            hardener.start_step(epoch, b, n_batches)

    def step(x, y, b) -> None:
        _step(model, opt, x, y, b, sums, cfg, device, world, dtype, autocast)

    if graphs is not None:
        order = torch.randperm(len(split), generator=g)  # the order `batches` draws: the same for any device
        graphs.run_epoch(order, step_graph.capture_key(model, opt), step, before, lambda: opt.zero_grad(set_to_none=True))
        rest = order[graphs.full * graphs.B:]
        tail = [(split.x[rest.to(split.x.device)], split.y[rest.to(split.x.device)])] if len(rest) else []
        start = graphs.full
    else:
        tail, start = batches(split, cfg.data.batch_size, g), 0
    for b, (x, y) in enumerate(tail, start):
        if aug is not None:
            x = augment(x, cfg.data.augment, aug)  # the global batch: the same images for any number of ranks
        before(b)
        step(x, y, b)
    bad = int(sums.first_bad)  # the one host read of the epoch (with the three below)
    n = len(split)
    first_n = min(cfg.data.batch_size, n)
    return {"train_loss": float(sums.loss) / n, "train_top1": int(sums.correct) / (n * per_example),
            "first_loss": float(sums.first) / first_n, "nonfinite_batch": None if bad == NO_BATCH else bad}


def _to(x: torch.Tensor, device, dtype: torch.dtype | None) -> torch.Tensor:
    """A batch onto the device (non-blocking from pinned memory), floats in the training dtype."""
    return x.to(device, dtype if dtype is not None and x.is_floating_point() else None, non_blocking=True)


def _ddp_step(model, x: torch.Tensor, y: torch.Tensor, world: distributed.World, device, dtype=None):
    """Forward this rank's share of a global batch. The loss is the share's summed cross-entropy
    times world_size / (elements in the global batch): DDP averages gradients over ranks, so the
    update equals the single-process one on the whole batch, however unevenly the batch splits.
    Returns (loss, [loss·examples, correct, examples] summed over ranks, on the device)."""
    n_global, per_example = len(y), y[0].numel()
    x, y = distributed.shard(x, y, world)
    x, y = _to(x, device, dtype), y.to(device, non_blocking=True)
    logits = model(x)
    loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
    loss = loss_sum * (world.size / (n_global * per_example))
    stats = torch.stack([loss_sum.detach().double() / per_example, (logits.argmax(-1) == y).sum().double(),
                         torch.tensor(float(len(y)), dtype=torch.float64, device=loss_sum.device)])
    return loss, distributed.all_sum(stats)


# ---------------------------------------------------------------------------------------------
# Checkpoint selection (harden.select)


def _selects(select: str, metric: str, value: float, hardened: bool, best: dict[str, Any]) -> bool:
    """Does this epoch replace the selected checkpoint? `value` is what `select` ranks by (the smooth or the
    swapped validation metric). Ties go to the later epoch (more hardened); `last` takes every epoch. Under
    best_hardened a hardened epoch beats any unhardened one: until the first, best.pt holds the best
    validation epoch so far (so a stage reading it mid-run finds one)."""
    if select == "last" or best["value"] is None:
        return True
    if select == "best_hardened" and hardened != bool(best.get("hardened")):
        return hardened
    return value >= best["value"] if METRICS[metric][1] else value <= best["value"]


# ---------------------------------------------------------------------------------------------
# Resume state


def _valid(payload: dict[str, Any], variant: str) -> None:
    st = payload.get("state")
    if not isinstance(st, dict) or any(k not in st for k in ("epoch", "history", "hardener", "best")):
        raise CheckpointError(f"{variant}: resume state lacks epoch/history/hardener/best")
    if len(st["history"]) != st["epoch"] or [r["epoch"] for r in st["history"]] != list(range(1, st["epoch"] + 1)):
        raise CheckpointError(f"{variant}: resume state's history does not cover epochs 1..{st['epoch']}")


def _set_aside(path, why: str, log) -> None:
    """Keep an unusable checkpoint for inspection (never delete work), out of the resume path."""
    dest = path.with_name(f"{path.name}.unusable-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, dest)
    log(f"    {path.parent.name}/{path.name} is unusable ({why}); kept as {dest.name}")


def _resume_payload(vdir, variant: str, harden_phase: bool, device, log) -> tuple[dict[str, Any] | None, str]:
    """The newest valid resume state: last.pt, else (harden stage) switch.pt, else None (start at epoch 1).
    A state older than best.pt's epoch brings its own best (switch_best.pt), or none."""
    order = ["last.pt", "switch.pt"] if harden_phase else ["last.pt"]
    for name in order:
        path = vdir / name
        if not path.is_file():
            continue
        try:
            payload = checkpoint.load_payload(path, device)
            _valid(payload, variant)
        except CheckpointError as exc:
            if name == "last.pt":
                _set_aside(path, str(exc).split(";")[0], log)
            continue
        if name == "switch.pt":
            best = vdir / "switch_best.pt"
            if best.is_file():
                atomic_write_bytes(vdir / "best.pt", best.read_bytes())
            log(f"    {variant}: resuming from switch.pt (epoch {payload['state']['epoch']}); later epochs are rerun")
        return payload, name
    if (vdir / "best.pt").is_file():  # from a timeline that is being rerun
        _set_aside(vdir / "best.pt", "its run state is gone; the variant restarts at epoch 1", log)
    return None, ""


# ---------------------------------------------------------------------------------------------
# One variant


def _timing_path(run: RunDir, variant: str):
    return run.file("train", variant, "timing.json")


def train_variant(cfg: Config, run: RunDir, ds: Dataset, variant: str, record: VariantRecord, last: int, harden_phase: bool,
                  histories: dict[str, list[dict]], device: torch.device, log=print) -> dict[str, Any]:
    world = distributed.world()
    vdir = run.dir("train", variant) if world.main else run.file("train", variant)  # only rank 0 writes
    T = cfg.train.epochs
    metric = ds.info.metric
    swap_method = cfg.harden.method == "swap" and record.swap_changes

    # Rank 0 validates (and sets aside what is unusable); every rank then reads the file it chose.
    source = distributed.broadcast(_resume_payload(vdir, variant, harden_phase, device, log)[1] if world.main else None)
    payload = checkpoint.load_payload(vdir / source, device) if source else None
    spec = payload["spec"] if payload else make_spec(cfg.model, variant, cfg.gate, ds.info)
    torch.manual_seed(cfg.seed)  # same initial weights for every variant of one seed
    model = build_model(spec).to(device, torch.float64 if cfg.train.precision == "fp64" else None)
    hardener = _hardener(model, cfg, record)
    split = on_device(ds.train, device)
    graph_why = graph_unavailable(cfg, device, world, split)
    opt = OPTIMIZERS[cfg.train.optimizer](hardener.param_groups(cfg.train.lr, cfg.train.weight_decay), cfg.train,
                                          graph_why is None, fused_optimizer(model, device))
    state: dict[str, Any] = {"epoch": 0, "history": [], "hardener": None, "initial_loss": None, "swapped": False,
                             "best": {"epoch": 0, "value": None, "metric": worst(metric), "hardness": None}}
    if payload is not None:
        try:
            model.load_state_dict(payload["state_dict"])
            opt.load_state_dict(payload["optimizer"])
            hardener.load_state_dict(payload["state"]["hardener"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{vdir / 'last.pt'} does not fit this run's config ({str(exc).splitlines()[0]}); "
                                  f"rerun the variant with `pipeline run --resume {run.path} --redo train`") from None
        state = payload["state"]
        if graph_why is None:
            _capturable(opt)
    histories[variant] = state["history"]
    timing = json.loads(_timing_path(run, variant).read_text()) if world.main and _timing_path(run, variant).is_file() else {}

    compiled = _maybe_compile(model, cfg, device)
    # a captured step must not cache casts across replays (torch.cuda.graphs: autocast with cache_enabled=False)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=graph_why is not None)
                if cfg.train.precision == "bf16" else None)
    # s leaves the graph once annealing freezes λ: DDP must not wait for its gradient then.
    net = distributed.wrap(compiled, device, find_unused=bool(hardener.gates) and harden_phase)
    graphs = (step_graph.GraphSteps(split.x, split.y, cfg.data.batch_size, EpochSums(device))
              if graph_why is None else None)

    epochs = range(state["epoch"] + 1, last + 1)
    progress = Progress(f"{variant:>12}", len(epochs), "ep", log, active=world.main)
    for epoch in epochs:
        t0 = time.time()
        lr = lr_at(epoch, T, cfg.train.lr, cfg.train.schedule)
        if swap_method and epoch > record.switch_epoch and not state["swapped"]:
            model, spec = _swap_for_finetune(model, spec, record.swapped_to, opt, device)
            hardener = _hardener(model, cfg, record)  # no gates left: plain training
            net = distributed.wrap(_maybe_compile(model, cfg, device), device, find_unused=False)
            state["swapped"] = True
        for group in opt.param_groups:
            group["lr"] = lr * group["lr_mult"]
        phase = "finetune" if swap_method and epoch > record.switch_epoch else hardener.start_epoch(epoch)
        stats = _train_epoch(net, opt, split, cfg, epoch, device, world, hardener, autocast, graphs)
        if state["initial_loss"] is None:
            state["initial_loss"] = stats["first_loss"]
        _stop_if_diverged(cfg, run, variant, epoch, stats, state)
        state["hardener"] = hardener.state_dict()
        if not world.main:  # rank 0 evaluates, selects and writes; the others only train
            state["epoch"] = epoch
            progress.step()
            continue
        val = evaluate(model, ds.val, cfg.data.eval_batch_size, device, metric)
        swapped = None
        if cfg.harden.select == "best_swapped":
            swapped = evaluate(to_relu(copy.deepcopy(model), ds.val.x[:2].to(device), allow_unchanged=True), ds.val, cfg.data.eval_batch_size, device, metric)["metric"]
        lams = hardener.lambdas()
        row = {"variant": variant, "epoch": epoch, "phase": phase, "lr": lr,
               "train_loss": stats["train_loss"], "train_top1": stats["train_top1"],
               "val_loss": val["loss"], f"val_{metric}": val["metric"], **({f"val_{metric}_swapped": swapped} if swapped is not None else {})}
        row.update({f"lambda_{i}": v for i, v in enumerate(lams)})
        state["history"].append(row)
        state["epoch"] = epoch
        hardened = hardener.hardened()
        value = swapped if cfg.harden.select == "best_swapped" else val["metric"]
        if _selects(cfg.harden.select, metric, value, hardened, state["best"]):
            state["best"] = {"epoch": epoch, "value": value, "metric": val["metric"], "hardness": hardener.hardness(),
                             "hardened": hardened}
            checkpoint.save(vdir / "best.pt", model, spec, epoch=epoch, val_metric=val["metric"], metric=metric,
                            lambdas=lams, select=cfg.harden.select, selected_by=value, hardened=hardened,
                            hardness=hardener.hardness(), train_loss=stats["train_loss"], initial_loss=state["initial_loss"])
        # Order matters for resume: the CSV is derived from last.pt's history, so write last.pt first.
        checkpoint.save(vdir / "last.pt", model, spec, optimizer=opt.state_dict(), state=state)
        timing[str(epoch)] = round(time.time() - t0, 3)  # kept apart: checkpoints are byte-identical across runs
        atomic_write_json(_timing_path(run, variant), timing)
        _write_metrics(run, histories)
        _fault_injection(variant, epoch)
        mean_lam = f"{sum(lams) / len(lams):.3g}" if lams else "-"
        progress.step(line=f"    {variant} epoch {epoch}/{T} ({phase}): loss {stats['train_loss']:.4f}, val {metric} "
                           f"{val['metric']:.4f}, λ {mean_lam}, {timing[str(epoch)]:.1f} s",
                      loss=f"{stats['train_loss']:.4f}", val=f"{val['metric']:.4f}", lam=mean_lam)
    progress.close()
    summary = _variant_summary(state, hardener, record, cfg, variant, log if world.main else None)
    summary["training_path"] = (f"cuda_graph ({graphs.captures} captures)" if graphs is not None and graphs.captures
                                else f"eager ({graph_why})" if graph_why else "eager")
    hard = {id(g.s) for g in hardener.gates}
    summary["params"] = sum(p.numel() for p in model.parameters() if id(p) not in hard)  # weights and biases
    return summary


def fused_optimizer(model: nn.Module, device: torch.device) -> bool:
    """The fused optimizer step on CUDA, for float32/bf16/fp16 parameters (torch fuses those only)."""
    return device.type == "cuda" and all(p.dtype in (torch.float32, torch.bfloat16, torch.float16) for p in model.parameters())


def graph_unavailable(cfg: Config, device: torch.device, world: distributed.World, split: Split) -> str | None:
    """Why the train loop runs eagerly rather than replaying captured steps (None: it replays them)."""
    if cfg.train.cuda_graph == "off":
        return "train.cuda_graph=off"
    return step_graph.unavailable(device, world.distributed, split.x.device.type == device.type, cfg.data.augment,
                                  cfg.train.compile)


def _capturable(opt: torch.optim.Optimizer) -> None:
    """A resumed optimizer's state as a captured step needs it: Adam's step counts on the device, `capturable` set
    (a checkpoint written by an eager run has neither)."""
    if not isinstance(opt, torch.optim.AdamW):
        return
    for group in opt.param_groups:
        group["capturable"] = True
        for p in group["params"]:
            st = opt.state.get(p, {})
            if "step" in st:
                st["step"] = torch.as_tensor(st["step"], dtype=torch.float32).to(p.device)


def _maybe_compile(model: nn.Module, cfg: Config, device: torch.device) -> nn.Module:
    """`torch.compile(model)` when train.compile is set and a compiler works here; the model otherwise."""
    if not cfg.train.compile:
        return model
    from .kernels import inductor

    reason = inductor.unavailable(device)
    if reason is not None:
        warnings.warn(f"train.compile: torch.compile does not work here, training eagerly ({reason})", RuntimeWarning, stacklevel=2)
        return model
    return torch.compile(model, mode=None if cfg.train.compile_mode == "default" else cfg.train.compile_mode)


def _hardener(model: nn.Module, cfg: Config, record: VariantRecord) -> Hardener:
    """Algorithm 1's schedule for one variant: e_s and λ_target read from its record (decided once per run).
    allow_no_gates: the baselines and the ReLU network of harden.method=swap train plainly; models built from the
    registry hold every gate as a module."""
    return Hardener(model, cfg.harden, cfg.train.epochs, lr_mult=cfg.gate.lr_mult, record=record, allow_no_gates=True)


def _swap_for_finetune(model: nn.Module, spec: dict[str, Any], swapped_to: str, opt: torch.optim.Optimizer,
                       device) -> tuple[nn.Module, dict]:
    """harden.method=swap: every gate becomes ReLU now; the optimizer drops the hardness parameters."""
    model = to_relu(model).to(device)
    keep = {id(p) for p in model.parameters()}
    for group in opt.param_groups:
        gone = [p for p in group["params"] if id(p) not in keep]
        for p in gone:
            opt.state.pop(p, None)
        group["params"] = [p for p in group["params"] if id(p) in keep]
    opt.param_groups[:] = [g for g in opt.param_groups if g["params"]]
    return model, relu_spec(spec, swapped_to)


def diverged(loss: float, initial_loss: float | None, factor: float) -> bool:
    """The divergence rule: a non-finite mean training loss, or one above `factor` (train.divergence_factor; 0 = off)
    times the untrained model's loss (its first batch, before any update). The swap stage applies it again to
    the checkpoint it would ship."""
    return not math.isfinite(loss) or bool(factor > 0 and initial_loss and loss > factor * initial_loss)


def _stop_if_diverged(cfg: Config, run: RunDir, variant: str, epoch: int, stats: dict[str, Any], state: dict[str, Any]) -> None:
    """A non-finite loss, or a mean loss beyond train.divergence_factor × the untrained model's, stops the run
    before this epoch's checkpoint is written."""
    kept = (f"the last good checkpoint (epoch {state['epoch']}) is kept" if state["epoch"]
            else "no checkpoint of this variant is kept (it failed in its first epoch)")
    fix = f"lower train.lr (now {cfg.train.lr:g}) or set train.grad_clip, then `pipeline run --resume {run.path} train.lr=...`"
    if stats["nonfinite_batch"] is not None or not math.isfinite(stats["train_loss"]):
        raise TrainingError(f"{variant}: the loss became non-finite at epoch {epoch}, batch {stats['nonfinite_batch']}; {kept}: {fix}")
    f, init = cfg.train.divergence_factor, state["initial_loss"]
    if diverged(stats["train_loss"], init, f):
        raise TrainingError(f"{variant}: training diverged at epoch {epoch}: mean loss {stats['train_loss']:.4g} is "
                            f"{stats['train_loss'] / init:.0f}× the untrained model's {init:.4g} (train.divergence_factor={f:g}); "
                            f"{kept}: {fix}")


def _variant_summary(state: dict[str, Any], hardener: Hardener, record: VariantRecord, cfg: Config, variant: str, log) -> dict[str, Any]:
    out = {"epoch": state["epoch"], "best_epoch": state["best"]["epoch"], "best_val": state["best"]["metric"],
           "select": cfg.harden.select, "lambdas": hardener.lambdas()}
    if record.hardenable:
        out["lambda_target"] = record.lambda_target
        best = state["best"]
        if best["epoch"] and best["hardness"] is not None and state["epoch"] == cfg.train.epochs:
            out["selected_hardness"] = ratio = best["hardness"]
            if ratio < 1 - HARDENED_RTOL:
                fix = ("harden.select=best_hardened avoids this" if cfg.harden.select not in ("best_hardened", "last")
                       else "no epoch reached it: the run has no anneal phase (train.switch_fraction=1)")
                msg = (f"{variant}: the selected checkpoint (epoch {best['epoch']}, harden.select={cfg.harden.select}) is not "
                       f"hardened: its smallest λ is {100 * ratio:.1f}% of λ_target {record.lambda_target:.4g}, so the "
                       f"ε = {cfg.harden.epsilon:g} bound does not cover its swap ({fix})")
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                if log:
                    log(f"    WARNING: {msg}")
                out["warning"] = msg
    return out


def _fault_injection(variant: str, epoch: int) -> None:
    """Tests set PIPELINE_KILL_AFTER=<variant>:<epoch> to SIGKILL the run right after that epoch's
    checkpoint, which is the only way to kill at a reproducible point (epochs take milliseconds)."""
    if os.environ.get("PIPELINE_KILL_AFTER") == f"{variant}:{epoch}":
        os.kill(os.getpid(), signal.SIGKILL)


def _write_metrics(run: RunDir, histories: dict[str, list[dict]]) -> None:
    timings = {v: json.loads(_timing_path(run, v).read_text()) if _timing_path(run, v).is_file() else {} for v in histories}
    rows = [{**r, "seconds": timings[v].get(str(r["epoch"]), "")} for v in histories for r in histories[v]]
    fields = list(dict.fromkeys(k for r in rows for k in r))
    atomic_write_csv(run.file("train", "metrics.csv"), rows, fields)
