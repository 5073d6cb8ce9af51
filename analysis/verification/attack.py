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
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from .graph import Graph
from .ops import DTYPE, as_tensor
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
