"""Branch and bound on unstable ReLUs with β-CROWN bounds, batched: the complete method that decides what the
bounds alone leave open.

A domain is the box plus sign constraints on some ReLU inputs (z ≥ 0 or z ≤ 0). Its bound: the root's
pre-activation intervals (`Bounder.pre`, CROWN/α-CROWN, fixed during the search as α,β-CROWN does by default)
clamped by the splits (a split unit is stable, so its relaxation is exact), and each split constraint −t·z ≤ 0
(t = ±1) added to the back-substitution with a multiplier β ≥ 0 (β-CROWN, Wang et al. 2021). α (lower ReLU slopes,
per property row) and β are optimized by projected Adam; every iterate's bound is sound and the best per domain
is kept.

One search covers every open disjunct of the property: a domain is closed when each of its rows (one per
disjunct of a robustness property) has a lower bound > 0.

A round takes the `batch` domains with the lowest bounds (best first) and:
1. chooses a split for each: the best unit by the BaBSR intercept score (the default), or with `candidates` > 1 by
   filtered smart branching (kFSB, De Palma et al. 2021 / α,β-CROWN): that many best units by the score, each
   evaluated by one CROWN pass over both children with the parent's α and β (no optimization), the unit whose worse
   child is best wins; when the queue holds fewer domains than the batch wants, a domain is split on several units at
   once (2^depth children), so early rounds are full;
2. bounds all children in one batched pass, α and β warm-started from the parent (a new split's β starts at 0);
3. runs each child's bound minimizer (a corner of the box per row) through the network, and every few rounds a short
   attack from the most violated ones: an unsafe point that survives `confirm` is a counterexample;
4. closes children whose rows are all > 0; a child with no unstable unit left is decided exactly by an LP (the MILP
   encoding with every unit stable has no binaries).
The answer: unsat when no domain is left, sat on a counterexample, timeout when the budget runs out, unknown when
an unsafe region was found whose points did not survive `confirm`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import attack, milp
from .bounds import Adam, Bounder
from .ops import DTYPE, ReLU
from .vnnlib import VnnlibSpec

STORE = torch.float32  # α and β between rounds (warm starts: any bound a decision rests on is recomputed in float64)


@dataclass
class Settings:
    batch: int = 256  # parent domains per round (256 gave the best global lower bound on 3 of 4 hard mnist_fc stand-ins at 30 s, against 64)
    steps: int = 10  # Adam steps per batch of children
    lr_alpha: float = 0.05
    lr_beta: float = 0.05
    # kFSB: units evaluated per domain (0: BaBSR alone, the default: measured side by side at batch 256, a better global
    # lower bound after 30 s on all 4 hard mnist_fc stand-ins and the 12 small-CNN properties in 5.9 s against 7.4 s;
    # benchmarks/VERIFICATION.md)
    candidates: int = 0
    max_split_depth: int = 5  # units split at once when the queue is short
    attack_every: int = 4  # rounds between attacks from the bound minimizers (0: never)
    # the search's arithmetic: float32 doubles the domains per second on a CPU; a domain it closes is closed only after
    # its bound, recomputed in float64 with the same α and β, is still > 0 for every disjunct
    dtype: torch.dtype = torch.float32


@dataclass
class Domain:
    splits: list[torch.Tensor]  # per ReLU site [n_s] int8 in {−1, 0, +1}
    alpha: list[torch.Tensor]  # per ReLU site [R, n_s]
    beta: list[torch.Tensor]  # per ReLU site [R, n_s]
    lower: torch.Tensor  # [R] best lower bounds of C y + d
    scores: list[torch.Tensor] | None = None  # per ReLU site [n_s] BaBSR scores (−1: not unstable)
    depth: int = 0

    @property
    def key(self) -> float:
        """Best first: the domain farthest from closed (its rows' total violation, most negative first)."""
        return float(self.lower.clamp(max=0).sum())


class _Search:
    def __init__(self, b: Bounder, C: torch.Tensor, d: torch.Tensor, owner: torch.Tensor, disjuncts: list[int],
                 s: Settings, expired: Callable[[], bool]):
        self.b, self.C, self.d, self.s, self.expired = b, C, d, s, expired
        self.owner, self.disjuncts = owner, disjuncts
        self.R = C.shape[0]
        self.relu_sites = [i for i in range(len(b.sites)) if isinstance(b.op(i), ReLU)]
        self.sizes = [b.pre[i][0].numel() for i in self.relu_sites]
        self.offsets = np.cumsum([0] + self.sizes)

    def closed(self, lower: torch.Tensor) -> torch.Tensor:
        """Per domain ([D, R] lower bounds): is every disjunct excluded, i.e. some row of each > 0?"""
        out = torch.ones(lower.shape[0], dtype=torch.bool)
        for k in self.disjuncts:
            out &= (lower[:, self.owner == k] > 0).any(1)
        return out

    # -- one batched bound pass --------------------------------------------------------------------
    def _setup(self, splits: list[torch.Tensor], dtype: torch.dtype):
        """Per-row intervals, β signs and the unstable masks for D domains' splits (each [D, n_s])."""
        R = self.R
        bounds, signs, cross = {}, {}, {}
        for j, s in enumerate(self.relu_sites):
            t = splits[j]
            l, u = (v.to(dtype) for v in self.b.pre[s])
            l = torch.where(t > 0, l.clamp(min=0), l.expand_as(t))
            u = torch.where(t < 0, u.clamp(max=0), u.expand_as(t))
            bounds[s] = (l.repeat_interleave(R, 0), u.repeat_interleave(R, 0))
            signs[s] = (-t).to(dtype).repeat_interleave(R, 0)
            cross[s] = (bounds[s][0] < 0) & (bounds[s][1] > 0)
        return bounds, signs, cross

    def _exact(self, splits: list[torch.Tensor], alpha: dict[int, torch.Tensor], beta: dict[int, torch.Tensor]) -> torch.Tensor:
        """[D, R] lower bounds in float64 for the given α, β ([D·R, n_s] each): what a decision rests on."""
        D = splits[0].shape[0]
        bounds, signs, cross = self._setup(splits, DTYPE)
        a = {s: torch.where(cross[s], v.to(DTYPE).clamp(0, 1), torch.zeros(1, dtype=DTYPE)) for s, v in alpha.items()}
        extra = {s: v.to(DTYPE).clamp(min=0) * signs[s] for s, v in beta.items()}
        with torch.no_grad():
            return (self.b.backward(self.C.repeat(D, 1), self.b.net.output, a, True, bounds, extra) + self.d.repeat(D)).view(D, -1)

    def bound(self, splits: list[torch.Tensor], alpha: list[torch.Tensor], beta: list[torch.Tensor], steps: int,
              need_scores: bool):
        """Bounds of D domains (splits [D, n_s], α and β [D, R, n_s] as warm starts), `steps` Adam steps in the search's
        dtype. Returns (lower bounds [D, R]: float64-verified where `closed` is set, the search's own values elsewhere;
        closed [D]; the input minimizers [D, R, n_in]; BaBSR scores per site [D, n_s] or None; the best α and β)."""
        D, R, dt = splits[0].shape[0], self.R, self.s.dtype
        bounds, signs, cross = self._setup(splits, dt)
        a = {s: torch.where(cross[s], alpha[j].reshape(D * R, -1).to(dt).clamp(0, 1), torch.zeros(1, dtype=dt)).requires_grad_(steps > 0)
             for j, s in enumerate(self.relu_sites)}
        bt = {s: beta[j].reshape(D * R, -1).to(dt).clamp(min=0).requires_grad_(steps > 0)
              for j, s in enumerate(self.relu_sites) if bool(signs[s].any())}
        A0 = self.C.to(dt).repeat(D, 1)
        dd = self.d.to(dt).repeat(D)
        opt = Adam(list(a.values()), lr=self.s.lr_alpha) if steps > 0 else None
        opt_b = Adam(list(bt.values()), lr=self.s.lr_beta) if steps > 0 and bt else None
        best = None
        best_a = {s: v.detach().clone() for s, v in a.items()}
        best_b = {s: v.detach().clone() for s, v in bt.items()}
        for i in range(steps + 1):
            last = i == steps or self.expired()
            record: dict[int, torch.Tensor] = {}
            inputs: list[torch.Tensor] = []
            extra = {s: bt[s] * signs[s] for s in bt}
            with torch.set_grad_enabled(not last):
                lower = self.b.backward(A0, self.b.net.output, a, True, bounds, extra,
                                        record if last else None, inputs if last else None) + dd
            if best is None:
                best = lower.detach()
            else:
                better = lower.detach() > best
                best = torch.where(better, lower.detach(), best)
                for s in a:  # keep the α and β of each row's best bound: the warm start the children inherit
                    best_a[s] = torch.where(better[:, None], a[s].detach(), best_a[s])
                for s in bt:
                    best_b[s] = torch.where(better[:, None], bt[s].detach(), best_b[s])
            if last:
                break
            if bool(torch.all(self.closed(best.view(D, R)))):
                steps = i + 1  # every domain closed: one more pass for the records
                continue
            opt.zero_grad()
            if opt_b is not None:
                opt_b.zero_grad()
            (-lower.clamp(max=0).sum() - 1e-3 * lower.sum()).backward()
            opt.step()
            if opt_b is not None:
                opt_b.step()
            with torch.no_grad():
                for v in a.values():
                    v.clamp_(0.0, 1.0)
                for v in bt.values():
                    v.clamp_(min=0.0)
        lower = best.view(D, R).to(DTYPE)
        closed = self.closed(lower)
        if dt != DTYPE and bool(closed.any()):  # the decision, in float64 with the same α and β
            idx = torch.nonzero(closed).flatten()
            rows = (idx[:, None] * R + torch.arange(R)).flatten()
            exact = self._exact([t[idx] for t in splits], {s: v[rows] for s, v in best_a.items()},
                                {s: v[rows] for s, v in best_b.items()})
            lower[idx] = exact
            closed[idx] = self.closed(exact)
        xstar = torch.where(inputs[0] >= 0, self.b.lb, self.b.ub).view(D, R, -1)
        scores = self._scores(bounds, cross, record, lower, D) if need_scores else None
        new_alpha = [best_a[s].view(D, R, -1).to(STORE) for s in self.relu_sites]
        new_beta = [(best_b[s] if s in best_b else torch.zeros(D * R, self.sizes[j])).view(D, R, -1).to(STORE)
                    for j, s in enumerate(self.relu_sites)]
        return lower, closed, xstar, scores, new_alpha, new_beta

    def _scores(self, bounds, cross, record, lower: torch.Tensor, D: int) -> list[torch.Tensor]:
        """BaBSR's intercept score per unstable unit: how much the upper relaxation's intercept −l·u/(u−l) costs the
        bound of the rows still open (coefficient weight of the rows with lower bound ≤ 0)."""
        R = self.R
        open_rows = (lower <= 0).to(record[self.relu_sites[0]].dtype).reshape(D * R, 1)
        out = []
        for s in self.relu_sites:
            l, u = bounds[s]
            intercept = torch.where(cross[s], -l * u / (u - l).clamp(min=1e-300), torch.zeros_like(l))
            A = record[s] * open_rows
            sc = A.clamp(max=0).abs() * intercept + 1e-6 * A.abs() * torch.minimum(u, -l).clamp(min=0) * cross[s]
            sc = sc.view(D, R, -1).sum(1)
            out.append(torch.where(cross[s].view(D, R, -1)[:, 0], sc, torch.full_like(sc, -1.0)))
        return out

    # -- branching ---------------------------------------------------------------------------------
    def _flat(self, scores: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(scores, dim=-1)

    def _unit(self, flat_index: int) -> tuple[int, int]:
        j = int(np.searchsorted(self.offsets, flat_index, side="right") - 1)
        return j, flat_index - int(self.offsets[j])

    def choose(self, parents: list[Domain]) -> list[int | None]:
        """Per parent, the flat index of the unit to split (kFSB), None when no unit is unstable."""
        flat = torch.stack([self._flat(p.scores) for p in parents])  # [P, N]
        k = max(1, min(self.s.candidates, flat.shape[1]))
        top = torch.topk(flat, k, dim=1)
        pick: list[int | None] = [int(top.indices[i, 0]) if float(top.values[i, 0]) >= 0 else None for i in range(len(parents))]
        if self.s.candidates <= 1 or self.expired():
            return pick
        # evaluate every candidate: both children, one CROWN pass with the parent's α and β
        rows = [(i, int(top.indices[i, c])) for i in range(len(parents)) for c in range(k) if float(top.values[i, c]) >= 0]
        if not rows:
            return pick
        splits, alpha, beta = [], [], []
        for i, unit in rows:
            for side in (1, -1):
                sp = [t.clone() for t in parents[i].splits]
                j, n = self._unit(unit)
                sp[j][n] = side
                splits.append(sp)
                alpha.append(parents[i].alpha)
                beta.append(parents[i].beta)
        stack = lambda xs: [torch.stack([x[j] for x in xs]) for j in range(len(self.relu_sites))]  # noqa: E731
        with torch.no_grad():
            lower, *_ = self.bound(stack(splits), stack(alpha), stack(beta), 0, False)
        value = lower.clamp(max=0).sum(1).view(-1, 2).min(1).values  # the worse child's total violation
        best: dict[int, tuple[float, int]] = {}
        for (i, unit), v in zip(rows, value.tolist()):
            if i not in best or v > best[i][0]:
                best[i] = (v, unit)
        return [best[i][1] if i in best else pick[i] for i in range(len(parents))]


def bab(b: Bounder, spec: VnnlibSpec, disjuncts: list[int], expired: Callable[[], bool], left: Callable[[], float],
        settings: Settings | None = None,
        confirm: Callable[[np.ndarray], np.ndarray | None] | None = None) -> tuple[str, np.ndarray | None, str, dict[str, Any]]:
    """Decide the disjuncts `disjuncts` of `spec` ({A y ≤ b} all empty?) on the merged graph of `b` over its box, by
    splitting its ReLUs (other activations keep their relaxations; a graph of ReLUs only is decided completely).
    `confirm(x)`: the counterexample as it is reported (rounded to float32 and re-checked), or None when the float64
    point does not survive that; the search then goes on. Returns ("unsat" | "sat" | "timeout" | "unknown",
    counterexample or None, message, statistics)."""
    s = settings or Settings()
    confirm = confirm or (lambda x: x)
    if b.net.smooth:
        raise ValueError("branch and bound here splits ReLUs; the network has smooth gates")
    rows = [(k, r) for k in disjuncts for r in range(spec.disjuncts[k][0].shape[0])]
    C = torch.as_tensor(np.stack([spec.disjuncts[k][0][r] for k, r in rows]), dtype=DTYPE)
    d = -torch.as_tensor([spec.disjuncts[k][1][r] for k, r in rows], dtype=DTYPE)
    owner = torch.as_tensor([k for k, _ in rows])
    search = _Search(b, C, d, owner, disjuncts, s, expired)
    stats = {"domains": 0, "rounds": 0, "leaf_lps": 0, "max_queue": 1, "unconfirmed": 0, "attacks": 0}
    if not search.relu_sites:  # no ReLU: nothing to branch on, one LP decides
        status, x, msg = milp.solve(b.net, spec, [], disjuncts, left)
        if status == "sat":
            x = confirm(x)
            status = "sat" if x is not None else "unknown"
        return status, x, f"no ReLU to split: {msg}", {**stats, "domains": 1, "leaf_lps": 1}
    R = search.R

    def unsafe(ys: np.ndarray) -> list[int]:
        return [i for i in range(ys.shape[0]) if min(float(np.max(spec.disjuncts[k][0] @ ys[i] - spec.disjuncts[k][1]))
                                                       for k in disjuncts) <= 0]

    t0 = time.perf_counter()
    zero = [torch.zeros(n, dtype=torch.int8) for n in search.sizes]
    init_alpha = [b.relaxation(site)[0].expand(R, -1).to(STORE) for site in search.relu_sites]
    init_beta = [torch.zeros(R, n, dtype=STORE) for n in search.sizes]
    stack1 = lambda xs: [x[None] for x in xs]  # noqa: E731
    lower, closed, xstar, scores, al, be = search.bound(stack1(zero), stack1(init_alpha), stack1(init_beta), s.steps, True)
    stats["domains"] += 1
    queue: list[Domain] = []
    if not bool(closed[0]):
        queue.append(Domain(zero, [a[0] for a in al], [x[0] for x in be], lower[0], [sc[0] for sc in scores]))
    while queue:
        if expired():
            stats["global_lower"] = min(float(q.lower.min()) for q in queue)
            return "timeout", None, (f"branch and bound: {len(queue)} domains open after {stats['domains']} "
                                     f"(global lower bound {stats['global_lower']:.4g})"), stats
        queue.sort(key=lambda e: e.key)
        take, queue = queue[:s.batch], queue[s.batch:]
        depth = 1
        if len(take) < s.batch and len(queue) == 0:
            depth = max(1, min(s.max_split_depth, int(math.log2(max(1.0, s.batch / len(take))))))
        picks = search.choose(take) if depth == 1 else [None] * len(take)
        children: list[tuple[Domain, list[torch.Tensor]]] = []
        for p, unit in zip(take, picks):
            if depth > 1:  # several units at once: the best `depth` by score
                flat = search._flat(p.scores)
                vals, idx = torch.topk(flat, min(depth, flat.numel()))
                units = [int(i) for v, i in zip(vals, idx) if float(v) >= 0]
            else:
                units = [] if unit is None else [unit]
            if not units:  # no unstable unit left: the LP over this activation pattern decides
                stats["leaf_lps"] += 1
                pre = {}
                for j, site in enumerate(search.relu_sites):
                    l, u = b.pre[site]
                    t = p.splits[j]
                    pre[site] = (torch.where(t > 0, l.clamp(min=0), l), torch.where(t < 0, u.clamp(max=0), u))
                status, x, _ = milp.solve(b.net, spec, [pre.get(i, b.pre[i]) for i in range(len(b.sites))], disjuncts, left)
                if status == "sat":
                    x = confirm(x)
                    if x is not None:
                        return "sat", x, "branch and bound: a leaf LP point is a counterexample", stats
                    stats["unconfirmed"] += 1
                    continue
                if status != "unsat":
                    return status, None, "branch and bound: a leaf LP did not finish", stats
                continue
            for signs in range(2 ** len(units)):
                sp = [t.clone() for t in p.splits]
                for bit, unit_ in enumerate(units):
                    j, n = search._unit(unit_)
                    sp[j][n] = 1 if (signs >> bit) & 1 else -1
                children.append((p, sp))
        if not children:
            continue
        st = lambda xs: [torch.stack([x[j] for x in xs]) for j in range(len(search.relu_sites))]  # noqa: E731
        lower, closed, xstar, scores, al, be = search.bound(st([sp for _, sp in children]), st([p.alpha for p, _ in children]),
                                                             st([p.beta for p, _ in children]), s.steps, True)
        stats["domains"] += len(children)
        stats["rounds"] += 1
        with torch.no_grad():
            ys = b.net.forward(xstar.reshape(-1, xstar.shape[-1])).numpy()
        for i in unsafe(ys):
            x = confirm(xstar.reshape(-1, xstar.shape[-1])[i].numpy())
            if x is not None:
                return "sat", x, "branch and bound: a domain's bound minimizer is a counterexample", stats
            stats["unconfirmed"] += 1
        for c, (p, _sp) in enumerate(children):
            if bool(closed[c]):
                continue
            queue.append(Domain(_sp, [a[c] for a in al], [x[c] for x in be], lower[c], [sc[c] for sc in scores], p.depth + 1))
        stats["max_queue"] = max(stats["max_queue"], len(queue))
        if s.attack_every and stats["rounds"] % s.attack_every == 0 and queue and not expired():
            x = _attack_from(b, spec, disjuncts, xstar, lower, expired)
            stats["attacks"] += 1
            if x is not None:
                x = confirm(x)
                if x is not None:
                    return "sat", x, "branch and bound: an attack from the domains' bound minimizers found a counterexample", stats
    detail = (f"{stats['domains']} domains in {stats['rounds']} rounds ({time.perf_counter() - t0:.2f} s), "
              f"{stats['leaf_lps']} leaf LPs")
    if stats["unconfirmed"]:
        return "unknown", None, (f"branch and bound: {stats['unconfirmed']} unsafe points in float64 that are none after "
                                 f"float32 rounding; {detail}"), stats
    return "unsat", None, f"branch and bound: {detail}", stats


def _attack_from(b: Bounder, spec: VnnlibSpec, disjuncts: list[int], xstar: torch.Tensor, lower: torch.Tensor,
                 expired: Callable[[], bool], starts: int = 8) -> np.ndarray | None:
    """A short attack started at the bound minimizers of the most violated domains of the last round."""
    worst = torch.argsort(lower.min(1).values)[:starts]
    points = xstar[worst].reshape(-1, xstar.shape[-1])
    sub = VnnlibSpec(spec.lb, spec.ub, tuple(spec.disjuncts[k] for k in disjuncts), spec.num_outputs)
    for p in points[:starts]:
        x, v = attack.pgd(b.net, sub, steps=15, restarts=0, start=p.numpy(), step_scale=0.1, expired=expired)
        if x is not None:
            return x
        if expired():
            break
    return None
