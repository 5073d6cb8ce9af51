"""A ReLU branch and bound's domains (`bab.bab`): what they are and their batched β-CROWN bound pass.

A domain is the box plus sign constraints on some ReLU inputs (z ≥ 0 or z ≤ 0) and, on an int8 graph, index ranges
of some grid units (a rounding's or the input quantization's grid index k in [k_lo, k_hi]: `Settings.grid_values`;
their lines narrow to the range, and a rounding's implied input constraint gets a β). Its bound: the root's
pre-activation intervals (`Bounder.pre`, CROWN/α-CROWN, fixed during the search as α,β-CROWN does by default)
clamped by the splits (a split unit is stable, so its relaxation is exact), and each split constraint −t·z ≤ 0
(t = ±1) added to the back-substitution with a multiplier β ≥ 0 (β-CROWN, Wang et al. 2021). α (lower ReLU slopes,
per property row) and β are optimized by projected Adam; every iterate's bound is sound and the best per domain
is kept.

Everything runs on the Bounder's device (`Bounder.device`, its graph's): the open domains are rows of tensors there
(`bab.Store`: splits, α, β, the rows' lower bounds, BaBSR scores, depth), and selection (a topk over the rows' total
violation), splitting (children by a scatter of sign patterns), kFSB and pruning (a boolean mask) read no domain on the
host; a round reads a few numbers (whether a leaf or an unsafe minimizer exists, the largest split count per site).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from .alpha import Adam
from .bounds import Bounder, FixedLines
from .branching import Branching
from .crown import CHUNK_ELEMENTS
from .ops.base import DTYPE
from .ops.relu import ReluLines
from .ops.rounding import QuantizedInput, Rounding
from .vnnlib import VnnlibSpec

# α and β between rounds, per device: warm starts only (any value is sound, and a closing decision's float64 re-check
# recomputes the bound with the stored values), so a GPU, whose open domains can number millions, keeps them in half
STORE = {"cpu": torch.float32, "cuda": torch.float16}
# a domain whose re-bounded interval of some unit has l − u above this (relative) is empty: float64 back-substitution
# misses by ~1e-12 relative, so no input of the domain can lie there
EMPTY_TOL = 1e-8

# what a resumed search takes over from the one that left its domains: the grid units its splits count from
GRID_STATE = ("round_sites", "grid", "V", "W", "k0", "step", "bidx", "bE")


@dataclass
class Settings:
    batch: int = 0  # parent domains per round; 0: `default_batch` (CPU_BATCH on a CPU, from free memory on a GPU)
    sharers: int = 1  # processes searching on the same GPU at once (their memory plans divide it)
    steps: int = 10  # Adam steps per batch of children
    lr_alpha: float = 0.05
    lr_beta: float = 0.05
    # kFSB: units evaluated per domain (0: BaBSR alone, the default: a better global lower bound in the same time;
    # docs/EXPERIMENTS.md, "Branch-and-bound settings")
    candidates: int = 0
    max_split_depth: int = 5  # units split at once when the queue is short
    attack_every: int = 4  # rounds between attacks from the bound minimizers (0: never)
    # the search's arithmetic: float32 doubles the domains per second on a CPU; a domain it closes is closed only after
    # its bound, recomputed in float64 with the same α and β, is still > 0 for every disjunct
    dtype: torch.dtype = torch.float32
    # per-domain intermediate bounds: each child's intervals of this many ReLU sites after its split bounded again
    # (`bab_domains.Search.rebound`); 0: the root's intervals clamped by the splits, as α,β-CROWN by default: on the CPU each
    # later site costs more domains than its bounds win (docs/EXPERIMENTS.md, "Branch-and-bound settings")
    rebound: int = 0
    # grid splits: a grid unit (a rounding's, an input pixel's) whose root interval allows 2..grid_values
    # grid indices may be split on its index, k ≤ j | k ≥ j + 1, after the ReLUs (`relu_first`), where a leaf's MILP
    # does not finish (`LEAF_MILP_S`); 0: ReLU splits only
    grid_values: int = 4
    # grid units per domain evaluated by their children's bounds beside the ReLUs (`choose`); 0: the scores alone
    # decide, since a ReLU's worse child was always the better one (docs/EXPERIMENTS.md, "Grid splits")
    grid_candidates: int = 0



class Expired(Exception):
    """The budget ran out inside a batch's bound pass (raised between Adam steps, so a search stops within one step
    of its limit rather than after the batch's last pass and its float64 re-check)."""



class Bounded(NamedTuple):
    """One batched bound pass over D domains."""

    lower: torch.Tensor  # [D, R]: float64-verified where `closed` is set, the search's own values elsewhere
    closed: torch.Tensor  # [D]
    points: torch.Tensor  # [M, n_in]: each bounded row's bound minimizer (a corner of the box)
    rows: torch.Tensor  # [M]: each bounded row's flat index d·R + r into `lower`
    scores: list[torch.Tensor] | None  # per ReLU site [D, n_s] BaBSR scores (−1: not unstable), then the grid units' [D, V]
    alpha: list[torch.Tensor]  # per ReLU site [D, R, n_s]: the best α (the warm start of the children)
    beta: list[torch.Tensor]
    rbeta: torch.Tensor | None = None  # [D, R, 2W]: the grid splits' β (`Search.bidx`)



class Search(Branching):
    """The rows of a property's open disjuncts, the ReLU and grid units a domain may split, and the batched bound
    pass over domains (the branching heuristics come from `branching.Branching`)."""

    def __init__(self, b: Bounder, spec: VnnlibSpec, disjuncts: list[int], s: Settings, expired: Callable[[], bool]):
        """The rows C y + d of the disjuncts `disjuncts` of `spec` (a disjunct {A y ≤ b} is excluded when some row of
        A y − b has lower bound > 0), each row's disjunct in `owner`."""
        rows = [(k, r) for k in disjuncts for r in range(spec.disjuncts[k][0].shape[0])]
        dev = self.device = b.device
        self.store = STORE.get(dev.type, torch.float32)
        self.C = torch.as_tensor(np.stack([spec.disjuncts[k][0][r] for k, r in rows]), dtype=DTYPE, device=dev)
        self.d = -torch.as_tensor([spec.disjuncts[k][1][r] for k, r in rows], dtype=DTYPE, device=dev)
        self.owner = torch.as_tensor([k for k, _ in rows], device=dev)
        self.slot = torch.as_tensor([disjuncts.index(k) for k, _ in rows], device=dev)  # each row's disjunct, 0..K−1
        self.b, self.s, self.expired, self.disjuncts = b, s, expired, disjuncts
        self.R = self.C.shape[0]
        self.relu_sites = [i for i in range(len(b.sites)) if b.op(i).branchable]
        self.sizes = [b.pre[i][0].numel() for i in self.relu_sites]
        self.ends = torch.as_tensor(self.sizes, device=dev).cumsum(0)  # unit u is on ReLU site bucketize(u, ends, right)
        self.U = sum(self.sizes)
        # grid units: the units of the input's first quantization and of every grid rounding whose root
        # interval allows 2..`grid_values` grid indices, V of them; a domain's splits hold for unit v, in columns U + v
        # and U + V + v, how far its k_lo rose and its k_hi fell from the root's (int8: < grid_values)
        self.round_sites, self.V, self.W = [], 0, 0
        # per grid site: (its units, their positions v, the root's index ranges of the site, steps, E (None: the input's
        # quantization, whose split implies no constraint on anything the graph reads: it reads the input only there))
        self.grid: dict[int, tuple] = {}
        sites = [i for i in range(len(b.sites)) if isinstance(b.op(i), (Rounding, QuantizedInput))
                 and b.op(i).step is not None] if s.grid_values >= 2 else []
        for i in sites:
            op = b.op(i)
            k_lo, k_hi = op.k_range(*(t.to(DTYPE) for t in b.pre[i]))
            unit = torch.nonzero((k_hi > k_lo) & (k_hi - k_lo < s.grid_values)).flatten()
            if not unit.numel():
                continue
            E = op.E.to(DTYPE)[unit] if isinstance(op, Rounding) else None
            self.round_sites.append(i)
            self.grid[i] = (unit, torch.arange(self.V, self.V + unit.numel(), device=dev), (k_lo, k_hi),
                            op.step.to(DTYPE)[unit], E)
            self.V += unit.numel()
        if self.V:
            g = [self.grid[i] for i in self.round_sites]
            self.k0 = (torch.cat([k[0][u] for u, _, k, _, _ in g]), torch.cat([k[1][u] for u, _, k, _, _ in g]))  # [V]
            self.step = torch.cat([st for _, _, _, st, _ in g])
            # the roundings' units carry β on the input constraint a split implies, x ≥ s·k_lo − E or x ≤ s·k_hi + E:
            # W of them, β [R, 2W] per domain (β_lo, β_hi)
            self.bidx = torch.cat([v for _, v, _, _, E in g if E is not None] or [torch.zeros(0, dtype=torch.long, device=dev)])
            self.W = self.bidx.numel()
            if self.W:
                self.bE = torch.cat([E for _, _, _, _, E in g if E is not None])

    def excluded(self, lower: torch.Tensor) -> torch.Tensor:
        """Per domain and row ([D, R] lower bounds): is the row's disjunct excluded, i.e. some row of it > 0?"""
        slot = self.slot.expand_as(lower)
        per = lower.new_zeros(lower.shape[0], len(self.disjuncts)).scatter_reduce(1, slot, (lower > 0).to(lower.dtype), "amax")
        return per.gather(1, slot) > 0

    def closed(self, lower: torch.Tensor) -> torch.Tensor:
        """Per domain ([D, R] lower bounds): is every disjunct excluded?"""
        return self.excluded(lower).all(1)

    def k_of(self, splits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per domain the index range of every grid unit ([D, V] each, float64) its splits allow."""
        U, V = self.U, self.V
        return self.k0[0] + splits[:, U:U + V].to(DTYPE), self.k0[1] - splits[:, U + V:].to(DTYPE)

    def _grid(self, splits: torch.Tensor, dom: torch.Tensor, dtype: torch.dtype):
        """For D domains' splits ([D, U + 2V]) and the bounded rows' domains `dom`: per grid site where some domain of
        the batch has split (one read per round) the rows' lines on their domains' index ranges (`FixedLines`), and
        for β (None where no β unit moved): per row and β unit, which ends moved ([rows, 2, W] mask) and the input
        constraints' thresholds s·k_lo − E and s·k_hi + E."""
        if not self.V:
            return {}, None
        klo, khi = self.k_of(splits)
        moved = (splits[:, self.U:] != 0).view(splits.shape[0], 2, self.V)
        any_v = moved.any(0).any(0)
        lines = {}
        for site in self.round_sites:
            unit, v, (k_lo, k_hi), _, _ = self.grid[site]
            if not bool(any_v[v].any()):
                continue
            l, u = self.b.pre[site]
            rows = dom.numel()
            kl, kh = k_lo.expand(rows, -1).clone(), k_hi.expand(rows, -1).clone()
            kl[:, unit], kh[:, unit] = klo[:, v][dom], khi[:, v][dom]
            lines[site] = FixedLines(*self.b.op(site).lines(l.to(DTYPE), u.to(DTYPE), (kl, kh))).to(dtype)
        if not self.W or not bool(any_v[self.bidx].any()):
            return lines, None
        st, E = self.step[self.bidx], self.bE
        c = torch.stack([klo[:, self.bidx][dom] * st - E, khi[:, self.bidx][dom] * st + E], 1)
        return lines, (moved[:, :, self.bidx][dom].to(dtype), c.to(dtype))

    def _grid_terms(self, rb: torch.Tensor | None, cons) -> tuple[dict[int, torch.Tensor], torch.Tensor | int]:
        """β·(c_lo − x) and β·(x − c_hi) (each ≤ 0 on the domain) as coefficients on the grid sites' inputs and a
        constant per row; rb [rows, 2, W] (β_lo, β_hi)."""
        if rb is None:
            return {}, 0
        mask, c = cons
        w = rb * mask
        const = (w[:, 0] * c[:, 0]).sum(1) - (w[:, 1] * c[:, 1]).sum(1)
        coef = w[:, 1] - w[:, 0]  # [rows, W]
        extra, at = {}, 0
        for site in self.round_sites:
            unit, _, _, _, E = self.grid[site]
            if E is None:
                continue
            n = unit.numel()
            extra[site] = coef.new_zeros(coef.shape[0], self.b.pre[site][0].numel()).index_add(1, unit, coef[:, at:at + n])
            at += n
        return extra, const

    # -- one batched bound pass --------------------------------------------------------------------
    def _setup(self, splits: list[torch.Tensor], dtype: torch.dtype, dom: torch.Tensor,
               pre: list[tuple[torch.Tensor, torch.Tensor]] | None = None, with_signs: bool = True):
        """For D domains' splits (each [D, n_s]): per bounded row (its domain `dom`) the intervals and β signs (dense;
        not made unless `with_signs`), and per domain the unstable masks. `pre`: each domain's own intervals per ReLU
        site ([D, n_s] each; default the root's), clamped by its splits here."""
        bounds, signs, cross = {}, {}, {}
        for j, s in enumerate(self.relu_sites):
            t = splits[j]
            l, u = (v.to(dtype) for v in (self.b.pre[s] if pre is None else pre[j]))
            l = torch.where(t > 0, l.clamp(min=0), l.expand_as(t))
            u = torch.where(t < 0, u.clamp(max=0), u.expand_as(t))
            bounds[s] = (l[dom], u[dom])
            if with_signs:
                signs[s] = (-t).to(dtype)[dom]
            cross[s] = (l < 0) & (u > 0)
        return bounds, signs, cross

    def _exact(self, splits: torch.Tensor, alpha: list[torch.Tensor], beta: list[torch.Tensor],
               pre: list[tuple[torch.Tensor, torch.Tensor]] | None = None, rbeta: torch.Tensor | None = None) -> torch.Tensor:
        """[D, R] lower bounds in float64 for the given α, β ([D, R, n_s] each; grid β [D, R, 2W]) of the domains
        `splits` ([D, U + 2V]), every row: what a decision rests on."""
        D, R = splits.shape[0], self.R
        dom = torch.arange(D, device=self.device).repeat_interleave(R)
        bounds, signs, _ = self._setup(self.per_site(splits[:, :self.U]), DTYPE, dom, pre)
        lines = {s: ReluLines.of(*bounds[s]) for s in self.relu_sites}  # α counts only where a unit crosses 0
        a = {s: alpha[j].reshape(D * R, -1).to(DTYPE).clamp(0, 1) for j, s in enumerate(self.relu_sites)}
        extra = {s: beta[j].reshape(D * R, -1).to(DTYPE).clamp(min=0) * signs[s] for j, s in enumerate(self.relu_sites)}
        glines, cons = self._grid(splits, dom, DTYPE)
        lines |= glines
        rb = None if cons is None else rbeta.reshape(D * R, 2, -1).to(DTYPE).clamp(min=0)
        gextra, gconst = self._grid_terms(rb, cons)
        with torch.no_grad():
            return (self.b.backward(self.C.repeat(D, 1), self.b.net.output, a, True, lines, extra | gextra)
                    + self.d.repeat(D) + gconst).view(D, -1)

    def bound(self, all_splits: torch.Tensor, alpha: list[torch.Tensor], beta: list[torch.Tensor], steps: int,
              need_scores: bool, prior: torch.Tensor | None = None,
              pre: list[tuple[torch.Tensor, torch.Tensor]] | None = None, rbeta: torch.Tensor | None = None) -> Bounded:
        """Bounds of D domains (splits [D, U + 2V], α and β [D, R, n_s] per ReLU site, grid β [D, R, 2W], as warm
        starts), `steps` Adam steps in the search's dtype. `prior` [D, R]: lower bounds known to hold on each domain
        (its parent's); the rows of disjuncts they already exclude keep them and are not bounded again, so a round's
        work goes to the disjuncts still open (α,β-CROWN gets the same by running its search per open label), and the
        others keep the better of the two. `pre`: each domain's own intervals (`rebound`; default the root's for all)."""
        splits = self.per_site(all_splits[:, :self.U])
        D, R, dt = all_splits.shape[0], self.R, self.s.dtype
        active = torch.ones(D, R, dtype=torch.bool, device=self.device) if prior is None else ~self.excluded(prior)
        flat = torch.nonzero(active.flatten()).flatten()
        dom, row = flat // R, flat % R
        bounds, _, cross = self._setup(splits, dt, dom, pre, with_signs=False)
        # grid splits: their sites' lines per row, and β ≥ 0 per row on each split unit's implied input constraints
        glines, cons = self._grid(all_splits, dom, dt)
        rb = None if cons is None else rbeta.reshape(D * R, 2, -1)[flat].to(dt).clamp(min=0).requires_grad_(steps > 0)
        a = {s: torch.where(cross[s][dom], alpha[j].reshape(D * R, -1)[flat].to(dt).clamp(0, 1),
                            torch.zeros(1, dtype=dt, device=self.device)).requires_grad_(steps > 0)
             for j, s in enumerate(self.relu_sites)}
        # β only where a domain has a split (a few units of hundreds): per site the split units of each domain, padded
        # to the batch's most ([D, K]; padding has sign 0, so its β gets no gradient), β gathered there per row
        where_split, sign_at, bt = {}, {}, {}
        for j, s in enumerate(self.relu_sites):
            t = splits[j]
            k = int((t != 0).sum(1).max()) if t.numel() else 0  # one read per site and round
            if k == 0:
                continue
            idx = torch.topk((t != 0).to(torch.int8), k, dim=1).indices  # [D, K] distinct units, the splits first
            where_split[s] = idx[dom]
            sign_at[s] = (-t.gather(1, idx)).to(dt)[dom]
            bt[s] = beta[j].reshape(D * R, -1)[flat].gather(1, where_split[s]).to(dt).clamp(min=0).requires_grad_(steps > 0)
        A0 = self.C.to(dt)[row]
        dd = self.d.to(dt)[row]
        full = torch.full((D, R), -math.inf, dtype=DTYPE, device=self.device) if prior is None else prior.to(DTYPE).clone()
        lines = {s: ReluLines.of(*bounds[s]) for s in self.relu_sites}  # fixed over the steps: only α changes
        lines |= glines

        def whole(part: torch.Tensor) -> torch.Tensor:  # the better of the bounded rows' values and the prior's
            out = full.clone()
            out.view(-1)[flat] = torch.maximum(part.to(DTYPE), out.view(-1)[flat])
            return out

        opt = Adam(list(a.values()), lr=self.s.lr_alpha) if steps > 0 else None
        betas = list(bt.values()) + ([] if rb is None else [rb])
        opt_b = Adam(betas, lr=self.s.lr_beta) if steps > 0 and betas else None
        best = None
        best_a = {s: v.detach().clone() for s, v in a.items()}
        best_b = {s: v.detach().clone() for s, v in bt.items()}
        best_rb = None if rb is None else rb.detach().clone()
        for i in range(steps + 1):
            if i > 0 and self.expired():
                raise Expired  # a batch cut short is dropped whole: its parents stay open for the timeout's report
            last = i == steps
            record: dict[int, torch.Tensor] = {}
            inputs: list[torch.Tensor] = []
            extra = {s: torch.zeros_like(a[s]).scatter(1, where_split[s], bt[s] * sign_at[s]) for s in bt}
            with torch.set_grad_enabled(not last):
                gextra, gconst = self._grid_terms(rb, cons)
                lower = self.b.backward(A0, self.b.net.output, a, True, lines, extra | gextra,
                                        record if last else None, inputs if last else None) + dd + gconst
            if best is None:
                best = lower.detach()
            else:
                better = lower.detach() > best
                best = torch.where(better, lower.detach(), best)
                for s in a:  # keep the α and β of each row's best bound: the warm start the children inherit
                    best_a[s] = torch.where(better[:, None], a[s].detach(), best_a[s])
                for s in bt:
                    best_b[s] = torch.where(better[:, None], bt[s].detach(), best_b[s])
                if rb is not None:
                    best_rb = torch.where(better[:, None, None], rb.detach(), best_rb)
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
                for v in betas:
                    v.clamp_(min=0.0)
        new_alpha, new_beta = [], []
        for j, s in enumerate(self.relu_sites):  # the bounded rows' best α and β, the warm starts elsewhere
            na = alpha[j].reshape(D * R, -1).to(self.store).clone()
            na[flat] = best_a[s].to(self.store)
            new_alpha.append(na.view(D, R, -1))
            nb = beta[j].reshape(D * R, -1).to(self.store).clone()
            if s in best_b:
                nb[flat] = nb[flat].scatter(1, where_split[s], best_b[s].to(self.store))
            new_beta.append(nb.view(D, R, -1))
        new_rbeta = None
        if rbeta is not None:
            new_rbeta = rbeta.to(self.store).clone()
            if best_rb is not None:
                new_rbeta.view(D * R, 2, -1)[flat] = best_rb.to(self.store)
        lower = whole(best)
        closed = self.closed(lower)
        if dt != DTYPE and bool(closed.any()):  # the decision, in float64, every row (the prior's too) with its α and β
            idx = torch.nonzero(closed).flatten()
            exact = self._exact(all_splits[idx], [v[idx] for v in new_alpha], [v[idx] for v in new_beta],
                                None if pre is None else [(l[idx], u[idx]) for l, u in pre],
                                None if new_rbeta is None else new_rbeta[idx])
            lower[idx] = exact
            closed[idx] = self.closed(exact)
        points = torch.where(inputs[0] >= 0, self.b.lb, self.b.ub)
        scores = None
        if need_scores:
            scores = self._scores(bounds, cross, record, lower.view(-1)[flat], dom, D)
            scores += self._grid_scores(all_splits, record, lower.view(-1)[flat], dom, D)
        return Bounded(lower, closed, points, flat, scores, new_alpha, new_beta, new_rbeta)

    def initial_alpha(self) -> list[torch.Tensor]:
        """The root's lower slopes per ReLU site [R, n_s]: for each row the slopes α-CROWN optimized for it
        (`Bounder.spec_slopes`, matched by the row's coefficients), CROWN's where it has none (α,β-CROWN also starts
        branch and bound from α-CROWN's slopes)."""
        crown = [self.b.relaxation(site)[0].expand(self.R, -1) for site in self.relu_sites]
        if self.b.spec_slopes is None:
            return crown
        C0, slopes = self.b.spec_slopes
        same = (self.C[:, None, :] == C0[None].to(self.C)).all(-1)  # [R, R0]
        has, j = same.any(1), same.to(torch.int8).argmax(1)
        return [torch.where(has[:, None], slopes[site][j].to(a.dtype), a) if site in slopes else a
                for site, a in zip(self.relu_sites, crown)]

    def per_site(self, t: torch.Tensor) -> list[torch.Tensor]:
        """A tensor over the concatenated units (last axis) as views per ReLU site."""
        return list(torch.split(t, self.sizes, dim=-1))

    def per_site_pair(self, l: torch.Tensor, u: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(zip(self.per_site(l), self.per_site(u)))

    def site_of(self, units: torch.Tensor) -> torch.Tensor:
        """The index among the ReLU sites of each (concatenated) unit index."""
        return torch.bucketize(units, self.ends, right=True)

    def site_intervals(self, splits: torch.Tensor, pre: tuple[torch.Tensor, torch.Tensor] | None = None
                       ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One domain's intervals per activation site (its splits [U] clamp the root's, or its own `pre` ([U] each)):
        what its leaf LP encodes."""
        out = list(self.b.pre)
        own = None if pre is None else self.per_site_pair(*pre)
        for j, (site, t) in enumerate(zip(self.relu_sites, self.per_site(splits[:self.U]))):
            l, u = self.b.pre[site] if own is None else own[j]
            out[site] = (torch.where(t > 0, l.clamp(min=0), l), torch.where(t < 0, u.clamp(max=0), u))
        return out


    def rebound(self, splits: list[torch.Tensor], pre: list[tuple[torch.Tensor, torch.Tensor]],
                first: torch.Tensor) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Each domain's intervals of the ReLU sites after its newest split, bounded again with its splits: CROWN from
        each unstable unit back to the input over the domain's own intervals of the sites before it (clamped by its
        splits, so a split unit's relaxation is exact), site by site in order, in float64 (the intervals are what a
        closing decision's float64 re-check rests on). `pre`: the domains' intervals ([D, n_s] per ReLU site, float64:
        the parent's); `first` [D]: the index among the ReLU sites of each domain's newest split (sites up to it cannot
        change). Returns the tightened intervals and the domains whose intervals became empty (l > u beyond rounding:
        no input lies in them)."""
        D = splits[0].shape[0]
        pre = [(torch.where(t > 0, l.clamp(min=0), l), torch.where(t < 0, u.clamp(max=0), u)) for (l, u), t in zip(pre, splits)]
        empty = torch.zeros(D, dtype=torch.bool, device=self.device)
        reach = max(1, self.s.rebound)
        for j in range(1, len(self.relu_sites)):
            if self.expired():
                raise Expired
            site = self.relu_sites[j]
            node = self.b.site_input[site]
            before = [k for k in range(j) if self.relu_sites[k] in self.b.sites_before(node)]
            if not before:
                continue
            l, u = pre[j]
            near = (first < j) & (j <= first + reach)  # the sites after the newest split, as far as `rebound` reaches
            pairs = torch.nonzero((l < 0) & (u > 0) & near[:, None])  # (domain, unit); one read per site
            m_all = pairs.shape[0]
            if m_all == 0:
                continue
            width = max(self.b.width(node), 1) + sum(self.sizes[k] for k in before) * 8  # the rows' own intervals too
            step = max(1, CHUNK_ELEMENTS // width // 2)
            los, his = [], []
            for i in range(0, m_all, step):
                if i and self.expired():
                    raise Expired
                dom, unit = pairs[i:i + step, 0], pairs[i:i + step, 1]
                m = dom.numel()
                E = torch.zeros(2 * m, l.shape[1], dtype=DTYPE, device=self.device)
                r = torch.arange(m, device=self.device)
                E[r, unit] = 1.0
                E[m + r, unit] = -1.0
                rows = torch.cat([dom, dom])
                lines = {self.relu_sites[k]: ReluLines.of(pre[k][0][rows], pre[k][1][rows]) for k in before}
                with torch.no_grad():
                    b = self.b.backward(E, node, None, True, lines)
                los.append(b[:m])
                his.append(-b[m:])
            dom, unit = pairs[:, 0], pairs[:, 1]
            l, u = l.clone(), u.clone()
            l[dom, unit] = torch.maximum(l[dom, unit], torch.cat(los))
            u[dom, unit] = torch.minimum(u[dom, unit], torch.cat(his))
            empty |= (l - u > EMPTY_TOL * (1 + l.abs() + u.abs())).any(1)
            pre[j] = (l, u)
        return pre, empty
