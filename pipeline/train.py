"""Training with Algorithm 1: the `train` stage learns λ for epochs 1..e_s, the `harden` stage freezes s
and anneals λ linearly to λ_target over e_s+1..T. Baseline variants simply keep training in both.

Every epoch ends with `last.pt` (weights, optimizer, history) written atomically, so a killed run
resumes at the next epoch with the same numbers; `best.pt` holds the best-validation checkpoint.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from . import checkpoint, distributed
from .activations import hardenable_gates, layer_lambdas, variant_facts
from .config import Config
from .data import Dataset, Split, augment, batches, dataset_for
from .errors import TrainingError
from .evaluate import evaluate, improved, worst
from .evaluate import loss as cross_entropy
from .hardness import annealed_lambda, lr_at, param_groups, switch_epoch
from .models import build_model, make_spec
from .rundir import RunDir, atomic_write_bytes, atomic_write_csv

OPTIMIZERS = {
    "sgd": lambda groups, cfg: torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum),
    "adamw": lambda groups, cfg: torch.optim.AdamW(groups, lr=cfg.lr),
}


# ---------------------------------------------------------------------------------------------
# One variant


def _train_epoch(model, opt, split: Split, cfg: Config, epoch: int, device,
                 world: distributed.World = distributed.World()) -> dict[str, float]:
    model.train()
    g = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)  # data order depends only on (seed, epoch)
    aug = torch.Generator().manual_seed(2**40 + cfg.seed * 100_003 + epoch) if cfg.data.augment != "none" else None
    total, correct, n = 0.0, 0, 0
    for b, (x, y) in enumerate(batches(split, cfg.data.batch_size, g)):
        if aug is not None:
            x = augment(x, cfg.data.augment, aug)  # the global batch: the same images for any number of ranks
        if world.distributed:
            loss, stats = _ddp_step(model, x, y, world, device)
            if not torch.isfinite(stats[0]):
                raise TrainingError(f"loss is {float(stats[0])} at epoch {epoch}, batch {b} (on some rank); "
                                    f"lower train.lr or set train.grad_clip, then resume")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.train.grad_clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
            opt.step()
            total += float(stats[0])
            correct += int(stats[1])
            n += int(stats[2])
            continue
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x)
        loss = cross_entropy(logits, y)
        if not torch.isfinite(loss):
            raise TrainingError(
                f"loss is {float(loss.detach())} at epoch {epoch}, batch {b}; the last good checkpoint (epoch {epoch - 1}) is kept: "
                f"lower train.lr or set train.grad_clip, then resume"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.train.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        total += float(loss.detach()) * len(y)
        correct += int((logits.argmax(-1) == y).sum())
        n += len(y)
    return {"train_loss": total / n, "train_top1": correct / (n * (y[0].numel() if len(y) else 1))}


def _ddp_step(model, x: torch.Tensor, y: torch.Tensor, world: distributed.World, device):
    """Forward this rank's share of a global batch. The loss is the share's summed cross-entropy
    times world_size / (elements in the global batch): DDP averages gradients over ranks, so the
    update equals the single-process one on the whole batch, however unevenly the batch splits.
    Returns (loss, [loss·examples, correct, examples] summed over ranks)."""
    n_global, per_example = len(y), y[0].numel()
    x, y = distributed.shard(x, y, world)
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    logits = model(x)
    loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
    loss = loss_sum * (world.size / (n_global * per_example))
    stats = torch.stack([loss_sum.detach().double() / per_example, (logits.argmax(-1) == y).sum().double(),
                         torch.tensor(float(len(y)), dtype=torch.float64, device=loss_sum.device)])
    return loss, distributed.all_sum(stats).cpu()


def train_variant(cfg: Config, run: RunDir, ds: Dataset, variant: str, first: int, last: int,
                  histories: dict[str, list[dict]], device: torch.device) -> dict[str, Any]:
    world = distributed.world()
    vdir = run.dir("train", variant) if world.main else run.file("train", variant)  # only rank 0 writes
    T = cfg.train.epochs
    e_s = switch_epoch(T, cfg.train.switch_fraction)
    facts = variant_facts(variant, cfg.harden)
    hardenable, target = facts["hardenable"], facts["lambda_target"]
    spec = make_spec(cfg.model, variant, cfg.gate, ds.info)

    torch.manual_seed(cfg.seed)  # same initial weights for every variant of one seed
    model = build_model(spec).to(device)
    opt = OPTIMIZERS[cfg.train.optimizer](param_groups(model, cfg.train.lr, cfg.train.weight_decay, cfg.gate.lr_mult), cfg.train)
    metric = ds.info.metric
    state: dict[str, Any] = {"epoch": 0, "best_metric": worst(metric), "best_epoch": 0, "lambda_switch": None, "history": []}
    if (vdir / "last.pt").is_file():
        payload = checkpoint.load_payload(vdir / "last.pt", device)
        model.load_state_dict(payload["state_dict"])
        opt.load_state_dict(payload["optimizer"])
        state = payload["state"]
    histories[variant] = state["history"]
    # The model itself in one process. Annealing freezes λ, so s then leaves the graph (unused in DDP).
    net = distributed.wrap(model, device, find_unused=hardenable and first > e_s)

    epochs = range(max(first, state["epoch"] + 1), last + 1)
    bar = tqdm(epochs, desc=f"{variant:>12}", unit="ep", disable=None if world.main else True, leave=True)
    for epoch in bar:
        t0 = time.time()
        lr = lr_at(epoch, T, cfg.train.lr, cfg.train.schedule)
        for group in opt.param_groups:
            group["lr"] = lr * group["lr_mult"]
        gates = hardenable_gates(model)
        phase = "train"
        if hardenable:
            phase = "learn" if epoch <= e_s else "anneal"
            if phase == "anneal":
                if state["lambda_switch"] is None:  # Algorithm 1, line 2: save λ(e_s)
                    state["lambda_switch"] = [g.lam.detach().cpu().clone() for g in gates]
                for g, lam_s in zip(gates, state["lambda_switch"]):
                    g.freeze(annealed_lambda(lam_s, epoch, e_s, T, target).to(device))
        stats = _train_epoch(net, opt, ds.train, cfg, epoch, device, world)
        if not world.main:  # rank 0 evaluates, selects and writes; the others only train
            state["epoch"] = epoch
            continue
        val = evaluate(model, ds.val, cfg.data.eval_batch_size, device, metric)
        lams = layer_lambdas(model)
        row = {"variant": variant, "epoch": epoch, "phase": phase, "lr": lr, **stats,
               "val_loss": val["loss"], f"val_{metric}": val["metric"], "seconds": time.time() - t0}
        row.update({f"lambda_{i}": v for i, v in enumerate(lams)})
        state["history"].append(row)
        state["epoch"] = epoch
        if improved(val["metric"], state["best_metric"], metric):
            state["best_metric"], state["best_epoch"] = val["metric"], epoch
            checkpoint.save(vdir / "best.pt", model, spec, epoch=epoch, val_metric=val["metric"], metric=metric, lambdas=lams)
        # Order matters for resume: the CSV is derived from last.pt's history, so write last.pt first.
        checkpoint.save(vdir / "last.pt", model, spec, optimizer=opt.state_dict(), state=state)
        _write_metrics(run, histories)
        _fault_injection(variant, epoch)
        bar.set_postfix(loss=f"{stats['train_loss']:.4f}", val=f"{val['metric']:.4f}",
                        lam=f"{(sum(lams) / len(lams)) if lams else float('nan'):.3g}")
    return {"epoch": state["epoch"], "best_epoch": state["best_epoch"], "best_val": state["best_metric"],
            "lambdas": layer_lambdas(model),
            **({"lambda_target": target} if hardenable else {})}


def _fault_injection(variant: str, epoch: int) -> None:
    """Tests set PIPELINE_KILL_AFTER=<variant>:<epoch> to SIGKILL the run right after that epoch's
    checkpoint, which is the only way to kill at a reproducible point (epochs take milliseconds)."""
    if os.environ.get("PIPELINE_KILL_AFTER") == f"{variant}:{epoch}":
        os.kill(os.getpid(), signal.SIGKILL)


def _write_metrics(run: RunDir, histories: dict[str, list[dict]]) -> None:
    rows = [r for v in histories for r in histories[v]]
    fields = list(dict.fromkeys(k for r in rows for k in r))
    atomic_write_csv(run.file("train", "metrics.csv"), rows, fields)


def _run_phase(cfg: Config, run: RunDir, phase: str) -> dict[str, Any]:
    device = distributed.resolve_device(cfg.device)
    ds = dataset_for(cfg)
    T = cfg.train.epochs
    e_s = switch_epoch(T, cfg.train.switch_fraction)
    first, last = (1, e_s) if phase == "train" else (e_s + 1, T)
    histories: dict[str, list[dict]] = {}
    for v in cfg.variants:  # histories of every variant, so metrics.csv always holds them all
        p = run.file("train", v, "last.pt")
        histories[v] = checkpoint.load_payload(p)["state"]["history"] if p.is_file() else []
    out = {"epochs": [first, last], "switch_epoch": e_s, "device": str(device)}
    world = distributed.world()
    if world.distributed:
        out["world_size"] = world.size
    if world.main:  # decided once, here; every later stage reads them from the manifest
        run.record_variants({v: variant_facts(v, cfg.harden) for v in cfg.variants})
    for v in cfg.variants:
        out[v] = train_variant(cfg, run, ds, v, first, last, histories, device)
        if phase == "train" and world.main and run.file("train", v, "last.pt").is_file():
            # Algorithm 1, line 2: keep the state at e_s (λ(e_s) and the weights) beside the run.
            atomic_write_bytes(run.file("train", v, "switch.pt"), run.file("train", v, "last.pt").read_bytes())
    return out


def run_train(cfg: Config, run: RunDir) -> dict[str, Any]:
    """Epochs 1..e_s: weights and λ learned together (λ's s at c·lr, no weight decay)."""
    return _run_phase(cfg, run, "train")


def run_harden(cfg: Config, run: RunDir) -> dict[str, Any]:
    """Epochs e_s+1..T: s frozen, λ annealed linearly to λ_target, weights keep training."""
    return _run_phase(cfg, run, "harden")
