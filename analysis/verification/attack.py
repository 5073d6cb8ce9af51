"""PGD on the property's margin: the cheap first stage that finds most counterexamples.

For a box [lb, ub] and an unsafe set ∪_d {A_d y ≤ b_d}, each disjunct d is attacked on its own:
minimize v_d(x) = max_r (A_d y(x) − b_d)_r (v_d ≤ 0: x is a counterexample). For robustness that is the
targeted margin y_c − y_j, one run per wrong class j. Starts: the box centre and `restarts` uniform
random points per disjunct, all in one batch. Steps: sign of the gradient (L∞ steepest descent),
projected onto the box, the step size decaying from a quarter of each input's width by a cosine
schedule, so the late steps refine. The search stops once a point is unsafe by `margin` (room for the
float32 re-evaluation a counterexample gets afterwards).

It runs on `graph.Graph` in float64 with autograd, so it attacks ReLU and smooth networks alike, on the graph's
device (the random starts are drawn on the CPU, so a seed gives the same starts on every device); the point it
returns crosses to the host once.

`vertex_search` needs no gradient: it scores batches of the box's corners on the model itself (onnxruntime for an
int8 graph, where PGD's gradient is only the rounding's straight-through surrogate and its steps stall on the
grid's plateaus). Random corners first, then corners a few coordinates away from the best so far, with fewer flips
as it goes (Square Attack's idea, Andriushchenko et al., ECCV 2020, on single coordinates). On an int8 cnn whose
PGD found nothing, 11% of random corners were counterexamples (`benchmarks/int8-results/bab-ties-cnn48.json`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .graph import Graph
from .ops.base import DTYPE, as_tensor
from .vnnlib import VnnlibSpec


def pgd(net: Graph, spec: VnnlibSpec, steps: int = 60, restarts: int = 8, margin: float = 1e-4, seed: int = 0,
        expired: Callable[[], bool] | None = None, start: np.ndarray | torch.Tensor | None = None,
        step_scale: float = 0.25) -> tuple[np.ndarray | None, float]:
    """(best point, its violation): the point is a counterexample in float64 when the violation is ≤ 0
    (returned only then; else None with the smallest violation found). `start`: begin there instead of the box
    centre (with `restarts` random points beside it); `step_scale`: the first step as a share of each input's width."""
    expired = expired or (lambda: False)
    gen = torch.Generator().manual_seed(seed)
    dev = net.device
    lb = torch.as_tensor(spec.lb, dtype=DTYPE, device=dev)
    ub = torch.as_tensor(spec.ub, dtype=DTYPE, device=dev)
    width = ub - lb
    nd = len(spec.disjuncts)
    per = 1 + restarts
    first = (lb + ub) / 2 if start is None else as_tensor(start, dev).reshape(-1)
    starts = [first] + [lb + width * torch.rand(lb.shape, generator=gen, dtype=DTYPE, device="cpu").to(dev)
                      for _ in range(restarts)]
    x = torch.stack(starts * nd)  # [nd·per, n]: disjunct d owns rows d·per … d·per + per − 1
    rows = max(A.shape[0] for A, _ in spec.disjuncts)
    # pad every disjunct to the same row count with copies of its first row (max is unchanged)
    A = torch.stack([torch.as_tensor(np.concatenate([A_] + [A_[:1]] * (rows - A_.shape[0])), dtype=DTYPE, device=dev)
                     for A_, _ in spec.disjuncts])  # [nd, rows, m]
    b = torch.stack([torch.as_tensor(np.concatenate([b_] + [b_[:1]] * (rows - b_.shape[0])), dtype=DTYPE, device=dev)
                     for _, b_ in spec.disjuncts])
    A = A.repeat_interleave(per, 0)
    b = b.repeat_interleave(per, 0)
    best_v, best_x = math.inf, None
    for step in range(steps + 1):
        x.requires_grad_(True)
        y = net.forward(x)
        v = (torch.einsum("brm,bm->br", A, y) - b).max(dim=1).values  # [batch]
        with torch.no_grad():
            i = int(torch.argmin(v))
            if float(v[i]) < best_v:
                best_v, best_x = float(v[i]), x[i].detach().clone()
        if best_v <= -margin or step == steps or expired():
            break
        (grad,) = torch.autograd.grad(v.sum(), x)
        with torch.no_grad():
            size = width * step_scale * (0.5 * (1 + math.cos(math.pi * step / steps)) + 4e-3)
            x = torch.minimum(torch.maximum(x - size * grad.sign(), lb), ub)
    if best_x is None or best_v > 0:
        return None, best_v
    return best_x.cpu().numpy(), best_v


# `vertex_search`'s rounds per cycle of its flip probability (10% halving every 2 rounds to one coordinate)
CYCLE = 12
# the share of its moves that go to a random point of a coordinate's range rather than to an end
INSIDE = 0.25
# `vertex_search`'s first batch when it watches the time: the rate it measures there sizes the later ones
FIRST_BATCH = 32


@dataclass
class VertexResult:
    """What `vertex_search` found: `x` strictly unsafe on the model (violation < 0), else None; `violation` the least
    seen; `tie` a point whose violation is exactly 0 (it reaches the unsafe set's boundary, so no certificate exists,
    but it is not strictly unsafe), else None; `evaluated` the points scored."""

    x: np.ndarray | None
    violation: float
    tie: np.ndarray | None
    evaluated: int


def vertex_search(evaluate: Callable[[np.ndarray], np.ndarray], spec: VnnlibSpec, lo: np.ndarray, hi: np.ndarray,
                  batch: int = 256, rounds: int = 400, seed: int = 0, start: np.ndarray | None = None,
                  expired: Callable[[], bool] | None = None, left: Callable[[], float] | None = None) -> VertexResult:
    """Search the corners (mostly) of the box [lo, hi] (float32 values inside the property's box) for a point the model
    itself puts strictly in the unsafe set; every point scored holds float32 values, as a witness runs. `evaluate`
    maps [B, n] inputs to [B, m] outputs. Round 0 scores the box centre, `start` (a point an attack ended on) and
    random corners; each later round scores `batch` points: three quarters are the best point so far with each
    coordinate moved with probability p (from 10%, halving every 2 rounds down to one coordinate, and again every
    `CYCLE` rounds) to the other end (a share `INSIDE` of the moves: to a random value inside the range), a quarter
    fresh corners. The best point moves to any point that scores as well (a sideways move across a plateau). Stops
    at the first strictly unsafe point, after `rounds`, or when `expired`. With `left` (seconds left), round 0 has at
    most `FIRST_BATCH` points and each later round is cut to what a quarter of the time left can score at the rate
    measured so far, so that one batch of a large model cannot overrun the time."""
    expired = expired or (lambda: False)
    rng = np.random.default_rng(seed)
    lo, hi = np.asarray(lo, dtype=np.float64).reshape(-1), np.asarray(hi, dtype=np.float64).reshape(-1)
    n = lo.size

    def corners(k: int) -> np.ndarray:
        return np.where(rng.random((k, n)) < 0.5, lo, hi)

    def f32(x: np.ndarray) -> np.ndarray:  # float32 values in [lo, hi] (lo, hi are float32): what the model runs
        return np.clip(x.astype(np.float32).astype(np.float64), lo, hi)

    first = [(lo + hi) / 2] + ([np.asarray(start, dtype=np.float64).reshape(-1)] if start is not None else [])
    size = min(batch, FIRST_BATCH) if left is not None else batch
    pts = np.concatenate([f32(np.stack(first)), corners(max(size - len(first), 1))])
    best_v, best_x, tie, seen, spent = math.inf, None, None, 0, 0.0
    for r in range(rounds):
        t0 = time.perf_counter()
        v = np.asarray(spec.violations(evaluate(pts)), dtype=np.float64)
        v = np.where(np.isnan(v), np.inf, v)  # a model that gives NaN somewhere has not shown a counterexample there
        spent += time.perf_counter() - t0
        seen += len(pts)
        i = int(np.argmin(v))
        if v[i] <= best_v:  # an equal score moves too: an int8 model's margin is flat across many corners
            best_v, best_x = float(v[i]), pts[i].copy()
        if tie is None and np.any(v == 0):
            tie = pts[int(np.flatnonzero(v == 0)[0])].copy()
        if best_v < 0 or r == rounds - 1 or expired():
            break
        p = max(0.1 * 0.5 ** ((r % CYCLE) // 2), 1.0 / n)  # wide moves, then narrow, again every CYCLE rounds
        if left is not None:
            size = int(min(batch, max(4, left() / 4 / (spent / seen))))
        m = (3 * size) // 4
        moved = rng.random((m, n)) < p
        moved[np.arange(m), rng.integers(0, n, m)] = True  # at least one coordinate each
        end = np.where(best_x == lo, hi, np.where(best_x == hi, lo, np.where(rng.random((m, n)) < 0.5, lo, hi)))
        # some moves go inside: where the box spans several input grid steps, not every grid point is a corner
        inside = f32(lo + (hi - lo) * rng.random((m, n)))
        other = np.where(rng.random((m, n)) < INSIDE, inside, end)
        pts = np.concatenate([np.where(moved, other, best_x), corners(size - m)])
    return VertexResult(best_x if best_v < 0 else None, best_v, tie if best_v >= 0 else None, seen)
