"""Refinement of the early ReLU sites' intervals by MILP beside branch and bound (α,β-CROWN's `bab-refine`).

A deep net's later sites stay loose because every site's relaxation widens the next; α-CROWN's intervals are the LP's
(the LP of a unit's input over the triangle relaxation gives α-CROWN's bound), so only integer
reasoning tightens them further. For each unstable unit of the first sites whose input depends on an earlier ReLU site
(by priority: BaBSR's score for the property's rows), HiGHS minimizes and maximizes the unit's input over the exact
big-M encoding of the network up to it (`milp.encode`, the earlier sites' binaries), with a per-unit time limit; its
dual bound is sound at any time (widened by `SLACK` for the solver's tolerances), so a solve cut short still tightens.

It runs in a thread of the search's process (HiGHS releases the interpreter while it solves, so a Python loop beside
a solve keeps its pace), so on a machine with a GPU the CPU refines while the GPU
searches, and on a CPU it takes a share of the cores. The search applies what has arrived between rounds
(`Refiner.apply`): the intervals of the refined sites tighten, CROWN bounds the later sites again from them, and every
later round's domains relax on the tighter intervals (α and β warm starts stay valid: every value of them is sound).

On a CPU the thread's share of the cores costs the search more domains than its bounds win (docs/EXPERIMENTS.md,
"MILP refinement beside branch and bound"), so the bab verifier refines by default only beside a GPU search, and only
where the machine has a core for each worker's refinement beside its search (cores ≥ 2 × the processes sharing the GPU).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from . import milp
from .bounds import Bounder
from .graph import Graph

SITES = 2  # ReLU sites refined: the first ones whose input depends on an earlier ReLU site (α,β-CROWN: the early layers)
UNIT_S = 1.0  # HiGHS's limit per unit and side: most of a unit's gain comes within 1 s (docs/EXPERIMENTS.md)
SLACK = 1e-5  # relative and absolute widening of a refined bound: HiGHS's feasibility and optimality tolerances


class Refiner:
    """One thread refining the early sites of `b` (a Bounder after CROWN/α-CROWN) for the rows `C` ([R, outputs]) until
    `stop()` or the budget's end (`left()` seconds; no solve runs past it); `apply(b)` moves what it found into the
    Bounder (from the search's thread). `stop` waits for the thread: a thread left inside HiGHS when the process exits
    aborts it."""

    def __init__(self, b: Bounder, C: torch.Tensor, left: Callable[[], float], sites: int = SITES, unit_s: float = UNIT_S):
        self.b, self.left, self.unit_s = b, left, float(unit_s)
        self.found: list[tuple[int, int, float, float]] = []  # (site, unit, lower, upper), appended by the thread
        self.applied = 0
        self.stats: dict[str, Any] = {"units": 0, "solves": 0, "tightened": 0, "seconds": 0.0}
        self._stop = threading.Event()
        self.order = self._order(C, sites)
        self.thread = threading.Thread(target=self._run, name="refine", daemon=True)

    @staticmethod
    def worth_it(b: Bounder, sites: int = SITES) -> bool:
        """Deep enough that some ReLU site after the first depends on an earlier one (a 2-layer net's second site is
        what branch and bound splits directly)."""
        relu = [s for s in range(len(b.sites)) if b.op(s).branchable]
        return len(relu) >= 3 and bool(b.sites_before(b.site_input[relu[1]]))

    def _order(self, C: torch.Tensor, sites: int) -> list[tuple[int, list[int]]]:
        """Per site to refine, its unstable units by BaBSR's score for the rows (the coefficients of a CROWN pass
        times the upper relaxation's intercept): the units whose looseness costs the bound most first."""
        b = self.b
        record: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            b.backward(C.to(b.device, torch.float64), b.net.output, record=record)
        out = []
        relu = [s for s in range(len(b.sites)) if b.op(s).branchable]
        for s in relu[1:]:
            if len(out) == sites:
                break
            if not b.sites_before(b.site_input[s]):
                continue
            l, u = b.pre[s]
            cross = (l < 0) & (u > 0)
            # the output coefficient of site s is on its output; its weight on the unit is what the intercept costs
            score = record[s].clamp(max=0).abs().sum(0) * torch.where(cross, -l * u / (u - l).clamp(min=1e-300), 0 * l)
            idx = torch.nonzero(cross).flatten()
            out.append((s, idx[torch.argsort(score[idx], descending=True)].tolist()))
        return out

    def start(self) -> "Refiner":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Ask the thread to end and wait for its solve in flight (at most `unit_s`)."""
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def _done(self) -> bool:
        return self._stop.is_set() or self.left() <= 0

    def _run(self) -> None:
        from scipy.optimize import Bounds, LinearConstraint, milp as highs

        t0 = time.perf_counter()
        b = self.b
        try:
            for s, units in self.order:
                if self._done():
                    break
                j = b.site_input[s]
                sub = Graph(b.net.input_shape, b.net.nodes[: j + 1], j)  # the network up to site s's input
                enc = milp.encode(sub, b.lb.cpu().numpy(), b.ub.cpu().numpy(), [b.pre[k] for k in range(len(b.sites))
                                                                               if b.sites[k] <= j])
                cons = LinearConstraint(enc.matrix, enc.row_lo, enc.row_hi)
                bounds = Bounds(enc.var_lb, enc.var_ub)
                for i in units:
                    if self._done():
                        break
                    self.stats["units"] += 1
                    got = []
                    for sign in (1.0, -1.0):  # min z, then max z (as min −z)
                        c = np.zeros(enc.num_vars)
                        c[enc.y.start + i] = sign
                        limit = min(self.unit_s, self.left())
                        if limit <= 0:
                            break
                        res = highs(c, constraints=cons, integrality=enc.integrality, bounds=bounds,
                                    options={"time_limit": limit, "disp": False})
                        self.stats["solves"] += 1
                        value = res.fun if res.status == 0 else getattr(res, "mip_dual_bound", None)
                        got.append(None if value is None or not np.isfinite(value) else sign * float(value))
                    if len(got) < 2:
                        break
                    lo, hi = got
                    lo = -np.inf if lo is None else lo - SLACK * (1 + abs(lo))
                    hi = np.inf if hi is None else hi + SLACK * (1 + abs(hi))
                    self.found.append((s, i, lo, hi))
        finally:
            self.stats["seconds"] = round(time.perf_counter() - t0, 3)

    def apply(self, b: Bounder) -> int:
        """Tighten `b`'s intervals by what the thread has found since the last call, then bound the later sites again
        by CROWN from them; the number of units tightened."""
        new = self.found[self.applied:]
        self.applied += len(new)
        changed = 0
        for s in {s for s, *_ in new}:
            rows = [(i, lo, hi) for s_, i, lo, hi in new if s_ == s]
            l, u = b.pre[s]
            idx = torch.as_tensor([i for i, _, _ in rows], device=l.device)
            lo = torch.as_tensor([v for _, v, _ in rows], dtype=l.dtype, device=l.device)
            hi = torch.as_tensor([v for _, _, v in rows], dtype=l.dtype, device=l.device)
            changed += int(((lo > l[idx]) | (hi < u[idx])).sum())
            b.tighten(s, idx, lo, hi)
        if changed:
            self.stats["tightened"] += changed
            b.crown()  # the later sites from the tighter early ones (each site's bounds only tighten)
        return changed
