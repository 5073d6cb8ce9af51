"""Training epoch time with λ-GELU vs GELU vs ReLU, through the pipeline's own `_train_epoch`.

Variants (same model, same seed, same data order):
  gelu, relu                plain activations
  lambda_gelu               λ learned (the train stage) as the module runs it: λ = 1 + softplus(s/t) inside the
                            fused op of the default kernel ("auto": the C++ kernel on CPU, Triton on CUDA)
  lambda_gelu[frozen]       λ frozen as a buffer (the harden stage, 75% of the default epochs)
  lambda_gelu[eager]        λ learned, the eager kernel (what runs without a C++ compiler or Triton)
  lambda_gelu[λ_nodes]      λ learned, λ(s) computed by autograd nodes outside the fused op (softplus, add,
                            view per layer and step): what the s-inside-the-op path saves
Interleaving: repetition r trains one epoch of every variant, and each epoch is cut into blocks of
`block_steps` steps (whole batches, the pipeline's own `_train_epoch` on each block): the variants take
turns block by block, in an order rotated by block and repetition, so load that comes and goes within an
epoch falls on every variant alike. A variant's epoch time is the sum of its blocks. block_steps=0 runs
whole epochs in turn instead.
"""

from __future__ import annotations

import contextlib
import time
import types
from typing import Any

import torch

from pipeline import kernels
from pipeline.activations import hardenable_gates, lambda_gelu
from pipeline.config import Config
from pipeline.data import Split, dataset_for
from pipeline.schedule import param_groups
from pipeline.models import build_model, make_spec
from pipeline.train_loop import OPTIMIZERS, _train_epoch

from .common import paired_ratio, summary

VARIANTS = {  # name -> (activation, kernel, frozen λ)
    "gelu": ("gelu", None, False),
    "relu": ("relu", None, False),
    "lambda_gelu": ("lambda_gelu", "auto", False),
    "lambda_gelu[frozen]": ("lambda_gelu", "auto", True),
    "lambda_gelu[eager]": ("lambda_gelu", "eager", False),
    "lambda_gelu[λ_nodes]": ("lambda_gelu", "auto", False),
}
FROZEN_LAMBDA = 20.0  # a λ mid-way through annealing


def _forward_lambda_nodes(gate, x: torch.Tensor) -> torch.Tensor:
    """LambdaGELU.forward as it was before λ moved into the op: λ(s) by autograd nodes, then the fused kernel."""
    return lambda_gelu(x, gate._lam_for(x))


def _blocks(split: Split, rows: int) -> list[Split]:
    if rows <= 0:
        return [split]
    return [Split(split.x[i:i + rows], split.y[i:i + rows]) for i in range(0, len(split), rows)]


def bench_epochs(cfg: Config, reps: int, device: torch.device | str = "cpu",
                 variants: list[str] | None = None, block_steps: int = 20) -> dict[str, Any]:
    device = torch.device(device)
    ds = dataset_for(cfg)
    blocks = _blocks(ds.train, block_steps * cfg.data.batch_size)
    names = variants or list(VARIANTS)
    runs = {}
    for name in names:
        act, kernel, frozen = VARIANTS[name]
        torch.manual_seed(cfg.seed)
        model = build_model(make_spec(cfg.model, act, cfg.gate, ds.info)).to(device)
        if frozen:
            for gate in hardenable_gates(model):
                gate.freeze(torch.tensor(FROZEN_LAMBDA))
        if name.endswith("[λ_nodes]"):
            for gate in hardenable_gates(model):
                gate.forward = types.MethodType(_forward_lambda_nodes, gate)
        opt = OPTIMIZERS[cfg.train.optimizer](
            param_groups(model, cfg.train.lr, cfg.train.weight_decay, cfg.gate.lr_mult), cfg.train)
        runs[name] = (model, opt, kernel)
    times: dict[str, list[float]] = {n: [] for n in names}
    first: dict[str, float] = {}
    for r in range(reps + 1):  # repetition 0 warms up (kernel build/load, allocator, caches) and is dropped
        epoch = {n: 0.0 for n in names}
        for b, block in enumerate(blocks):
            k = (r + b) % len(names)
            for name in names[k:] + names[:k]:
                model, opt, kernel = runs[name]
                ctx = kernels.use_kernel(kernel) if kernel else contextlib.nullcontext()
                with ctx:
                    t0 = time.perf_counter()
                    _train_epoch(model, opt, block, cfg, r * len(blocks) + b + 1, device)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    epoch[name] += time.perf_counter() - t0
        for name in names:
            if r == 0:
                first[name] = round(epoch[name], 3)
            else:
                times[name].append(epoch[name])
    steps = -(-len(ds.train) // cfg.data.batch_size)
    base = "gelu" if "gelu" in times else names[0]
    return {
        "model": cfg.model.name, "data": cfg.data.name, "train_examples": len(ds.train), "batch_size": cfg.data.batch_size,
        "steps_per_epoch": steps, "device": str(device), "reps": reps, "block_steps": block_steps,
        "hidden": cfg.model.hidden if cfg.model.name == "mlp" else None,
        "channels": cfg.model.channels if cfg.model.name == "cnn" else None,
        "epoch_s": {n: summary(t) for n, t in times.items()},
        "step_ms": {n: summary([v / steps for v in t], 1e3) for n, t in times.items()},
        f"ratio_vs_{base}": {n: paired_ratio(t, times[base]) for n, t in times.items()},
        "warmup_epoch_s": first,
        "kernel_status": kernels.status(),
    }
