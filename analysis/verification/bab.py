"""Branch and bound on unstable ReLUs (and an int8 graph's few-valued grid indices) with β-CROWN bounds, batched:
the complete method that decides what the bounds alone leave open. This file is the search's loop and its store of
open domains (`Store`); a domain and its batched bound pass are `bab_domains.py`, the choice of the unit to split is
`branching.py`, and the search over smooth activations' input intervals is `smooth_bab.py`.

One search covers every open disjunct of the property: a domain is closed when each of its rows (one per
disjunct of a robustness property) has a lower bound > 0.

A round takes the `batch` domains with the lowest bounds (best first) and:
1. chooses a split for each (`branching.Branching.choose`); when the queue holds fewer domains than the batch
   wants, a domain is split on several units at once (2^depth children), so early rounds are full;
2. bounds all children in one batched pass (`bab_domains.Search.bound`), α and β warm-started from the parent (a new
   split's β starts at 0); a child bounds only the rows of the disjuncts its parent's bounds leave open (the others
   keep the parent's bound, which holds on the child's smaller region), and every row keeps the better of its own
   bound and its parent's;
3. runs each child's bound minimizer (a corner of the box per row) through the network, and every few rounds a short
   attack from the most violated ones: an unsafe point that survives `confirm` is a counterexample;
4. closes children whose disjuncts are all excluded (after a float64 re-check of every row); a child with no
   unstable unit left is decided exactly by an LP (the MILP encoding with every unit stable has no binaries).
The answer: unsat when no domain is left, sat on a counterexample, timeout when the budget runs out, unknown when
an unsafe region was found whose points did not survive `confirm`.

The batch is `CPU_BATCH` on a CPU and planned from the device's memory on a GPU (`default_batch`, shared among the
worker processes on it). Options off by default on the CPU, where they cost more than they win (docs/EXPERIMENTS.md):
per-domain intermediate bounds (`Settings.rebound`: a child's later sites bounded again with its splits) and the MILP
refinement of the early sites beside the search (`refine.Refiner`, on by default when the search runs on a GPU).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from . import attack, milp
from .bab_domains import GRID_STATE, Expired, Search, Settings
from .bounds import Bounder
from .ops.base import DTYPE
from .vnnlib import VnnlibSpec

# the open domains may take at most this share of the device's memory, a GPU's or the host's (divided among the
# processes searching at once); a search that fills it ends as a timeout that says so, not as the kernel's OOM kill
# (a CNN's domains hold α and β over ~1500 unstable units: minutes of search filled 24 GB)
STORE_SHARE = 0.4

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
    """Bytes of `device` this process may plan with: its free memory (the host's available memory for the CPU), at
    most its share of the total when `sharers` processes search on it at once."""
    free, total = torch.cuda.mem_get_info(device) if device.type == "cuda" else host_memory()
    return int(min(free, total / max(1, sharers)))


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of the host's memory: Linux's MemAvailable, else the total for both."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024, total
    except (OSError, KeyError, ValueError):
        return total, total


def default_batch(b: Bounder, rows: int, units: int, sharers: int = 1) -> int:
    """Parent domains per round: `CPU_BATCH` on a CPU; on a GPU as many as `GPU_MEMORY_SHARE` of its memory holds
    (`device_memory`; each parent's two children bound `rows` rows each over `units` ReLU units and the widest layer)."""
    if b.device.type != "cuda":
        return CPU_BATCH
    width = max(b.net.sizes)
    per_parent = 2 * rows * (units + width) * PASS_BYTES_PER_ROW_UNIT
    return int(min(max(GPU_MEMORY_SHARE * device_memory(b.device, sharers) // per_parent, GPU_BATCH[0]), GPU_BATCH[1]))



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


class Store:
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
    search = Search(b, spec, disjuncts, s, expired)
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
    store_cap = STORE_SHARE * device_memory(dev, s.sharers)
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
        store = Store(fields, dev)
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
        except Expired:
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
            except Expired:
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
        except Expired:
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
