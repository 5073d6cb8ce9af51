"""Whole training steps as CUDA graphs (`train.cuda_graph`): the batch gathered by index, forward, loss, backward,
gradient clipping, the optimizer step and the epoch's device-side sums, captured once and replayed per batch.

Why: a small model's step is a few hundred microseconds of kernels behind milliseconds of Python and launches; a
replay is one launch. The replayed kernels are the eager step's own, so an SGD run gives the same bits as eager
training (tests/test_step_graph.py); AdamW needs `capturable=True` (its step count and bias corrections on the
device, float32 instead of Python floats), which moves results by rounding only.

What changes from replay to replay lives in device memory the graph reads: the epoch's order (copied once per
epoch), the step counter (advanced inside the graph) and a frozen λ (the anneal writes its buffer in place).
What a capture bakes in is captured again when it changes: the learning rates (once per epoch under the cosine
schedule), which gates are frozen (the switch at e_s) and the set of parameters (the swap ablation).

Eager, where a graph cannot serve: the first `WARMUP` steps before the first capture (they create the optimizer's
state, the kernels' launch plans and cuBLAS's workspace, on the capture's side stream as torch.cuda.graphs asks),
and the last partial batch. `GraphSteps.reason` says why a run cannot use graphs at all (no CUDA, DDP, data in
host memory, augmentation, torch.compile); the train loop then runs eagerly and records the reason.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

WARMUP = 3  # eager steps on the side stream before the first capture (torch.cuda.graphs' recipe)


def unavailable(device: torch.device, distributed: bool, on_device: bool, augment: str, compiled: bool) -> str | None:
    """Why whole-step graphs cannot run here (None: they can)."""
    if device.type != "cuda":
        return "not on CUDA"
    if distributed:
        return "DDP (gradients are all-reduced between ranks)"
    if not on_device:
        return "the training split does not fit in a quarter of the GPU's free memory (batches come from host memory)"
    if augment != "none":
        return f"data.augment={augment} draws its crops on the host"
    if compiled:
        return "train.compile (torch.compile captures its own graphs with compile_mode=reduce-overhead)"
    return None


class GraphSteps:
    """Replays one captured step per full batch of an epoch. `step_fn(x, y, b)` is the train loop's own step on a
    batch (it adds to the loop's device sums); here it runs on batches gathered inside the graph."""

    def __init__(self, split_x: torch.Tensor, split_y: torch.Tensor, batch_size: int, sums: Any):
        self.x, self.y, self.B = split_x, split_y, batch_size
        self.sums = sums  # the train loop's device sums: the graph adds to these tensors, so they outlive epochs
        dev = split_x.device
        self.full = len(split_y) // batch_size  # batches a graph serves; the last partial one runs eagerly
        self.order = torch.empty(len(split_y), dtype=torch.int64, device=dev)
        self.arange = torch.arange(batch_size, dtype=torch.int64, device=dev)
        self.step = torch.zeros((), dtype=torch.int64, device=dev)  # the batch index, advanced by each replay
        self.stream = torch.cuda.Stream(dev)
        self.pool = torch.cuda.graph_pool_handle()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key: tuple | None = None
        self.warm = 0  # eager steps taken on the side stream so far
        self.captures = 0

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.order.index_select(0, self.arange + self.step * self.B)
        return self.x.index_select(0, ids), self.y.index_select(0, ids)

    def _body(self, step_fn: Callable[[torch.Tensor, torch.Tensor, Any], None]) -> None:
        x, y = self._batch()
        step_fn(x, y, self.step)
        self.step.add_(1)

    def run_epoch(self, order: torch.Tensor, key: tuple, step_fn, before_step: Callable[[int], None],
                  zero_grad: Callable[[], None]) -> None:
        """The epoch's full batches in `order` (a host permutation): `before_step(b)` runs on the host before
        batch b (the step schedule of λ); `key` names everything a capture bakes in."""
        self.order.copy_(order, non_blocking=True)
        self.step.zero_()
        b = 0
        if self.key is not None and key[2] != self.key[2]:
            self.warm = 0  # new parameters (the swap ablation): their optimizer state is created eagerly again
        if self.warm < WARMUP:  # lazy state first, on the stream the capture will use
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                while self.warm < WARMUP and b < self.full:
                    before_step(b)
                    zero_grad()
                    self._body(step_fn)
                    self.warm += 1
                    b += 1
            torch.cuda.current_stream().wait_stream(self.stream)
        if b < self.full and (self.graph is None or key != self.key):
            self._capture(step_fn, zero_grad, key)
        while b < self.full:
            before_step(b)
            self.graph.replay()
            b += 1

    def _capture(self, step_fn, zero_grad, key: tuple) -> None:
        if self.graph is not None:
            self.graph.reset()  # its memory goes back to the pool the new capture draws from
        zero_grad()  # gradients are allocated inside the capture, written (not accumulated) by each replay
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):  # records; runs nothing
            self._body(step_fn)
        self.graph, self.key = graph, key
        self.captures += 1


def capture_key(model: nn.Module, opt: torch.optim.Optimizer) -> tuple:
    """What a capture bakes in and the loop may change: learning rates, frozen gates, the parameter set."""
    frozen = tuple(bool(getattr(m, "_frozen", False)) for m in model.modules() if hasattr(m, "_frozen"))
    lrs = tuple(float(g["lr"]) for g in opt.param_groups)
    params = tuple(id(p) for g in opt.param_groups for p in g["params"])
    return lrs, frozen, params

