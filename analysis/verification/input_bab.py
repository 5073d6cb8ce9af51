"""Branch and bound on the input box, for networks of few inputs (ACAS Xu's 5, a controller's state): each box gets
its own CROWN pass, whose intermediate bounds tighten as the box shrinks, and a box a disjunct is not excluded on is
halved along the input that costs the bound most: the side whose width times the summed |coefficient| of the bound's
input rows is largest (the bound's linear function of the input loses at most that much there). α,β-CROWN's ACAS Xu
configuration splits the input too (`vnncomp21/acasxu.yaml`: CROWN bounds, up to 16,384 boxes a batch, each box first
clipped by its bounds' linear constraints); a search over ReLU splits is the slower way on such a net
(benchmarks/peers/vnncomp23-sample-30s/README.md).

Sound: the two halves cover the box, and a box is closed only where every disjunct has a row whose CROWN lower bound
on the box is > 0. Each box's bound minimizer (the corner its worst row's coefficients point to) is run through the
network; a point unsafe in float64 that `confirm` accepts (onnxruntime, strictly unsafe) is a counterexample.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .bounds import Bounder, Spec, excluded
from .graph import Graph
from .vnnlib import VnnlibSpec

MAX_INPUTS = 16  # input splitting pays on a box of this many inputs or fewer
MAX_BOXES = 1_000_000  # open boxes kept (depth first, so the stack stays near depth × 1)


def search(net: Graph, spec: VnnlibSpec, disjuncts: list[int], expired: Callable[[], bool],
           confirm: Callable[[np.ndarray], Any]) -> tuple[str, np.ndarray | None, str, dict]:
    """Input branch and bound over the open `disjuncts` of `spec`: (status, counterexample or None, message, stats)."""
    rows, owner = Spec.from_disjuncts([spec.disjuncts[d] for d in disjuncts], "cpu")
    n = len(disjuncts)
    t0 = time.perf_counter()
    stack = [(np.asarray(spec.lb, dtype=np.float64), np.asarray(spec.ub, dtype=np.float64))]
    stats: dict[str, Any] = {"boxes": 0}
    tried = 0
    while stack:
        if expired():
            return "timeout", None, (f"input branch and bound: {len(stack)} boxes open after {stats['boxes']} bounded "
                                     f"({time.perf_counter() - t0:.1f} s)"), stats
        if len(stack) > MAX_BOXES:
            return "timeout", None, f"input branch and bound: {len(stack)} open boxes, above its store of {MAX_BOXES}", stats
        lb, ub = stack.pop()
        b = Bounder(net, lb, ub, expired)
        b.crown()
        inputs: list[torch.Tensor] = []
        with torch.no_grad():
            lower = (b.backward(rows.C.to(b.device), b.net.output, inputs=inputs) + rows.d.to(b.device)).cpu()
        stats["boxes"] += 1
        ex = excluded(lower, owner, n)
        if all(ex):
            continue
        A = inputs[0].cpu()
        open_rows = torch.tensor([not ex[j] for j in owner])
        # the worst open row's minimizer: a corner of the box
        r = int(torch.where(open_rows, lower, torch.full_like(lower, np.inf)).argmin())
        x = np.where(A[r].numpy() >= 0, lb, ub)
        if tried < 64 and spec.violation(net.forward(torch.as_tensor(x, device=b.device)[None])[0].cpu().numpy()) <= 0:
            tried += 1
            x32 = confirm(x)
            if x32 is not None:
                return "sat", np.asarray(x32), f"input branch and bound: a box's bound minimizer is unsafe ({stats['boxes']} boxes)", stats
        cost = (A[open_rows].abs().sum(0).numpy()) * (ub - lb)
        k = int(np.argmax(cost))
        if not cost[k] > 0:  # a point box, or bounds that do not depend on the input: nothing left to split
            return "unknown", None, f"input branch and bound: a box it cannot split further ({stats['boxes']} boxes)", stats
        mid = 0.5 * (lb[k] + ub[k])
        left_ub, right_lb = ub.copy(), lb.copy()
        left_ub[k], right_lb[k] = mid, mid
        stack += [(right_lb, ub), (lb, left_ub)]
    return "unsat", None, f"input branch and bound: every box closed ({stats['boxes']} bounded, {time.perf_counter() - t0:.1f} s)", stats
