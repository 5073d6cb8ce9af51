"""Branch and bound on the input intervals of smooth activations (`smooth.Smooth`: sigmoid, tanh, ...), so that a network
of them is decided, not only bounded: GenBaB's general nonlinear branching (Shi et al., TACAS 2025, α,β-CROWN's
`complete_verifier`), batched.

A domain is the box plus, per smooth unit, a sub-interval [l, u] of the root's pre-activation interval (`Bounder.pre`,
fixed during the search as α,β-CROWN does). A split cuts one unit's interval at a point p into [l, p] and [p, u]: the
two children cover the parent, and each child's relaxation of that unit, on its smaller interval, is tighter (a
sigmoid's crossing interval split at 0 leaves a convex and a concave piece, whose lines are the chord and a tangent).
A child's bound is a CROWN pass with every unit's lines on the domain's intervals: sound for every input whose
pre-activations lie in the domain's intervals, so the children's bounds together cover the parent's region.

A round takes the `batch` open domains with the lowest bounds and, for each (steps 1-2: `branching.SmoothBranching`):
1. chooses the unit whose relaxation costs the bound most: |coefficient of the unit's output in the bound's rows| ×
   the gap between the side's line and the curve, largest over the interval's ends and middle (BaBSR's score, read
   for curves as GenBaB's BBPS does), summed over the rows of the disjuncts still open;
2. splits it at 0 when the interval holds 0 well inside (an S-shaped function's inflection, where it matters most),
   else at the middle;
3. bounds both children in one batched pass (the other units keep the parent's lines; only the split unit's are
   computed again), every row keeping the better of its own bound and its parent's;
4. runs each child's bound minimizer (a corner of the box per row) through the network: a point unsafe in float64 that
   `confirm` accepts (onnxruntime, strictly unsafe) is a counterexample.
The answer: unsat when no domain is left open, sat on a confirmed counterexample, timeout when the budget runs out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .bounds import Bounder, FixedLines, Spec
from .branching import SmoothBranching
from .ops.base import DTYPE
from .ops.smooth import Smooth
from .vnnlib import VnnlibSpec


@dataclass
class Settings:
    batch: int = 256  # parent domains split per round
    max_domains: int = 200_000  # open domains kept (each holds its intervals and lines: 4 float64 per unit)
    inflection_share: float = 0.1  # split at 0 when 0 lies at least this share of the width inside the interval


def sites(b: Bounder) -> list[int]:
    """The activation sites branch and bound splits here: the smooth activations'."""
    return [s for s in range(len(b.sites)) if isinstance(b.op(s), Smooth)]


@dataclass
class _Domains:
    """The open domains as rows of tensors: per split site the units' intervals and lines [D, n], the rows' bounds."""

    l: list[torch.Tensor]
    u: list[torch.Tensor]
    lines: list[list[torch.Tensor]]  # per site [al, bl, au, bu]
    lower: torch.Tensor  # [D, R]

    def take(self, idx: torch.Tensor) -> "_Domains":
        return _Domains([t[idx] for t in self.l], [t[idx] for t in self.u], [[t[idx] for t in ls] for ls in self.lines],
                        self.lower[idx])

    @staticmethod
    def join(parts: list["_Domains"]) -> "_Domains":
        parts = [p for p in parts if p.lower.shape[0]]
        n = len(parts[0].l)
        return _Domains([torch.cat([p.l[j] for p in parts]) for j in range(n)], [torch.cat([p.u[j] for p in parts]) for j in range(n)],
                        [[torch.cat([p.lines[j][i] for p in parts]) for i in range(4)] for j in range(n)],
                        torch.cat([p.lower for p in parts]))

    @property
    def size(self) -> int:
        return self.lower.shape[0]


class Search(SmoothBranching):
    """The rows of a property's open disjuncts, the smooth sites a domain splits, and the bound pass over domains
    (the branching heuristic comes from `branching.SmoothBranching`)."""

    def __init__(self, b: Bounder, spec: VnnlibSpec, disjuncts: list[int], s: Settings):
        self.b, self.s = b, s
        rows, owner = Spec.from_disjuncts([spec.disjuncts[d] for d in disjuncts], b.device)
        self.C, self.d = rows.C, rows.d
        self.owner = torch.as_tensor(owner, device=b.device)
        self.n = len(disjuncts)
        self.R = self.C.shape[0]
        self.split_sites = sites(b)
        self.out = b.net.output

    # -- bounds ------------------------------------------------------------------------------------
    def excluded(self, lower: torch.Tensor) -> torch.Tensor:
        """[D, n]: the disjuncts some row of which has a lower bound > 0 on each domain."""
        return self.per_disjunct(lower > 0) > 0

    def per_disjunct(self, rows: torch.Tensor) -> torch.Tensor:
        """[D, n]: how many of each disjunct's rows are True ([D, R] in)."""
        out = torch.zeros(rows.shape[0], self.n, dtype=DTYPE, device=rows.device)
        return out.index_add_(1, self.owner, rows.to(DTYPE))

    def bound(self, dom: _Domains, prior: torch.Tensor | None):
        """Lower bounds [D, R] of the domains' rows, each the better of its pass's and `prior`'s; the minimizers
        [D·R, n_in] and the coefficients of each split site's output per row."""
        D = dom.size
        idx = torch.arange(D, device=self.b.device).repeat_interleave(self.R)
        fixed = {s: FixedLines(*(t[idx] for t in dom.lines[j])) for j, s in enumerate(self.split_sites)}
        record: dict[int, torch.Tensor] = {}
        inputs: list[torch.Tensor] = []
        with torch.no_grad():
            low = self.b.backward(self.C.repeat(D, 1), self.out, None, True, fixed, None, record, inputs) + self.d.repeat(D)
        low = low.view(D, self.R)
        if prior is not None:
            low = torch.maximum(low, prior)
        points = torch.where(inputs[0] >= 0, self.b.lb, self.b.ub)
        return low, points, record


def search(b: Bounder, spec: VnnlibSpec, disjuncts: list[int], expired: Callable[[], bool],
           confirm: Callable[[np.ndarray], Any], settings: Settings | None = None,
           prior: torch.Tensor | None = None) -> tuple[str, np.ndarray | None, str, dict]:
    """Branch and bound on the smooth units of `b`'s network over the open `disjuncts` of `spec` (module docstring):
    (status, counterexample or None, message, stats). `prior`: sound lower bounds of the disjuncts' rows on the whole
    box (α-CROWN's), which the root and so every domain keeps where they beat its own pass."""
    s = settings or Settings()
    srch = Search(b, spec, disjuncts, s)
    t0 = time.perf_counter()
    pre = [b.pre[j] for j in srch.split_sites]
    root_lines = [list(b.relaxation(j)) for j in srch.split_sites]
    one = lambda t: t.reshape(1, -1).clone()  # noqa: E731
    dom = _Domains([one(l) for l, _ in pre], [one(u) for _, u in pre], [[one(t) for t in ls] for ls in root_lines],
                   torch.zeros(1, srch.R, dtype=DTYPE, device=b.device))
    lower, points, record = srch.bound(dom, None if prior is None else prior.reshape(1, -1).to(DTYPE))
    dom.lower = lower
    stats = {"domains": 1, "rounds": 0}
    pending_scores = srch.scores(dom, lower, record)
    tried = 0
    while True:
        closed = srch.excluded(dom.lower).all(1)
        keep = ~closed
        dom, pending_scores = dom.take(keep), [t[keep] for t in pending_scores]
        if dom.size == 0:
            return "unsat", None, (f"smooth branch and bound: every domain closed ({stats['domains']} bounded, "
                                   f"{stats['rounds']} rounds, {time.perf_counter() - t0:.1f} s)"), stats
        if expired():
            worst = float(dom.lower.max(1).values.min()) if srch.n == 1 else float(dom.lower.min())
            stats["global_lower"] = worst
            return "timeout", None, (f"smooth branch and bound: {dom.size} domains open after {stats['domains']} "
                                     f"bounded (lowest row bound {worst:.4g})"), stats
        if dom.size > s.max_domains:
            return "timeout", None, f"smooth branch and bound: {dom.size} open domains, above its store of {s.max_domains}", stats
        # the batch: the open domains whose worst open disjunct is lowest
        worst = torch.where(srch.excluded(dom.lower)[:, srch.owner], torch.full_like(dom.lower, math.inf), dom.lower).min(1).values
        k = min(s.batch, dom.size)
        pick = torch.topk(-worst, k).indices
        rest = torch.ones(dom.size, dtype=torch.bool, device=b.device)
        rest[pick] = False
        parents = dom.take(pick)
        left, right = srch.split(parents, [t[pick] for t in pending_scores])
        kids = _Domains.join([left, right])
        lower, points, record = srch.bound(kids, torch.cat([parents.lower, parents.lower]))
        kids.lower = lower
        stats["domains"] += kids.size
        stats["rounds"] += 1
        # counterexamples: the minimizers of the rows still below 0, checked in float64 first
        below = (lower.view(-1) < 0).nonzero().flatten()
        if below.numel() and tried < 64:
            x = points[below]
            y = b.net.forward(x)
            val = y @ srch.C.T + srch.d  # every row of every point
            sat = srch.per_disjunct(val > 0) == 0  # a disjunct whose every row holds: the point is unsafe
            hit = sat.any(1).nonzero().flatten()
            for i in hit[:4].tolist():
                tried += 1
                x32 = confirm(x[i].cpu().numpy())
                if x32 is not None:
                    return "sat", np.asarray(x32), "smooth branch and bound: a domain's bound minimizer is unsafe", stats
        new_scores = srch.scores(kids, lower, record)
        dom = _Domains.join([dom.take(rest), kids])
        pending_scores = [torch.cat([a[rest], c]) for a, c in zip(pending_scores, new_scores)]
