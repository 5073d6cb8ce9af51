"""Branch and bound on unstable ReLUs with β-CROWN bounds, batched: the complete method that decides what the
bounds alone leave open.

A domain is the box plus sign constraints on some ReLU inputs (z ≥ 0 or z ≤ 0) and, on an int8 graph, index ranges
of some grid units (a rounding's or the input quantization's grid index k in [k_lo, k_hi]: `Settings.grid_values`;
their lines narrow to the range, and a rounding's implied input constraint gets a β). Its bound: the root's
pre-activation intervals (`Bounder.pre`, CROWN/α-CROWN, fixed during the search as α,β-CROWN does by default)
clamped by the splits (a split unit is stable, so its relaxation is exact), and each split constraint −t·z ≤ 0
(t = ±1) added to the back-substitution with a multiplier β ≥ 0 (β-CROWN, Wang et al. 2021). α (lower ReLU slopes,
per property row) and β are optimized by projected Adam; every iterate's bound is sound and the best per domain
is kept.

One search covers every open disjunct of the property: a domain is closed when each of its rows (one per
disjunct of a robustness property) has a lower bound > 0.

A round takes the `batch` domains with the lowest bounds (best first) and:
1. chooses a split for each: the best unit by the BaBSR intercept score (the default; a grid unit by its own,
   `_grid_scores`), or with `candidates` > 1 by filtered smart branching (kFSB, De Palma et al. 2021 / α,β-CROWN):
   that many best units by the score, each evaluated by one CROWN pass over both children with the parent's α and β
   (no optimization), the unit whose worse child is best wins; when the queue holds fewer domains than the batch
   wants, a domain is split on several units at once (2^depth children), so early rounds are full;
2. bounds all children in one batched pass, α and β warm-started from the parent (a new split's β starts at 0); a
   child bounds only the rows of the disjuncts its parent's bounds leave open (the others keep the parent's bound,
   which holds on the child's smaller region), and every row keeps the better of its own bound and its parent's;
3. runs each child's bound minimizer (a corner of the box per row) through the network, and every few rounds a short
   attack from the most violated ones: an unsafe point that survives `confirm` is a counterexample;
4. closes children whose disjuncts are all excluded (after a float64 re-check of every row); a child with no
   unstable unit left is decided exactly by an LP (the MILP encoding with every unit stable has no binaries).
The answer: unsat when no domain is left, sat on a counterexample, timeout when the budget runs out, unknown when
an unsafe region was found whose points did not survive `confirm`.

Everything runs on the Bounder's device (`Bounder.device`, its graph's): the open domains are rows of tensors there
(`_Store`: splits, α, β, the rows' lower bounds, BaBSR scores, depth), and selection (a topk over the rows' total
violation), splitting (children by a scatter of sign patterns), kFSB and pruning (a boolean mask) read no domain on the
host; a round reads a few numbers (whether a leaf or an unsafe minimizer exists, the largest split count per site). The
batch is `CPU_BATCH` on a CPU and planned from the device's memory on a GPU (`default_batch`, shared among the worker
processes on it). Options off by default on the CPU, where they cost more than they win (docs/EXPERIMENTS.md): per-domain intermediate bounds (`Settings.rebound`:
a child's later sites bounded again with its splits) and the MILP refinement of the early sites beside the search
(`refine.Refiner`, on by default when the search runs on a GPU).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from . import attack, milp
from .alpha import Adam
from .bounds import Bounder, FixedLines
from .crown import CHUNK_ELEMENTS
from .ops.base import DTYPE
from .ops.relu import ReluLines
from .ops.rounding import QuantizedInput, Rounding
from .vnnlib import VnnlibSpec

# α and β between rounds, per device: warm starts only (any value is sound, and a closing decision's float64 re-check
# recomputes the bound with the stored values), so a GPU, whose open domains can number millions, keeps them in half
STORE = {"cpu": torch.float32, "cuda": torch.float16}
# the open domains may take at most this share of a GPU's memory (divided among the processes sharing it); a search
# that fills it ends as a timeout that says so (a CPU search holds what its 30 s make: ~1.5 GB for 40k domains of 256x2)
GPU_STORE_SHARE = 0.4
# a domain whose re-bounded interval of some unit has l − u above this (relative) is empty: float64 back-substitution
# misses by ~1e-12 relative, so no input of the domain can lie there
EMPTY_TOL = 1e-8


# what a resumed search takes over from the one that left its domains: the grid units its splits count from
GRID_STATE = ("round_sites", "grid", "V", "W", "k0", "step", "bidx", "bE")

# a leaf (no unstable ReLU) whose grid units could still be split: seconds its MILP may take, and how many such leaves
# per search try it, before the grid splits go on instead (the bit-exact reference's tiny nets: their leaf MILPs decide
# at once; the cnn [4,8]'s open int8 properties: every ReLU stable at the root, and its MILP does not finish in 15 s)
LEAF_MILP_S = 2.0
LEAF_MILP_TRIES = 3

# parent domains per round on a CPU (256 gave the best global lower bound on 3 of 4 hard mnist_fc stand-ins at 30 s, against 64)
CPU_BATCH = 256
# on a GPU: the batch whose bound pass takes at most this share of the device memory free when the search starts
# (several worker processes may share the device), within these limits (α,β-CROWN runs mnist_fc at 4096)
GPU_MEMORY_SHARE = 0.25
GPU_BATCH = (256, 8192)
# bytes per bounded row and unit of a batch's pass: per ReLU site and row the coefficients, their clamped parts, the
# row's intervals and lines, α and β with their gradients and Adam's moments, in float32 (an estimate with room)
PASS_BYTES_PER_ROW_UNIT = 4 * 24


def device_memory(device: torch.device, sharers: int = 1) -> int:
    """Bytes of `device` this process may plan with: its free memory, at most its share of the total when `sharers`
    processes search on it at once."""
    free, total = torch.cuda.mem_get_info(device)
    return int(min(free, total / max(1, sharers)))


def default_batch(b: Bounder, rows: int, units: int, sharers: int = 1) -> int:
    """Parent domains per round: `CPU_BATCH` on a CPU; on a GPU as many as `GPU_MEMORY_SHARE` of its memory holds
    (`device_memory`; each parent's two children bound `rows` rows each over `units` ReLU units and the widest layer)."""
    if b.device.type != "cuda":
        return CPU_BATCH
    width = max(b.net.sizes)
    per_parent = 2 * rows * (units + width) * PASS_BYTES_PER_ROW_UNIT
    return int(min(max(GPU_MEMORY_SHARE * device_memory(b.device, sharers) // per_parent, GPU_BATCH[0]), GPU_BATCH[1]))


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
    # (`_Search.rebound`); 0: the root's intervals clamped by the splits, as α,β-CROWN by default: on the CPU each
    # later site costs more domains than its bounds win (docs/EXPERIMENTS.md, "Branch-and-bound settings")
    rebound: int = 0
    # grid splits: a grid unit (a rounding's, an input pixel's) whose root interval allows 2..grid_values
    # grid indices may be split on its index, k ≤ j | k ≥ j + 1, after the ReLUs (`relu_first`), where a leaf's MILP
    # does not finish (`LEAF_MILP_S`); 0: ReLU splits only
    grid_values: int = 4
    # grid units per domain evaluated by their children's bounds beside the ReLUs (`choose`); 0: the scores alone
    # decide, since a ReLU's worse child was always the better one (docs/EXPERIMENTS.md, "Grid splits")
    grid_candidates: int = 0


@contextlib.contextmanager
def _flush_denormals():
    """Denormal floats flushed to zero while the search runs, then the default (off) again: Adam's second moments of
    the many tiny α and β gradients decay into float32's denormal range, where a CPU computes their square root 17x
    slower (about 16x on 512k values); what flushing changes, < 1e-38, no bound notices."""
    flushed = torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if flushed:
            torch.set_flush_denormal(False)


class _Expired(Exception):
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
    rbeta: torch.Tensor | None = None  # [D, R, 2W]: the grid splits' β (`_Search.bidx`)


class _Search:
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
                raise _Expired  # a batch cut short is dropped whole: its parents stay open for the timeout's report
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

    def _grid_scores(self, splits: torch.Tensor, record, lower: torch.Tensor, dom: torch.Tensor, D: int) -> list[torch.Tensor]:
        """[D, V]: what splitting a grid unit's index range in two is worth to the rows still open, on the ReLU score's
        scale. A line of the staircase over two or more indices leaves a gap of about a step s to the values
        reachable at some x, on both sides, and the split's worse child removes it only once its range is one index:
        so Σ_rows |A|·s/(n − 1) for n ≥ 2 indices, −1 at one."""
        if not self.V:
            return []
        klo, khi = self.k_of(splits)
        n = khi - klo + 1
        open_rows = (lower <= 0).to(DTYPE)[:, None]
        weight = torch.cat([record[s][:, self.grid[s][0]].to(DTYPE).abs() * open_rows for s in self.round_sites], 1)
        weight = weight.new_zeros(D, self.V).index_add_(0, dom, weight)
        sc = weight * self.step / (n - 1).clamp(min=1)
        return [torch.where(n >= 2, sc, torch.full_like(sc, -1.0)).to(torch.float32)]

    # -- branching (every domain of a batch at once, on the device) --------------------------------------
    def choose(self, scores: torch.Tensor, splits: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
               lower: torch.Tensor, pre: tuple[torch.Tensor, torch.Tensor] | None = None,
               rbeta: torch.Tensor | None = None) -> torch.Tensor:
        """Per parent ([P, U + V] scores over the units of every ReLU site, then every grid site, concatenated), the unit
        to split; −1 where none can be. The candidates: the best `candidates` ReLUs by score (at least one) and, on an
        int8 graph, the best `grid_candidates` grid units by theirs (the two scores only estimate, on scales of their
        own). Where there are several, each is evaluated by one CROWN pass over both children with the parent's α and β
        (no optimization; kFSB, De Palma et al. 2021 / α,β-CROWN): the unit whose worse child is best wins, ReLU or grid
        split alike; else the best by score, the ReLUs first (`relu_first`)."""
        P = scores.shape[0]
        top = torch.topk(scores[:, :self.U], max(1, min(self.s.candidates, self.U)), dim=1)
        vals, idx = top.values, top.indices
        g = min(self.s.grid_candidates, self.V)
        if g:
            gt = torch.topk(scores[:, self.U:], g, dim=1)
            if bool((gt.values >= 0).any()):  # one read per round; none splittable: the ReLUs' choice alone
                vals, idx = torch.cat([vals, gt.values], 1), torch.cat([idx, gt.indices + self.U], 1)
        best = torch.topk(self.relu_first(scores), 1, dim=1)  # by score alone
        pick = torch.where(best.values[:, 0] >= 0, best.indices[:, 0], -1)
        k = vals.shape[1]
        if k <= 1 or self.expired():
            return pick
        units = idx.reshape(-1)  # [P·k]: parent i's candidates at rows i·k … i·k + k − 1
        valid = vals.reshape(-1) >= 0
        parent = torch.arange(P, device=self.device).repeat_interleave(k)
        sp, rows = self.children(splits[parent], units[:, None])  # [P·k·2, U], row j's candidate j // 2
        with torch.no_grad():
            low = self.bound(sp, self.per_site(alpha[parent][rows]), self.per_site(beta[parent][rows]), 0,
                             False, lower[parent][rows],
                             None if pre is None else self.per_site_pair(pre[0][parent][rows], pre[1][parent][rows]),
                             None if rbeta is None else rbeta[parent][rows]).lower
        value = low.clamp(max=0).sum(1).view(-1, 2).min(1).values  # the worse child's total violation
        value = torch.where(valid, value, torch.full_like(value, -math.inf)).view(P, k)
        won = idx.gather(1, value.argmax(1, keepdim=True))[:, 0]
        return torch.where((pick >= 0) & (value.max(1).values > -math.inf), won, pick)  # no valid candidate: by score

    def relu_first(self, scores: torch.Tensor) -> torch.Tensor:
        """The scores ([P, U + V]) with the grid units' set to −1 where a domain has an unstable ReLU: by score, grid
        splits come after the ReLUs, since the leaf MILPs that ReLU splits reach decide what a grid split ahead of them
        leaves open (docs/EXPERIMENTS.md, "Grid splits")."""
        if not self.V:
            return scores
        relu = scores[:, :self.U].max(1, keepdim=True).values >= 0
        return torch.cat([scores[:, :self.U], torch.where(relu, torch.full_like(scores[:, self.U:], -1.0), scores[:, self.U:])], 1)

    def children(self, splits: torch.Tensor, units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each parent's splits ([P, U + 2V]: ReLU signs in {−1, 0, +1}, then each grid unit's raise of k_lo and cut of
        k_hi) with the units `units` ([P, d], < U a ReLU, U + v grid unit v) split both ways: [P·2^d, U + 2V] (parent i's
        children at rows i·2^d …; unit b of child c active (z ≥ 0, or k ≥ j + 1 at the middle j of its index range)
        where bit b of c is set), and each child's parent."""
        P, d = units.shape
        n = 2 ** d
        bits = torch.arange(n, device=self.device)[:, None] >> torch.arange(d, device=self.device)[None]
        up = (bits & 1).repeat(P, 1)  # [P·2^d, d]
        rows = torch.arange(P, device=self.device).repeat_interleave(n)
        out = splits[rows]
        u = units[rows]
        col, val = u, up * 2 - 1
        if self.V:
            U, V = self.U, self.V
            grid = u >= U
            v = (u - U).clamp(min=0)
            klo = self.k0[0][v] + out.gather(1, U + v).to(DTYPE)
            khi = self.k0[1][v] - out.gather(1, U + V + v).to(DTYPE)
            j = torch.floor((klo + khi) / 2)
            col = torch.where(grid, torch.where(up > 0, U + v, U + V + v), u)
            val = torch.where(grid, torch.where(up > 0, j + 1 - self.k0[0][v], self.k0[1][v] - j).to(val.dtype), val)
        out.scatter_(1, col, val.to(splits.dtype))
        return out, rows

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
                raise _Expired
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
                    raise _Expired
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


class _Store:
    """The open domains, one row each, as tensors on the search's device (α,β-CROWN keeps its domains as batched
    tensors too, `TensorStorage`): splits [U] int8, α and β [R, U], the rows' lower bounds [R], BaBSR scores [U],
    depth. It grows by doubling; `take(k)` removes the k domains farthest from closed (their rows' total violation,
    most negative first) and moves the last rows into their places, so no per-domain value is read on the host."""

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], torch.dtype]], device: torch.device):
        self.fields, self.device, self.n = fields, device, 0
        self.data = {k: torch.empty((16, *shape), dtype=dt, device=device) for k, (shape, dt) in fields.items()}

    def __len__(self) -> int:
        return self.n

    @property
    def nbytes(self) -> int:
        return sum(t[: self.n].numel() * t.element_size() for t in self.data.values())

    def append(self, rows: dict[str, torch.Tensor]) -> None:
        m = next(iter(rows.values())).shape[0]
        if m == 0:
            return
        cap = next(iter(self.data.values())).shape[0]
        if self.n + m > cap:
            new = max(2 * cap, self.n + m)
            for k, t in self.data.items():
                grown = torch.empty((new, *t.shape[1:]), dtype=t.dtype, device=self.device)
                grown[: self.n] = t[: self.n]
                self.data[k] = grown
        for k, v in rows.items():
            self.data[k][self.n: self.n + m] = v
        self.n += m

    def key(self) -> torch.Tensor:
        return self.data["lower"][: self.n].clamp(max=0).sum(1)

    def take(self, k: int) -> dict[str, torch.Tensor]:
        k = min(k, self.n)
        idx = torch.topk(self.key(), k, largest=False).indices if k < self.n else torch.arange(k, device=self.device)
        out = {name: t[idx] for name, t in self.data.items()}
        rest = self.n - k
        if 0 < rest:  # fill the taken rows below `rest` with the rows above it that stay
            holes = idx[idx < rest]
            tail = torch.arange(rest, self.n, device=self.device)
            movers = tail[~torch.isin(tail, idx)]
            for t in self.data.values():
                t[holes] = t[movers]
        self.n = rest
        return out

    def min_lower(self) -> float:
        return float(self.data["lower"][: self.n].min()) if self.n else math.inf


def bab(b: Bounder, spec: VnnlibSpec, disjuncts: list[int], expired: Callable[[], bool], left: Callable[[], float],
        settings: Settings | None = None,
        confirm: Callable[[np.ndarray], np.ndarray | None] | None = None,
        refiner: Any = None, resume: dict[str, Any] | None = None) -> tuple[str, np.ndarray | None, str, dict[str, Any]]:
    """Decide the disjuncts `disjuncts` of `spec` ({A y ≤ b} all empty?) on the merged graph of `b` over its box, by
    splitting its ReLUs (other activations keep their relaxations; a graph of ReLUs only is decided completely).
    `confirm(x)`: the counterexample as it is reported (rounded to float32 and re-checked), or None when the float64
    point does not survive that; the search then goes on. `refiner` (`refine.Refiner`, running beside the search):
    what it has found is applied to `b`'s intervals before each round. `resume`: a dict the caller keeps between calls
    on the same Bounder (a stage budget's turns): a search that timed out leaves its open domains there and the next
    call goes on from them instead of from the root. Returns ("unsat" | "sat" | "timeout" | "unknown", counterexample
    or None, message, statistics)."""
    with _flush_denormals():
        return _bab(b, spec, disjuncts, expired, left, settings or Settings(), confirm or (lambda x: x), refiner,
                    {} if resume is None else resume)


def _bab(b: Bounder, spec: VnnlibSpec, disjuncts: list[int], expired: Callable[[], bool], left: Callable[[], float],
         s: Settings, confirm: Callable[[np.ndarray], np.ndarray | None], refiner: Any, resume: dict[str, Any]):
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
    R, U, V, dev = search.R, search.U, search.V, b.device
    batch = s.batch or default_batch(b, R, U, s.sharers)
    stats["batch"] = batch
    store_cap = GPU_STORE_SHARE * device_memory(dev, s.sharers) if dev.type == "cuda" else math.inf
    store_dt = search.store

    sub = VnnlibSpec(spec.lb, spec.ub, tuple(spec.disjuncts[k] for k in disjuncts), spec.num_outputs)  # the open disjuncts

    t0 = time.perf_counter()
    zero = torch.zeros(1, U + 2 * V, dtype=torch.int8, device=dev)
    init_alpha = torch.cat(search.initial_alpha(), -1).to(store_dt)[None]
    init_beta = torch.zeros(1, R, U, dtype=store_dt, device=dev)
    W = search.W
    init_rbeta = torch.zeros(1, R, 2 * W, dtype=store_dt, device=dev) if W else None
    fields = {"splits": ((U + 2 * V,), torch.int8), "alpha": ((R, U), store_dt), "beta": ((R, U), store_dt),
              "lower": ((R,), DTYPE), "scores": ((U + V,), torch.float32), "depth": ((), torch.int32)}
    if W:
        fields["rbeta"] = ((R, 2 * W), store_dt)
    if s.rebound:  # each domain's own intervals (float64: a closing decision's re-check rests on them)
        fields |= {"pre_l": ((U,), DTYPE), "pre_u": ((U,), DTYPE)}
    root_pre = [b.pre[site] for site in search.relu_sites]
    key = (tuple(disjuncts), R, U, V, search.W, s.rebound, dev)
    resumed = resume.get("key") == key and resume.get("store") is not None
    if resumed:  # the open domains a timed-out call left (every one of them still holds on the same box)
        store, stats = resume["store"], {**resume["stats"], "resumed": resume["stats"].get("resumed", 0) + 1}
        if V:  # their grid splits count from that call's root's units and ranges (intervals may have tightened since)
            search.__dict__.update(resume["grid"])
    else:
        store = _Store(fields, dev)
    resume.clear()

    def timeout(in_flight: dict[str, torch.Tensor] | None = None):
        if in_flight is not None:
            store.append(in_flight)  # a batch cut short goes back: its parents are open
        resume.update(key=key, store=store, stats=stats, grid={k: getattr(search, k) for k in GRID_STATE if hasattr(search, k)})
        low = store.min_lower()
        stats["global_lower"] = low
        return "timeout", None, (f"branch and bound: {len(store)} domains open after {stats['domains']} "
                                 f"(global lower bound {low:.4g})"), stats

    if not resumed:
        try:
            r = search.bound(zero, search.per_site(init_alpha), search.per_site(init_beta), s.steps, True, rbeta=init_rbeta)
        except _Expired:
            return "timeout", None, "branch and bound: the budget ran out inside the root's bound", stats
        stats["domains"] += 1
        keep = ~r.closed
        root = {"splits": zero[keep], "alpha": torch.cat(r.alpha, -1)[keep], "beta": torch.cat(r.beta, -1)[keep],
                "lower": r.lower[keep], "scores": torch.cat(r.scores, -1).float()[keep],
                "depth": torch.zeros(1, dtype=torch.int32, device=dev)[keep]}
        if W:
            root["rbeta"] = r.rbeta[keep]
        if s.rebound:
            root |= {"pre_l": torch.cat([l for l, _ in root_pre])[None][keep],
                     "pre_u": torch.cat([u for _, u in root_pre])[None][keep]}
        store.append(root)
    while len(store):
        if expired():
            return timeout()
        if refiner is not None:
            refiner.apply(b)
        depth = 1
        if len(store) < batch:  # few domains: split on several units at once, so the batch is full
            depth = max(1, min(s.max_split_depth, int(math.log2(max(1.0, batch / len(store))))))
        p = store.take(batch)
        if depth > 1:
            top = torch.topk(search.relu_first(p["scores"]), min(depth, U), dim=1)
            depth = max(1, min(depth, int((top.values >= 0).sum(1).min())))  # one read per round
            units = top.indices[:, :depth]
        else:
            try:
                pick = search.choose(p["scores"], p["splits"], p["alpha"], p["beta"], p["lower"],
                                     (p["pre_l"], p["pre_u"]) if s.rebound else None, p.get("rbeta"))
            except _Expired:
                return timeout(p)
            units = pick.clamp(min=0)[:, None]
        # a leaf: no unstable ReLU left, so the LP over its activation pattern decides (the MILP of an int8 graph's grid,
        # on the host). Where grid units are left to split, its MILP gets `LEAF_MILP_S` and, for the first
        # `LEAF_MILP_TRIES` such leaves only, the grid splits go on where it does not finish
        no_relu = p["scores"][:, :U].max(1).values < 0
        leaf = torch.zeros_like(no_relu)
        if bool(no_relu.any()):
            gridded = p["scores"][:, U:].max(1).values >= 0 if V else torch.zeros_like(no_relu)
            for i in torch.nonzero(no_relu).flatten().tolist():
                capped = bool(gridded[i])
                if capped and stats.get("leaf_timeouts", 0) >= LEAF_MILP_TRIES:
                    continue
                stats["leaf_lps"] += 1
                own = (p["pre_l"][i], p["pre_u"][i]) if s.rebound else None
                status, x, why = milp.solve(b.net, spec, search.site_intervals(p["splits"][i], own), disjuncts,
                                            (lambda: min(left(), LEAF_MILP_S)) if capped else left)
                if status == "timeout" and capped:
                    stats["leaf_timeouts"] = stats.get("leaf_timeouts", 0) + 1
                    continue
                leaf[i] = True
                if status == "sat":
                    x = confirm(x)
                    if x is not None:
                        return "sat", x, "branch and bound: a leaf LP point is a counterexample", stats
                    stats["unconfirmed"] += 1
                    continue
                if status == "unknown":  # its points only tie (no strict counterexample): look on in the other domains
                    stats["undecided_leaves"] = stats.get("undecided_leaves", 0) + 1  # kept with the stats for a resume
                    stats["leaf_note"] = why
                    continue
                if status != "unsat":
                    return status, None, "branch and bound: a leaf LP did not finish", stats
            p = {k: v[~leaf] for k, v in p.items()}
            units = units[~leaf]
            if not p["lower"].shape[0]:
                continue
        if V:
            stats["grid_splits"] = stats.get("grid_splits", 0) + int((units >= U).sum())  # one read per round
        splits, parent = search.children(p["splits"], units)
        pre, empty = None, None
        if s.rebound:
            first = search.site_of(units).min(1).values[parent]
        try:
            if s.rebound:
                pre, empty = search.rebound(search.per_site(splits[:, :U]),
                                            search.per_site_pair(p["pre_l"][parent], p["pre_u"][parent]), first)
            r = search.bound(splits, search.per_site(p["alpha"][parent]), search.per_site(p["beta"][parent]), s.steps,
                             True, p["lower"][parent], pre, p["rbeta"][parent] if W else None)
        except _Expired:
            return timeout(p)
        stats["domains"] += splits.shape[0]
        stats["rounds"] += 1
        with torch.no_grad():
            unsafe = torch.nonzero(sub.violations(b.net.forward(r.points)) <= 0).flatten().tolist()  # usually none
        for i in unsafe:
            x = confirm(r.points[i].cpu().numpy())
            if x is not None:
                return "sat", x, "branch and bound: a domain's bound minimizer is a counterexample", stats
            stats["unconfirmed"] += 1
        keep = ~r.closed if empty is None else ~(r.closed | empty)
        kids = {"splits": splits[keep], "alpha": torch.cat(r.alpha, -1)[keep], "beta": torch.cat(r.beta, -1)[keep],
                "lower": r.lower[keep], "scores": torch.cat(r.scores, -1).float()[keep], "depth": (p["depth"][parent] + 1)[keep]}
        if W:
            kids["rbeta"] = r.rbeta[keep]
        if s.rebound:
            kids |= {"pre_l": torch.cat([l for l, _ in pre], -1)[keep], "pre_u": torch.cat([u for _, u in pre], -1)[keep]}
        store.append(kids)
        stats["max_queue"] = max(stats["max_queue"], len(store))
        if store.nbytes > store_cap:
            low = store.min_lower()
            stats["global_lower"] = low
            return "timeout", None, (f"branch and bound: {len(store)} domains open after {stats['domains']} fill the "
                                     f"{store.nbytes / 2**30:.1f} GB this process may keep on {dev} (global lower bound "
                                     f"{low:.4g})"), stats
        if s.attack_every and stats["rounds"] % s.attack_every == 0 and len(store) and not expired():
            x = _attack_from(b, sub, r.points, r.lower.view(-1)[r.rows], expired)
            stats["attacks"] += 1
            if x is not None:
                x = confirm(x)
                if x is not None:
                    return "sat", x, "branch and bound: an attack from the domains' bound minimizers found a counterexample", stats
    detail = (f"{stats['domains']} domains in {stats['rounds']} rounds ({time.perf_counter() - t0:.2f} s), "
              f"{stats['leaf_lps']} leaf LPs")
    if stats.get("undecided_leaves"):
        return "unknown", None, (f"branch and bound: {stats['undecided_leaves']} leaves whose LP found no strict "
                                 f"counterexample and no proof ({stats['leaf_note']}); {detail}"), stats
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
