"""Data-parallel training under torchrun (DistributedDataParallel); one process stays the default.

`torchrun --nproc_per_node=N -m pipeline.cli run ...` starts N copies of `pipeline run`; torchrun's
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT variables make each join one process
group (NCCL on CUDA, gloo on CPU). Without WORLD_SIZE > 1 nothing here does anything.

The contract:
- `data.batch_size` is the global batch: every rank draws the same (seed, epoch) order and takes
  its contiguous share of each batch, and the loss is scaled so that DDP's gradient average is
  the single-process gradient, also for a last batch that does not split evenly. λ's `s` are
  ordinary parameters, so DDP synchronizes them with the weights.
- Only rank 0 writes (run directory, manifest, checkpoints, metrics); the other ranks train
  beside it, read what it wrote after a barrier, and leave the single-process stages to it.
- BatchNorm statistics are per process (torchvision's recipe without --sync-bn): with
  BatchNorm, N ranks match one process only approximately.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from .errors import PipelineError

T = TypeVar("T")

BACKEND_ENV = "PIPELINE_DIST_BACKEND"  # force "gloo" or "nccl" (default: nccl when CUDA is there)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def resolve_device(name: str) -> torch.device:
    """`device=auto|cpu|cuda|cuda:N` to a torch device; under torchrun `cuda` is this process's GPU."""
    from .devices import resolve

    w = world()
    return resolve(name, w.local_rank if w.distributed else None)


def world() -> World:
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    return World()


def init_from_env() -> World:
    """Join the process group torchrun describes in the environment (idempotent)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or (dist.is_available() and dist.is_initialized()):
        return world()
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    backend = os.environ.get(BACKEND_ENV) or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    return world()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if world().distributed:
        dist.barrier()


def broadcast(obj: T) -> T:
    """Rank 0's `obj` on every rank (picklable objects)."""
    if not world().distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_main(fn: Callable[[], T]) -> T:
    """Run fn on rank 0 only and hand its result (or its failure) to every rank.

    A failure on rank 0 is re-raised on rank 0 and reported on the others, instead of leaving them
    blocked in the next collective.
    """
    w = world()
    if not w.distributed:
        return fn()
    result: Any = None
    error: BaseException | None = None
    if w.main:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others are told
            error = exc
    shared = broadcast(("error", f"{type(error).__name__}: {error}") if error is not None else ("ok", result))
    if error is not None:
        raise error
    if shared[0] == "error":
        raise PipelineError(f"rank 0 failed: {shared[1]}")
    return shared[1]


def shard(x: torch.Tensor, y: torch.Tensor, w: World) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous share of one global batch."""
    return x.tensor_split(w.size)[w.rank], y.tensor_split(w.size)[w.rank]


def all_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a small tensor over ranks (in place, returned for chaining)."""
    if world().distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def wrap(model: torch.nn.Module, device: torch.device, find_unused: bool) -> torch.nn.Module:
    """DDP around the model when distributed, the model itself otherwise.

    `find_unused` is for λ-gates: once hardening freezes them, their s leave the graph.
    """
    if not world().distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=find_unused)
