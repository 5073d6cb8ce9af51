"""Products of two variables: `Product` (x ⊙ y elementwise) and `BatchMatMul` (A @ B over a batch of matrices), each on
the concatenation of its two operands (the reader adds the `Concat`), so that every nonlinear node of the graph is an
activation site with one input interval. Each product term x·y over the box [x_l, x_u] × [y_l, y_u] gets one McCormick
plane per side, both through the edge x = x_l (auto_LiRPA's `MulHelper.interpolated_relaxation`, its default):

    x·y ≥ y_l·x + x_l·y − x_l·y_l,      x·y ≤ y_u·x + x_l·y − x_l·y_u,

with gaps (x − x_l)(y − y_l) ≥ 0 and (x − x_l)(y_u − y) ≥ 0, exact on that edge. The coefficient on y is x_l on both
sides, so a MatMul's relaxation is three matrix products (coefficients Λ₊·B_lᵀ + Λ₋·B_uᵀ and A_lᵀ·Λ) and two constant
matrices −A_l·B_l, −A_l·B_u, never a tensor per product term. `PLANES = "middle"` gives the two planes of each side
averaged instead (auto_LiRPA's `middle` option), which is far looser through attention (benchmarks/peers/crown-vit/):
the first operand of attention's products is the query or the softmax's probabilities, whose lower ends lie nearest
the values the box reaches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .base import Activation
from .curves import REL_SLACK, TINY

class _Bilinear(Activation):
    """An op on the concatenation (x, y) of two operands, bilinear in them: not elementwise, so it gives `relax` (a
    tuple of tensors) and `back` (the coefficients on its input and the constant, given that tuple) instead of
    per-unit lines. `bounds.Bounder` calls those; `milp.encode` calls `milp_rows`."""

    elementwise: ClassVar[bool] = False

    def split(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def relax(self, l: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def back(self, A: torch.Tensor, relax: tuple[torch.Tensor, ...], unknown: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """`unknown`: `relax` may hold ±∞ (or its constants may overflow; `_read`); False (the caller checked every tensor
        of `relax` is finite, once per relaxation) skips the guard, a pass over the coefficients per constant."""
        raise NotImplementedError

    def milp_rows(self, l: torch.Tensor, u: torch.Tensor) -> list[tuple[Any, np.ndarray, np.ndarray]]:
        """[(M, lo, hi)]: each lo ≤ z − M·x ≤ hi (x the op's input, z its output), M a scipy matrix (out, in)."""
        raise NotImplementedError

    def lines(self, l, u):
        raise NotImplementedError(f"{type(self).__name__} is not elementwise: its relaxation is `relax`/`back`")


def _read(A: torch.Tensor, c: torch.Tensor, unknown: bool = True) -> torch.Tensor:
    """A·c elementwise, with 0·(±∞) read as 0 where `unknown`: a relaxation's constant overflows on a unit whose interval
    is unknown (±1e300, `bounds.UNKNOWN`: one the output does not depend on keeps interval arithmetic's,
    `Bounder.needed`), and a coefficient of 0 does not read it (a coefficient ≠ 0 gets ∓∞: no bound, as it should)."""
    if not unknown:
        return A * c
    return torch.where(A == 0, torch.zeros((), dtype=A.dtype, device=A.device), A * c)


PLANES = "edge"  # "edge": McCormick's planes through x = x_l (module docstring); "middle": each side's two averaged


def _planes(xl, xu, yl, yu):
    """Per product term x·y: (x's coefficient below, x's above, y's on both sides, the constant below, above)."""
    if PLANES == "middle":
        ym = (yl + yu) / 2
        return ym, ym, (xl + xu) / 2, -(xu * yu + xl * yl) / 2, -(xl * yu + xu * yl) / 2
    return yl, yu, xl, -xl * yl, -xl * yu


@dataclass(eq=False)
class Product(_Bilinear):
    """z = x ⊙ y for two operands of `size` units each; input (x, y) concatenated, 2·size units."""

    size: int
    source: str = ""

    def in_sizes(self) -> tuple[int, ...]:
        return (2 * self.size,)

    @property
    def out_size(self) -> int:
        return self.size

    def split(self, v):
        return v[..., :self.size], v[..., self.size:]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x, y = self.split(h)
        return x * y

    def interval(self, l, u):
        (xl, yl), (xu, yu) = self.split(l), self.split(u)
        c = torch.stack([xl * yl, xl * yu, xu * yl, xu * yu])
        lo, hi = c.min(0).values, c.max(0).values
        slack = REL_SLACK * c.abs().max(0).values + TINY
        return lo - slack, hi + slack

    def relax(self, l, u):
        (xl, yl), (xu, yu) = self.split(l), self.split(u)
        cx_lo, cx_up, cy, gl, gu = _planes(xl, xu, yl, yu)
        slack = REL_SLACK * 4 * torch.maximum(xl.abs(), xu.abs()) * torch.maximum(yl.abs(), yu.abs()) + TINY
        return cx_lo, cx_up, cy, gl - slack, gu + slack

    def back(self, A, relax, unknown: bool = True):
        cx_lo, cx_up, cy, gl, gu = relax
        Ap, An = A.clamp(min=0), A.clamp(max=0)
        const = _read(Ap, gl, unknown).sum(-1) + _read(An, gu, unknown).sum(-1)
        return torch.cat([Ap * cx_lo + An * cx_up, A * cy], dim=-1), const

    def milp_rows(self, l, u):
        from scipy import sparse

        cx_lo, cx_up, cy, gl, gu = (t.numpy() for t in self.relax(l, u))
        inf = np.full(self.size, np.inf)
        below = sparse.hstack([sparse.diags(cx_lo), sparse.diags(cy)], format="csr")
        above = sparse.hstack([sparse.diags(cx_up), sparse.diags(cy)], format="csr")
        return [(below, gl, inf), (above, -inf, gu)]

    def gap(self, l, u, d):
        (xl, yl), (xu, yu) = self.split(l), self.split(u)
        dx, dy = self.split(d)
        mx, my = torch.maximum(xl.abs(), xu.abs()), torch.maximum(yl.abs(), yu.abs())
        # |x'y' − xy| ≤ |x' − x|·|y'| + |x|·|y' − y|
        return (dx * (my + dy) + mx * dy) * (1 + REL_SLACK) + TINY


@dataclass(eq=False)
class BatchMatMul(_Bilinear):
    """Z = A @ B per batch entry: A [b, m, k] and B [b, k, n] (flat, concatenated in that order) → Z [b, m, n]."""

    b: int
    m: int
    k: int
    n: int
    source: str = ""

    attention: ClassVar[bool] = True

    def in_sizes(self) -> tuple[int, ...]:
        return (self.b * self.k * (self.m + self.n),)

    @property
    def out_size(self) -> int:
        return self.b * self.m * self.n

    def split(self, v):
        lead = v.shape[:-1]
        na = self.b * self.m * self.k
        return v[..., :na].reshape(*lead, self.b, self.m, self.k), v[..., na:].reshape(*lead, self.b, self.k, self.n)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a, b = self.split(h)
        return (a @ b).reshape(h.shape[0], -1)

    def interval(self, l, u):
        (al, bl), (au, bu) = self.split(l), self.split(u)
        # per product term A_ik·B_kj: the extremes of its four corners, [b, m, k, n], summed over k
        x = torch.stack([al, au])[:, None, :, :, :, None]  # [2, 1, b, m, k, 1]
        y = torch.stack([bl, bu])[None, :, :, None, :, :]  # [1, 2, b, 1, k, n]
        c = (x * y).reshape(4, self.b, self.m, self.k, self.n)
        lo, hi = c.min(0).values.sum(2), c.max(0).values.sum(2)
        slack = REL_SLACK * (self.k + 2) * c.abs().max(0).values.sum(2) + TINY
        return (lo - slack).reshape(-1), (hi + slack).reshape(-1)

    def relax(self, l, u):
        """(B's coefficients below, above: [b, k, n]; A's on both sides: [b, m, k]; the constants below, above:
        [b, m, n]), each term's planes `_planes`'s, summed over k."""
        (al, bl), (au, bu) = self.split(l), self.split(u)
        ma, mb = torch.maximum(al.abs(), au.abs()), torch.maximum(bl.abs(), bu.abs())
        slack = REL_SLACK * 4 * (self.k + 2) * (ma @ mb) + TINY
        if PLANES == "middle":
            am, bm = (al + au) / 2, (bl + bu) / 2
            return bm, bm, am, -(au @ bu + al @ bl) / 2 - slack, -(au @ bl + al @ bu) / 2 + slack
        return bl, bu, al, -(al @ bl) - slack, -(al @ bu) + slack

    def back(self, A, relax, unknown: bool = True):
        b_lo, b_up, a_both, gl, gu = relax
        R = A.shape[0]
        Lam = A.reshape(R, self.b, self.m, self.n)
        Lp, Ln = Lam.clamp(min=0), Lam.clamp(max=0)
        coef_a = Lp @ b_lo.transpose(-1, -2) + Ln @ b_up.transpose(-1, -2)  # [R, b, m, k]
        coef_b = a_both.transpose(-1, -2) @ Lam  # [R, b, k, n]
        const = _read(Lp, gl, unknown).sum((1, 2, 3)) + _read(Ln, gu, unknown).sum((1, 2, 3))
        return torch.cat([coef_a.reshape(R, -1), coef_b.reshape(R, -1)], dim=-1), const

    def milp_rows(self, l, u):
        from scipy import sparse

        b_lo, b_up, a_both, gl, gu = (t.numpy() for t in self.relax(l, u))
        b, m, k, n = self.b, self.m, self.k, self.n
        # row (β, i, j): Σ_k B's coefficient[β, k, j]·A[β, i, k] + a_both[β, i, k]·B[β, k, j]
        B_, I, J, K = np.meshgrid(np.arange(b), np.arange(m), np.arange(n), np.arange(k), indexing="ij")
        row = ((B_ * m + I) * n + J).ravel()
        col_a = ((B_ * m + I) * k + K).ravel()
        col_b = b * m * k + ((B_ * k + K) * n + J).ravel()
        rows, cols = np.concatenate([row, row]), np.concatenate([col_a, col_b])

        def plane(bc):
            vals = np.concatenate([bc[B_, K, J].ravel(), a_both[B_, I, K].ravel()])
            return sparse.csr_matrix((vals, (rows, cols)), shape=(self.out_size, self.in_sizes()[0]))

        inf = np.full(self.out_size, np.inf)
        return [(plane(b_lo), gl.reshape(-1), inf), (plane(b_up), -inf, gu.reshape(-1))]

    def gap(self, l, u, d):
        (al, bl), (au, bu) = self.split(l), self.split(u)
        da, db = self.split(d)
        ma, mb = torch.maximum(al.abs(), au.abs()), torch.maximum(bl.abs(), bu.abs())
        return ((da @ (mb + db) + ma @ db) * (1 + REL_SLACK)).reshape(-1) + TINY
