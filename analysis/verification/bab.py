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
2. bounds all children in one batched pass, α and β warm-started from the parent (a new split's β starts at 0); a
   child bounds only the rows of the disjuncts its parent's bounds leave open (the others keep the parent's bound,
   which holds on the child's smaller region);
3. runs each child's bound minimizer (a corner of the box per row) through the network, and every few rounds a short
   attack from the most violated ones: an unsafe point that survives `confirm` is a counterexample;
4. closes children whose disjuncts are all excluded (after a float64 re-check of every row); a child with no
   unstable unit left is decided exactly by an LP (the MILP encoding with every unit stable has no binaries).
The answer: unsat when no domain is left, sat on a counterexample, timeout when the budget runs out, unknown when
an unsafe region was found whose points did not survive `confirm`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from . import attack, milp
from .bounds import Adam, Bounder, ReluLines
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


class _Expired(Exception):
    """The budget ran out inside a batch's bound pass (raised between Adam steps, so a search stops within one step
    of its limit rather than after the batch's last pass and its float64 re-check)."""


class Bounded(NamedTuple):
    """One batched bound pass over D domains."""

    lower: torch.Tensor  # [D, R]: float64-verified where `closed` is set, the search's own values elsewhere
    closed: torch.Tensor  # [D]
    points: torch.Tensor  # [M, n_in]: each bounded row's bound minimizer (a corner of the box)
    rows: torch.Tensor  # [M]: each bounded row's flat index d·R + r into `lower`
    scores: list[torch.Tensor] | None  # per ReLU site [D, n_s] BaBSR scores (−1: not unstable)
    alpha: list[torch.Tensor]  # per ReLU site [D, R, n_s]: the best α (the warm start of the children)
    beta: list[torch.Tensor]


class _Search:
    def __init__(self, b: Bounder, spec: VnnlibSpec, disjuncts: list[int], s: Settings, expired: Callable[[], bool]):
        """The rows C y + d of the disjuncts `disjuncts` of `spec` (a disjunct {A y ≤ b} is excluded when some row of
        A y − b has lower bound > 0), each row's disjunct in `owner`."""
        rows = [(k, r) for k in disjuncts for r in range(spec.disjuncts[k][0].shape[0])]
        dev = self.device = b.device
        self.C = torch.as_tensor(np.stack([spec.disjuncts[k][0][r] for k, r in rows]), dtype=DTYPE, device=dev)
        self.d = -torch.as_tensor([spec.disjuncts[k][1][r] for k, r in rows], dtype=DTYPE, device=dev)
        self.owner = torch.as_tensor([k for k, _ in rows], device=dev)
        self.b, self.s, self.expired, self.disjuncts = b, s, expired, disjuncts
        self.R = self.C.shape[0]
        self.relu_sites = [i for i in range(len(b.sites)) if isinstance(b.op(i), ReLU)]
        self.sizes = [b.pre[i][0].numel() for i in self.relu_sites]
        self.offsets = np.cumsum([0] + self.sizes)

    def excluded(self, lower: torch.Tensor) -> torch.Tensor:
        """Per domain and row ([D, R] lower bounds): is the row's disjunct excluded, i.e. some row of it > 0?"""
        out = torch.zeros(lower.shape, dtype=torch.bool, device=lower.device)
        for k in self.disjuncts:
            rows = self.owner == k
            out[:, rows] = (lower[:, rows] > 0).any(1, keepdim=True)
        return out

    def closed(self, lower: torch.Tensor) -> torch.Tensor:
        """Per domain ([D, R] lower bounds): is every disjunct excluded?"""
        return self.excluded(lower).all(1)

    # -- one batched bound pass --------------------------------------------------------------------
    def _setup(self, splits: list[torch.Tensor], dtype: torch.dtype, dom: torch.Tensor):
        """For D domains' splits (each [D, n_s]): per bounded row (its domain `dom`) the intervals and β signs, and
        per domain the unstable masks."""
        bounds, signs, cross = {}, {}, {}
        for j, s in enumerate(self.relu_sites):
            t = splits[j]
            l, u = (v.to(dtype) for v in self.b.pre[s])
            l = torch.where(t > 0, l.clamp(min=0), l.expand_as(t))
            u = torch.where(t < 0, u.clamp(max=0), u.expand_as(t))
            bounds[s] = (l[dom], u[dom])
            signs[s] = (-t).to(dtype)[dom]
            cross[s] = (l < 0) & (u > 0)
        return bounds, signs, cross

    def _exact(self, splits: list[torch.Tensor], alpha: list[torch.Tensor], beta: list[torch.Tensor]) -> torch.Tensor:
        """[D, R] lower bounds in float64 for the given α, β ([D, R, n_s] each), every row: what a decision rests on."""
        D, R = splits[0].shape[0], self.R
        dom = torch.arange(D, device=self.device).repeat_interleave(R)
        bounds, signs, _ = self._setup(splits, DTYPE, dom)
        lines = {s: ReluLines.of(*bounds[s]) for s in self.relu_sites}  # α counts only where a unit crosses 0
        a = {s: alpha[j].reshape(D * R, -1).to(DTYPE).clamp(0, 1) for j, s in enumerate(self.relu_sites)}
        extra = {s: beta[j].reshape(D * R, -1).to(DTYPE).clamp(min=0) * signs[s] for j, s in enumerate(self.relu_sites)}
        with torch.no_grad():
            return (self.b.backward(self.C.repeat(D, 1), self.b.net.output, a, True, lines, extra) + self.d.repeat(D)).view(D, -1)

    def bound(self, splits: list[torch.Tensor], alpha: list[torch.Tensor], beta: list[torch.Tensor], steps: int,
              need_scores: bool, prior: torch.Tensor | None = None) -> Bounded:
        """Bounds of D domains (splits [D, n_s], α and β [D, R, n_s] as warm starts), `steps` Adam steps in the search's
        dtype. `prior` [D, R]: lower bounds known to hold on each domain (its parent's); the rows of disjuncts they
        already exclude keep them and are not bounded again, so a round's work goes to the disjuncts still open
        (α,β-CROWN gets the same by running its search per open label)."""
        D, R, dt = splits[0].shape[0], self.R, self.s.dtype
        active = torch.ones(D, R, dtype=torch.bool, device=self.device) if prior is None else ~self.excluded(prior)
        flat = torch.nonzero(active.flatten()).flatten()
        dom, row = flat // R, flat % R
        bounds, signs, cross = self._setup(splits, dt, dom)
        a = {s: torch.where(cross[s][dom], alpha[j].reshape(D * R, -1)[flat].to(dt).clamp(0, 1),
                            torch.zeros(1, dtype=dt, device=self.device)).requires_grad_(steps > 0)
             for j, s in enumerate(self.relu_sites)}
        bt = {s: beta[j].reshape(D * R, -1)[flat].to(dt).clamp(min=0).requires_grad_(steps > 0)
              for j, s in enumerate(self.relu_sites) if bool(signs[s].any())}
        A0 = self.C.to(dt)[row]
        dd = self.d.to(dt)[row]
        full = torch.full((D, R), -math.inf, dtype=DTYPE, device=self.device) if prior is None else prior.to(DTYPE).clone()
        lines = {s: ReluLines.of(*bounds[s]) for s in self.relu_sites}  # fixed over the steps: only α changes

        def whole(part: torch.Tensor) -> torch.Tensor:  # the bounded rows' values in place, the prior elsewhere
            out = full.clone()
            out.view(-1)[flat] = part.to(DTYPE)
            return out

        opt = Adam(list(a.values()), lr=self.s.lr_alpha) if steps > 0 else None
        opt_b = Adam(list(bt.values()), lr=self.s.lr_beta) if steps > 0 and bt else None
        best = None
        best_a = {s: v.detach().clone() for s, v in a.items()}
        best_b = {s: v.detach().clone() for s, v in bt.items()}
        for i in range(steps + 1):
            if i > 0 and self.expired():
                raise _Expired  # a batch cut short is dropped whole: its parents stay open for the timeout's report
            last = i == steps
            record: dict[int, torch.Tensor] = {}
            inputs: list[torch.Tensor] = []
            extra = {s: bt[s] * signs[s] for s in bt}
            with torch.set_grad_enabled(not last):
                lower = self.b.backward(A0, self.b.net.output, a, True, lines, extra,
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
            if bool(torch.all(self.closed(whole(best)))):
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
        new_alpha, new_beta = [], []
        for j, s in enumerate(self.relu_sites):  # the bounded rows' best α and β, the warm starts elsewhere
            na = alpha[j].reshape(D * R, -1).to(STORE).clone()
            na[flat] = best_a[s].to(STORE)
            new_alpha.append(na.view(D, R, -1))
            nb = beta[j].reshape(D * R, -1).to(STORE).clone()
            if s in best_b:
                nb[flat] = best_b[s].to(STORE)
            new_beta.append(nb.view(D, R, -1))
        lower = whole(best)
        closed = self.closed(lower)
        if dt != DTYPE and bool(closed.any()):  # the decision, in float64, every row (the prior's too) with its α and β
            idx = torch.nonzero(closed).flatten()
            exact = self._exact([t[idx] for t in splits], [v[idx] for v in new_alpha], [v[idx] for v in new_beta])
            lower[idx] = exact
            closed[idx] = self.closed(exact)
        points = torch.where(inputs[0] >= 0, self.b.lb, self.b.ub)
        scores = self._scores(bounds, cross, record, lower.view(-1)[flat], dom, D) if need_scores else None
        return Bounded(lower, closed, points, flat, scores, new_alpha, new_beta)

    def _scores(self, bounds, cross, record, lower: torch.Tensor, dom: torch.Tensor, D: int) -> list[torch.Tensor]:
        """BaBSR's intercept score per unstable unit and domain: how much the upper relaxation's intercept −l·u/(u−l)
        costs the bound of the rows still open (coefficient weight of the bounded rows with lower bound ≤ 0)."""
        open_rows = (lower <= 0).to(record[self.relu_sites[0]].dtype)[:, None]
        out = []
        for s in self.relu_sites:
            l, u = bounds[s]
            crs = cross[s][dom]
            intercept = torch.where(crs, -l * u / (u - l).clamp(min=1e-300), torch.zeros_like(l))
            A = record[s] * open_rows
            sc = A.clamp(max=0).abs() * intercept + 1e-6 * A.abs() * torch.minimum(u, -l).clamp(min=0) * crs
            sc = sc.new_zeros(D, sc.shape[1]).index_add_(0, dom, sc)
            out.append(torch.where(cross[s], sc, torch.full_like(sc, -1.0)))
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
        prior = torch.stack([parents[i].lower for i, _ in rows for _side in (1, -1)])
        with torch.no_grad():
            lower = self.bound(stack(splits), stack(alpha), stack(beta), 0, False, prior).lower
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
    search = _Search(b, spec, disjuncts, s, expired)
    stats = {"domains": 0, "rounds": 0, "leaf_lps": 0, "max_queue": 1, "unconfirmed": 0, "attacks": 0}
    if not search.relu_sites:  # no ReLU: nothing to branch on, one LP decides
        status, x, msg = milp.solve(b.net, spec, [], disjuncts, left)
        if status == "sat":
            x = confirm(x)
            status = "sat" if x is not None else "unknown"
        return status, x, f"no ReLU to split: {msg}", {**stats, "domains": 1, "leaf_lps": 1}
    R = search.R

    sub = VnnlibSpec(spec.lb, spec.ub, tuple(spec.disjuncts[k] for k in disjuncts), spec.num_outputs)  # the open disjuncts

    t0 = time.perf_counter()
    zero = [torch.zeros(n, dtype=torch.int8, device=b.device) for n in search.sizes]
    init_alpha = [b.relaxation(site)[0].expand(R, -1).to(STORE) for site in search.relu_sites]
    init_beta = [torch.zeros(R, n, dtype=STORE, device=b.device) for n in search.sizes]
    stack1 = lambda xs: [x[None] for x in xs]  # noqa: E731
    def timeout(open_: list[Domain]):
        stats["global_lower"] = min(float(q.lower.min()) for q in open_)
        return "timeout", None, (f"branch and bound: {len(open_)} domains open after {stats['domains']} "
                                 f"(global lower bound {stats['global_lower']:.4g})"), stats

    try:
        r = search.bound(stack1(zero), stack1(init_alpha), stack1(init_beta), s.steps, True)
    except _Expired:
        return "timeout", None, "branch and bound: the budget ran out inside the root's bound", stats
    stats["domains"] += 1
    queue: list[Domain] = []
    if not bool(r.closed[0]):
        queue.append(Domain(zero, [a[0] for a in r.alpha], [x[0] for x in r.beta], r.lower[0], [sc[0] for sc in r.scores]))
    while queue:
        if expired():
            return timeout(queue)
        queue.sort(key=lambda e: e.key)
        take, queue = queue[:s.batch], queue[s.batch:]
        depth = 1
        if len(take) < s.batch and len(queue) == 0:
            depth = max(1, min(s.max_split_depth, int(math.log2(max(1.0, s.batch / len(take))))))
        try:
            picks = search.choose(take) if depth == 1 else [None] * len(take)
        except _Expired:
            return timeout(take + queue)
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
        try:
            r = search.bound(st([sp for _, sp in children]), st([p.alpha for p, _ in children]),
                             st([p.beta for p, _ in children]), s.steps, True, torch.stack([p.lower for p, _ in children]))
        except _Expired:
            return timeout(list({id(p): p for p, _ in children}.values()) + queue)
        stats["domains"] += len(children)
        stats["rounds"] += 1
        with torch.no_grad():
            unsafe = torch.nonzero(sub.violations(b.net.forward(r.points)) <= 0).flatten().tolist()  # usually none
        for i in unsafe:
            x = confirm(r.points[i].cpu().numpy())
            if x is not None:
                return "sat", x, "branch and bound: a domain's bound minimizer is a counterexample", stats
            stats["unconfirmed"] += 1
        for c, (p, _sp) in enumerate(children):
            if bool(r.closed[c]):
                continue
            queue.append(Domain(_sp, [a[c] for a in r.alpha], [x[c] for x in r.beta], r.lower[c], [sc[c] for sc in r.scores],
                                p.depth + 1))
        stats["max_queue"] = max(stats["max_queue"], len(queue))
        if s.attack_every and stats["rounds"] % s.attack_every == 0 and queue and not expired():
            x = _attack_from(b, sub, r.points, r.lower.view(-1)[r.rows], expired)
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


def _attack_from(b: Bounder, sub: VnnlibSpec, points: torch.Tensor, lower: torch.Tensor,
                 expired: Callable[[], bool], starts: int = 8) -> np.ndarray | None:
    """A short attack on `sub` (the open disjuncts) started at the bound minimizers ([M, n_in], their rows' lower
    bounds [M]) of the most violated rows of the last round."""
    for p in points[torch.argsort(lower)[:starts]]:
        x, v = attack.pgd(b.net, sub, steps=15, restarts=0, start=p, step_scale=0.1, expired=expired)
        if x is not None:
            return x
        if expired():
            break
    return None
