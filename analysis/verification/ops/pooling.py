"""Pooling: sparse sums with fixed entries (`Pool`: ReduceMean/ReduceSum, a max's tree of differences and running
maxima), one level of a max's tree (`PairMax`, a + ReLU(b − a) = max(a, b)), and average pooling as a grouped `Conv`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .affine import Conv
from .base import DTYPE, Affine, as_tensor


def average_pool(in_shape: tuple[int, int, int], kernel: tuple[int, int], stride: tuple[int, int],
                 padding: tuple[int, int] = (0, 0)) -> Conv:
    """Average pooling (padding counted in the divisor) as a grouped convolution with weights 1/(kh·kw)."""
    c = in_shape[0]
    w = torch.full((c, 1, *kernel), 1.0 / (kernel[0] * kernel[1]), dtype=DTYPE)
    return Conv(w, torch.zeros(c, dtype=DTYPE), in_shape, stride, padding, (1, 1), c)



@dataclass(eq=False)
class Pool(Affine):
    """y[group[k]] += weight[k]·x[index[k]] for every entry k: a sparse matrix kept as its entries (row, column, value).
    Without `index` each input unit is one entry (index k = unit k): a ReduceSum or ReduceMean over any axes (weight 1/n),
    a sum of grouped units. With it, any fixed fan-in: a max's tree (`readers.pooling.max_tree`) gathers the differences of a
    window's elements and its running maxima. Back-substitution is a gather and a scatter-add, never a dense (out, in)
    matrix."""

    group: torch.Tensor
    weight: torch.Tensor
    size: int  # outputs
    index: torch.Tensor | None = None  # the input unit of each entry (None: entry k reads unit k)
    in_size: int = -1  # inputs (given with `index`; else the entries' count)

    def __post_init__(self) -> None:
        self.group = torch.as_tensor(self.group, dtype=torch.long).reshape(-1)
        self.weight = as_tensor(self.weight).reshape(-1).expand(self.group.numel()).clone()
        self.size = int(self.size)
        if self.index is None:
            self.in_size = self.group.numel()
        else:
            self.index = torch.as_tensor(self.index, dtype=torch.long).reshape(-1)
            self.in_size = int(self.in_size)
            if self.index.shape != self.group.shape or (self.index.numel() and not (
                    0 <= int(self.index.min()) and int(self.index.max()) < self.in_size)):
                raise ValueError(f"Pool needs one index per entry, each in 0..{self.in_size - 1}")
        if self.group.numel() and not (0 <= int(self.group.min()) and int(self.group.max()) < self.size):
            raise ValueError(f"Pool groups must lie in 0..{self.size - 1}")

    def in_sizes(self) -> tuple[int, ...]:
        return (self.in_size,)

    @property
    def out_size(self) -> int:
        return self.size

    def _entries(self, v: torch.Tensor) -> torch.Tensor:  # [B, in] -> [B, entries]
        return v if self.index is None else v[:, self.index]

    def _sum(self, v: torch.Tensor) -> torch.Tensor:
        return v.new_zeros(v.shape[0], self.size).index_add_(1, self.group, v)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self._sum(self._entries(h) * self.weight.to(h.dtype))

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        per_entry = A[:, self.group] * self.weight.to(A.dtype)
        if self.index is not None:
            per_entry = A.new_zeros(A.shape[0], self.in_size).index_add_(1, self.index, per_entry)
        return [per_entry], A.new_zeros(A.shape[0])

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = self._entries(bounds[0]), self._entries(bounds[1])
        wp, wn = self.weight.clamp(min=0).to(lo.dtype), self.weight.clamp(max=0).to(lo.dtype)
        return self._sum(lo * wp + hi * wn), self._sum(hi * wp + lo * wn)

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        return self._sum(self._entries(d) * self.weight.abs().to(d.dtype))

    def sparse(self):
        from scipy import sparse

        cols = np.arange(self.group.numel()) if self.index is None else self.index.numpy()
        m = sparse.csr_matrix((self.weight.numpy(), (self.group.numpy(), cols)), shape=(self.size, self.in_size))
        m.sum_duplicates()
        return [m], np.zeros(self.size)


@dataclass(eq=False)
class PairMax(Pool):
    """One level of a max's tree (`readers.pooling.max_tree`): on the concatenation (x, r) of a value x [n] and the ReLUs
    r = ReLU(x[b] − x[a]) of its pairs, y_j = x[a_j] + r_k = max(x[a_j], x[b_j]), or x[a_j] carried (b_j = −1). Built by
    `of`. As a map it is the Pool of those entries (`back`, `sparse`: exact); its interval and the swap gap's rule
    read the max it computes, which holds wherever r is that ReLU of x (in every network the tree is read into, on
    every box): [max(l_a, l_b), max(u_a, u_b)] and max(δ_a, δ_b) (max is 1-Lipschitz in L∞), each intersected with
    the Pool's own, which counts a twice (a + ReLU(b − a) by interval arithmetic is 3× as wide even where b − a has
    one sign)."""

    first: torch.Tensor | None = None  # a_j per output
    other: torch.Tensor | None = None  # b_j per output (a_j where carried)

    @classmethod
    def of(cls, a: Any, b: Any, n: int) -> "PairMax":
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        paired = b >= 0
        relu = n + np.cumsum(paired) - 1  # the ReLU of output j's pair, after x in the concatenation
        group = np.concatenate([np.arange(a.size), np.flatnonzero(paired)])
        index = np.concatenate([a, relu[paired]])
        return cls(group, np.ones(group.size), a.size, index, n + int(paired.sum()),
                   torch.as_tensor(a), torch.as_tensor(np.where(paired, b, a)))

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = super().ibp(bounds)
        (l, u), a, b = bounds, self.first, self.other
        return torch.maximum(lo, torch.maximum(l[:, a], l[:, b])), torch.minimum(hi, torch.maximum(u[:, a], u[:, b]))

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        return torch.minimum(super().abs_forward(d), torch.maximum(d[:, self.first], d[:, self.other]))


