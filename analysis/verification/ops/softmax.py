"""A softmax's denominators as one op (`ExpSums`): a softmax is read as exp and reciprocal (softmax_i =
1/Σ_j exp(x_j − x_i), Wei et al. 2023's exp-reciprocal form: no division of two variables, and exp(x_i − x_i) = 1
exactly, so the sum is ≥ 1); and the kept entries of a masked softmax's rows (`MaskedRows`), which check on every box
that the masked ones are 0."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from .base import OutOfDomain, as_tensor
from .curves import EXP_MAX, REL_SLACK, TINY, Exp
from .products import _Bilinear, _read
from .shape import Select

# A masked entry's score plus its constant at least this far below its row's largest kept one: its share of the
# softmax is below T·exp(−1000), 0 in float64 and float32 alike and far below every relaxation's own slack
DROP_MARGIN = 1000.0

@dataclass(eq=False)
class ExpSums(_Bilinear):
    """s_i = Σ_j exp(x_j − x_i) per row of R rows × T (a softmax's denominators in the exp-reciprocal form: softmax_i =
    1/s_i), as one op on the logits x. Read as a Linear to the T² differences, an Exp on each and a sum, the
    differences are a layer of R·T² units (a 64-token ViT with 2 heads: 549,250, against 8,450 logits) that every
    later back-substitution carries, and CROWN queried each of them (1.1 M rows a softmax).

    Relaxation: the differences' intervals from the logits' (x_j − x_i ∈ [l_j − u_i, u_j − l_i], exactly 0 at j = i),
    the `Exp` lines on each (tangent at the middle below, chord above, each intercept widened as `Curve.lines` does),
    summed over j: s_i ≥ Σ_j al_ij·(x_j − x_i) + bl_ij and s_i ≤ Σ_j au_ij·(x_j − x_i) + bu_ij. `back` applies them to
    coefficient rows Λ [rows, R, T] without the T² layer: x_j gets Σ_i Λ⁺_i·al_ij + Λ⁻_i·au_ij (one batched matrix
    product per row of logits), x_i gets −Λ⁺_i·Σ_j al_ij − Λ⁻_i·Σ_j au_ij."""

    R: int
    T: int
    source: str = ""
    # Below this many differences (R·T²) a reader keeps them an explicit layer: its intervals then come from CROWN,
    # which keeps the correlation of x_j and x_i that [l_j − u_i, u_j − l_i] loses. On deit_tiny 32×2 (R·T² = 500 per
    # softmax) ExpSums alone left a CROWN margin of −0.200 where the explicit layer gives −0.044 (sample 4, ε 0.008).
    MIN_DIFFS = 8192

    attention: ClassVar[bool] = True

    def in_sizes(self) -> tuple[int, ...]:
        return (self.R * self.T,)

    @property
    def out_size(self) -> int:
        return self.R * self.T

    def forward(self, h):
        x = h.reshape(h.shape[0], self.R, self.T)
        s = torch.exp(torch.logsumexp(x, -1, keepdim=True) - x)
        return s.reshape(h.shape[0], -1)

    def _diffs(self, l, u):
        """The intervals [dl, du] of x_j − x_i, [R, T(i), T(j)], exactly 0 on the diagonal."""
        l, u = l.reshape(self.R, self.T), u.reshape(self.R, self.T)
        dl = l[:, None, :] - u[:, :, None]
        du = u[:, None, :] - l[:, :, None]
        eye = torch.eye(self.T, dtype=torch.bool, device=l.device)
        zero = torch.zeros_like(dl)
        return torch.where(eye, zero, dl), torch.where(eye, zero, du), eye

    def interval(self, l, u):
        dl, du, _ = self._diffs(l, u)
        el, eu = Exp(dl.numel()).interval(dl.reshape(-1), du.reshape(-1))  # each end widened; +∞ where it overflows
        lo = (el.reshape(dl.shape).sum(-1) * (1 - self.T * REL_SLACK)).clamp(min=1.0)  # exp(x_i − x_i) = 1, the rest > 0
        return lo.reshape(-1), (eu.reshape(du.shape).sum(-1) * (1 + self.T * REL_SLACK)).reshape(-1)

    def relax(self, l, u):
        """The lines above. A sum s_i with some difference above `EXP_MAX` (exp overflows) gets the constant lines
        1 ≤ s_i ≤ ∞ (s_i ≥ exp(0) = 1 always): no finite upper line, which `back` refuses only for rows that read it, so
        the rows of a softmax the output does not depend on (block 1's non-class tokens in a ViT) cost nothing."""
        dl, du, eye = self._diffs(l, u)
        over = (du > EXP_MAX).any(-1)  # [R, T(i)]
        du = du.clamp(max=EXP_MAX)
        dl = torch.minimum(dl, du)
        al, bl, au, bu = (t.reshape(dl.shape) for t in Exp(dl.numel()).lines(dl.reshape(-1), du.reshape(-1)))
        zero, one = torch.zeros_like(al), torch.ones_like(al)
        # exp(x_i − x_i) = 1 exactly: the constant line
        al, au = torch.where(eye, zero, al), torch.where(eye, zero, au)
        bl, bu = torch.where(eye, one, bl), torch.where(eye, one, bu)
        al, au = torch.where(over[..., None], zero, al), torch.where(over[..., None], zero, au)
        # the sums over j of the intercepts, each widened by its own rounding (T terms)
        sl, su = bl.sum(-1), bu.sum(-1)
        slack = REL_SLACK * self.T * (bl.abs().sum(-1) + bu.abs().sum(-1)) + TINY
        sl, su = sl - slack, su + slack
        sl = torch.where(over, torch.ones_like(sl) * (1 - REL_SLACK), sl)
        su = torch.where(over, torch.full_like(su, math.inf), su)
        return al, au, al.sum(-1), au.sum(-1), sl, su

    def back(self, A, relax, unknown: bool = True):
        al, au, al_sum, au_sum, sl, su = relax
        rows = A.shape[0]
        Lam = A.reshape(rows, self.R, self.T)
        Ap, An = Lam.clamp(min=0), Lam.clamp(max=0)
        over = torch.isinf(su)
        if unknown and bool(over.any()):
            if bool((An < 0).logical_and(over).any()):
                raise OutOfDomain(f"Exp ({self.source or 'a softmax'}): a difference of its logits exceeds {EXP_MAX:g} on "
                                  "this box (exp overflows) in a softmax row the bound reads, so that row has no finite "
                                  "sound upper relaxation here")
        # coefficient of x_j: Σ_i Λ⁺_i·al_ij + Λ⁻_i·au_ij, per logit row r a [rows, T] @ [T, T] product
        cj = (Ap.transpose(0, 1) @ al + An.transpose(0, 1) @ au).transpose(0, 1)
        ci = Ap * al_sum + An * au_sum
        const = _read(Ap, sl, unknown).sum((1, 2)) + _read(An, su, unknown).sum((1, 2))
        return (cj - ci).reshape(rows, -1), const

    def _planes(self, a, a_sum):
        from scipy import sparse

        R, T = self.R, self.T
        r, i, j = np.meshgrid(np.arange(R), np.arange(T), np.arange(T), indexing="ij")
        rows = (r * T + i).ravel()
        vals = np.concatenate([a.reshape(-1), -a_sum.reshape(-1)])
        cols = np.concatenate([(r * T + j).ravel(), np.arange(R * T)])
        return sparse.csr_matrix((vals, (np.concatenate([rows, np.arange(R * T)]), cols)), shape=(R * T, R * T))

    def milp_rows(self, l, u):
        al, au, al_sum, au_sum, sl, su = (t.numpy() for t in self.relax(l, u))
        inf = np.full(self.R * self.T, np.inf)
        return [(self._planes(al, al_sum), sl.reshape(-1), inf), (self._planes(au, au_sum), -inf, su.reshape(-1))]

    def gap(self, l, u, d):
        # |s'_i − s_i| ≤ Σ_j max exp over [dl − δ, du + δ] · δ_ij, δ_ij = d_i + d_j how far x_j − x_i moves
        dl, du, eye = self._diffs(l, u)
        dd = d.reshape(self.R, self.T)
        delta = torch.where(eye, torch.zeros_like(dl), dd[:, None, :] + dd[:, :, None])
        hi = du + delta
        if bool(hi.max() > EXP_MAX):
            raise OutOfDomain(f"Exp ({self.source or 'a softmax'}): its swap gap needs exp of {float(hi.max()):.4g}")
        return ((torch.exp(hi) * delta).sum(-1) * (1 + self.T * REL_SLACK)).reshape(-1) + TINY


@dataclass(eq=False)
class MaskedRows(Select):
    """The kept entries of R rows of softmax(scores + c) whose constant c masks some entries (c ≤ −1e30 or −∞: a
    causal mask), row by row, k each (`index` into the scores): the reader drops the masked entries (0 after the
    softmax, out of every sum), which is exact only where each masked score plus its constant stays `DROP_MARGIN`
    below its row's largest kept one. Every interval pass (IBP's, CROWN's) checks that on the scores' bounds, kept and
    masked alike, and raises `OutOfDomain` naming the node where the box does not show it: a later pass (CROWN,
    branch and bound, the MILP) bounds a subset of this box, so the check at the box's first pass covers them all."""

    kept_c: torch.Tensor  # [R·k] the constant each kept entry gets (> −1e30)
    masked: torch.Tensor  # index into the scores of each masked entry of these rows
    masked_c: torch.Tensor  # its constant (≤ −1e30 or −∞)
    masked_row: torch.Tensor  # its row, 0..R−1
    rows: int
    source: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.kept_c, self.masked_c = as_tensor(self.kept_c).reshape(-1), as_tensor(self.masked_c).reshape(-1)
        self.masked = torch.as_tensor(self.masked, dtype=torch.long).reshape(-1)
        self.masked_row = torch.as_tensor(self.masked_row, dtype=torch.long).reshape(-1)
        if self.index.numel() % self.rows or self.kept_c.numel() != self.index.numel():
            raise ValueError("MaskedRows needs k kept entries and one constant per kept entry in each of its rows")

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        l, u = bounds
        B = l.shape[0]
        top = (l[:, self.index] + self.kept_c.to(l.dtype)).reshape(B, self.rows, -1).amax(-1)
        worst = l.new_full((B, self.rows), -math.inf).scatter_reduce(
            1, self.masked_row.expand(B, -1), u[:, self.masked] + self.masked_c.to(u.dtype), "amax")
        gap = worst - top
        if bool((gap > -DROP_MARGIN).any()):
            raise OutOfDomain(f"Softmax ({self.source or 'a masked softmax'}): its mask's constants do not provably "
                              f"outweigh the scores on this box (a masked entry's score plus constant reaches "
                              f"{float(gap.max()):.3g} from its row's largest kept one; reading it as 0 needs ≤ "
                              f"{-DROP_MARGIN:g}), so the masked softmax has no sound reading here")
        return super().ibp(bounds)
