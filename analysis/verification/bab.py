"""Branch and bound on unstable ReLUs with β-CROWN-style bounds: the complete method that decides what the
bounds alone leave open, without the MILP's branching on every unstable unit at once.

A domain is the box plus sign constraints on some ReLU inputs (split z ≥ 0 or z ≤ 0). Its bound: the root's
pre-activation intervals (`Bounder.pre`, CROWN/α-CROWN) clamped by the splits (a split unit is stable, so its
relaxation is exact), and each split constraint −t·z ≤ 0 (t = ±1) added to the back-substitution with a
multiplier β ≥ 0 (β-CROWN, Wang et al. 2021: without β the constraint would only clamp that unit's interval).
α (lower ReLU slopes) and β are optimized together by projected Adam for each batch of domains; every iterate's
bound is sound, and the best per domain is kept.

Per round, the `batch` domains with the lowest bounds are bounded together (one back-substitution over all
their rows). A domain whose bound exceeds 0 is closed. The minimizer of each domain's linear bound (a corner
of the box) is run through the network: an unsafe one is a counterexample (sat). Otherwise the domain is split
on the unstable unit with the largest BaBSR-style score (how much its upper relaxation's intercept costs the
bound), into two children. A domain with no unstable unit left is decided exactly by an LP (the MILP encoding
with every unit stable has no binaries). The answer: unsat when no domain is left, sat on a counterexample,
timeout when the budget runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from . import milp
from .bounds import Adam, Bounder
from .ops import DTYPE
from .vnnlib import VnnlibSpec


def _bound_batch(b: Bounder, splits: list[torch.Tensor], C: torch.Tensor, d: torch.Tensor, steps: int, lr: float,
                 expired: Callable[[], bool]):
    """Bounds of D domains (splits[s]: [D, n_s] in {−1, 0, +1}) for the R rows C y + d.
    Returns (lower [D, R], input minimizers [D·R, n_in], branching scores per site [D, n_s])."""
    D, R = splits[0].shape[0], C.shape[0]
    bounds, signs, cross = {}, {}, {}
    for s, t in enumerate(splits):
        l, u = b.pre[s]
        l = torch.where(t > 0, l.clamp(min=0), l.expand_as(t))
        u = torch.where(t < 0, u.clamp(max=0), u.expand_as(t))
        bounds[s] = (l.repeat_interleave(R, 0), u.repeat_interleave(R, 0))
        signs[s] = (-t).to(DTYPE).repeat_interleave(R, 0)
        cross[s] = (bounds[s][0] < 0) & (bounds[s][1] > 0)
    A0 = C.repeat(D, 1)
    dd = d.repeat(D)
    alpha = {s: torch.where(cross[s], (bounds[s][1] > -bounds[s][0]).to(DTYPE), torch.zeros_like(signs[s])).requires_grad_(True)
             for s in bounds}
    beta = {s: torch.zeros_like(signs[s]).requires_grad_(True) for s in bounds if bool(signs[s].any())}
    params = list(alpha.values()) + list(beta.values())
    opt = Adam(params, lr=lr)
    best = None
    for i in range(steps + 1):
        last = i == steps or expired()
        record: dict[int, torch.Tensor] = {}
        inputs: list[torch.Tensor] = []
        extra = {s: beta[s] * signs[s] for s in beta}
        with torch.set_grad_enabled(not last):
            lower = b.backward(A0, b.net.output, alpha, True, bounds, extra, record if last else None,
                               inputs if last else None) + dd
        best = lower.detach() if best is None else torch.maximum(best, lower.detach())
        if last:
            break
        if bool(torch.all(best.view(D, R).max(1).values > 0)):
            steps = i + 1  # every domain closed: one more pass for the records
            continue
        opt.zero_grad()
        (-lower.clamp(max=0).sum() - 1e-3 * lower.sum()).backward()
        opt.step()
        with torch.no_grad():
            for s in alpha:
                alpha[s].clamp_(0.0, 1.0)
            for s in beta:
                beta[s].clamp_(min=0.0)
    A_in = inputs[0]
    xstar = torch.where(A_in >= 0, b.lb, b.ub)
    scores = []
    for s in bounds:
        l, u = bounds[s]
        intercept = torch.where(cross[s], -l * u / (u - l).clamp(min=1e-300), torch.zeros_like(l))
        A = record[s]
        sc = A.clamp(max=0).abs() * intercept + 1e-6 * A.abs() * torch.minimum(u, -l).clamp(min=0) * cross[s]
        sc = torch.where(cross[s], sc, torch.full_like(sc, -1.0))
        scores.append(sc.view(D, R, -1).sum(1))
    return best.view(D, R), xstar, scores


def bab(b: Bounder, spec: VnnlibSpec, disjunct: int, expired: Callable[[], bool], left: Callable[[], float],
        batch: int = 32, steps: int = 15, lr: float = 0.1,
        confirm: Callable[[np.ndarray], np.ndarray | None] | None = None) -> tuple[str, np.ndarray | None, str, dict[str, Any]]:
    """Decide disjunct `disjunct` of `spec` ({A y ≤ b} empty?) on the merged ReLU network of `b` over its box.
    `confirm(x)`: the counterexample as it is reported (e.g. rounded to float32 and re-checked), or None when the
    float64 point does not survive that; the search then goes on. Returns ("unsat" | "sat" | "timeout" | "unknown",
    counterexample or None, message, statistics); unknown when an unsafe region was found whose points did not
    survive `confirm`."""
    confirm = confirm or (lambda x: x)
    if not b.net.is_relu:
        raise ValueError("branch and bound here splits ReLUs; the network has smooth gates")
    A, bvec = spec.disjuncts[disjunct]
    C = torch.as_tensor(A, dtype=DTYPE)
    d = -torch.as_tensor(bvec, dtype=DTYPE)
    sizes = [b.pre[s][0].numel() for s in range(len(b.sites))]
    if not sizes:  # no ReLU: the network is affine and one LP decides
        status, x, msg = milp.solve(b.net, spec, [], [disjunct], left)
        return status, x, f"an affine network: {msg}", {"domains": 1, "rounds": 0, "leaf_lps": 1, "max_queue": 1}
    queue: list[tuple[float, list[torch.Tensor]]] = [(-np.inf, [torch.zeros(n, dtype=torch.int8) for n in sizes])]
    stats = {"domains": 0, "rounds": 0, "leaf_lps": 0, "max_queue": 1, "unconfirmed": 0}
    t0 = time.perf_counter()
    while queue:
        if expired():
            return "timeout", None, f"branch and bound: {len(queue)} domains open after {stats['domains']}", stats
        queue.sort(key=lambda e: e[0])
        take, queue = queue[:batch], queue[batch:]
        splits = [torch.stack([dom[s] for _, dom in take]) for s in range(len(sizes))]
        lower, xstar, scores = _bound_batch(b, splits, C, d, steps, lr, expired)
        stats["domains"] += len(take)
        stats["rounds"] += 1
        with torch.no_grad():
            ys = b.net.forward(xstar).numpy()
        for j in range(ys.shape[0]):
            if spec.violation(ys[j]) <= 0:
                x = confirm(xstar[j].numpy())
                if x is not None:
                    return "sat", x, "branch and bound: a domain's bound minimizer is a counterexample", stats
                stats["unconfirmed"] += 1
        closed = lower.max(1).values > 0
        flat = torch.cat(scores, dim=1)  # [D, Σ n_s]
        offsets = np.cumsum([0] + sizes)
        for j, (_, dom) in enumerate(take):
            if bool(closed[j]):
                continue
            best = int(torch.argmax(flat[j]))
            if float(flat[j, best]) < 0:  # no unstable unit left: the LP over this activation pattern decides
                stats["leaf_lps"] += 1
                pre = []
                for s, t in enumerate(dom):
                    l, u = b.pre[s]
                    pre.append((torch.where(t > 0, l.clamp(min=0), l), torch.where(t < 0, u.clamp(max=0), u)))
                status, x, _ = milp.solve(b.net, spec, pre, [disjunct], left)
                if status == "sat":
                    x = confirm(x)
                    if x is not None:
                        return "sat", x, "branch and bound: a leaf LP point is a counterexample", stats
                    stats["unconfirmed"] += 1
                    continue
                if status != "unsat":
                    return status, None, "branch and bound: a leaf LP did not finish", stats
                continue
            s = int(np.searchsorted(offsets, best, side="right") - 1)
            i = best - int(offsets[s])
            for side in (1, -1):
                child = [t.clone() for t in dom]
                child[s][i] = side
                queue.append((float(lower[j].max()), child))
        stats["max_queue"] = max(stats["max_queue"], len(queue))
    detail = (f"{stats['domains']} domains in {stats['rounds']} rounds ({time.perf_counter() - t0:.2f} s), "
              f"{stats['leaf_lps']} leaf LPs")
    if stats["unconfirmed"]:
        return "unknown", None, (f"branch and bound: {stats['unconfirmed']} unsafe points in float64 that are none after "
                                 f"float32 rounding; {detail}"), stats
    return "unsat", None, f"branch and bound: {detail}", stats
