"""Where branch and bound splits: the branching heuristics of both searches, every domain of a batch at once, on the
device.

ReLU and grid units (`bab.bab`, mixed into `bab_domains.Search`): the best unit by the BaBSR intercept score (the
default; a grid unit by its own, `_grid_scores`, after the ReLUs: `relu_first`), or with `candidates` > 1 by filtered
smart branching (kFSB, De Palma et al. 2021 / α,β-CROWN): that many best units by the score, each evaluated by one
CROWN pass over both children with the parent's α and β (no optimization), the unit whose worse child is best wins
(`choose`); `children` writes the split domains.

Smooth units (`smooth_bab.search`, mixed into `smooth_bab.Search`): the unit whose relaxation costs the bound most,
split at 0 when the interval holds 0 well inside, else at its middle (`SmoothBranching`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .ops.base import DTYPE


class Branching:
    """The ReLU and grid heuristics of `bab_domains.Search`, which holds the units (`U` ReLU units over `relu_sites`,
    `V` grid units), the root's ranges and the bound pass (`bound`) kFSB evaluates candidates with."""

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


class SmoothBranching:
    """The smooth units' heuristic of `smooth_bab.Search`, which holds the split sites (`split_sites`), the rows'
    disjuncts (`owner`, `excluded`) and the settings (`inflection_share`); a domain (`smooth_bab._Domains`) holds per
    split site the units' intervals `l`, `u` and their lines."""

    def scores(self, dom, lower: torch.Tensor, record: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        """Per split site [D, n]: what splitting each unit is worth (`smooth_bab`'s docstring, step 1)."""
        D = dom.size
        open_rows = ~self.excluded(lower)[:, self.owner]  # [D, R]: rows whose disjunct is still open
        out = []
        for j, s in enumerate(self.split_sites):
            fn = self.b.op(s).fn
            l, u = dom.l[j], dom.u[j]
            al, bl, au, bu = dom.lines[j]
            gap_lo, gap_up = torch.zeros_like(l), torch.zeros_like(l)
            for y in (l, 0.5 * (l + u), u):
                fy = fn.f(y)
                gap_lo = torch.maximum(gap_lo, fy - (al * y + bl))
                gap_up = torch.maximum(gap_up, au * y + bu - fy)
            A = record[s].view(D, self.R, -1) * open_rows[..., None]
            score = (A.clamp(min=0).sum(1) * gap_lo + (-A).clamp(min=0).sum(1) * gap_up)
            out.append(torch.where(u > l, score, torch.full_like(score, -1.0)))
        return out

    def split(self, dom, scores: list[torch.Tensor]) -> tuple:
        """Both children of every domain, split on its best unit."""
        D = dom.size
        widths = [t.shape[1] for t in scores]
        flat = torch.cat(scores, dim=1)
        best = flat.argmax(1)
        offs = np.cumsum([0] + widths)
        kids = []
        rows = torch.arange(D, device=flat.device)
        for side in (0, 1):
            c = type(dom)([t.clone() for t in dom.l], [t.clone() for t in dom.u],
                          [[t.clone() for t in ls] for ls in dom.lines], dom.lower.clone())
            kids.append(c)
        for j, s in enumerate(self.split_sites):
            mine = (best >= int(offs[j])) & (best < int(offs[j + 1]))
            if not bool(mine.any()):
                continue
            r = rows[mine]
            unit = best[mine] - int(offs[j])
            l, u = dom.l[j][r, unit], dom.u[j][r, unit]
            w = u - l
            inner = (l + self.s.inflection_share * w < 0) & (0 < u - self.s.inflection_share * w)
            p = torch.where(inner, torch.zeros_like(l), 0.5 * (l + u))
            op = self.b.op(s)
            for side, (nl, nu) in enumerate(((l, p), (p, u))):
                c = kids[side]
                c.l[j][r, unit], c.u[j][r, unit] = nl, nu
                for t, v in zip(c.lines[j], op.lines(nl, nu)):
                    t[r, unit] = v
        return kids[0], kids[1]
