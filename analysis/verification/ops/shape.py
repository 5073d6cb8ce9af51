"""Ops that only move units (`base.Affine` maps whose matrix holds 0s and 1s): `Concat` (constant inputs such as a class
token in its constant term), `Select` (Gather, Slice, Split, Expand, a broadcast) and `Permute` (Transpose). Each output
unit is a copy of one input unit, so CROWN bounds of a copy are its source's (`copies`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from .base import DTYPE, Affine, as_tensor, numel


@dataclass(eq=False)
class Concat(Affine):
    """Inputs of the given shapes (no batch axis) concatenated along `axis` (of those shapes). `consts`: per input, a
    constant tensor of that shape (a class token, a constant pad) or None for a variable; the op reads the variables
    only (its arity) and adds the constants' place in the output as its constant term."""

    shapes: tuple[tuple[int, ...], ...]
    axis: int
    consts: tuple[torch.Tensor | None, ...] | None = None
    out_shape: tuple[int, ...] = field(init=False)

    copies: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.shapes = tuple(tuple(int(d) for d in s) for s in self.shapes)
        first = self.shapes[0]
        ax = self.axis
        if not 0 <= ax < len(first) or any(len(s) != len(first) or s[:ax] + s[ax + 1:] != first[:ax] + first[ax + 1:]
                                           for s in self.shapes):
            raise ValueError(f"cannot concatenate shapes {self.shapes} along axis {ax}")
        self.out_shape = first[:ax] + (sum(s[ax] for s in self.shapes),) + first[ax + 1:]
        consts = self.consts or (None,) * len(self.shapes)
        if len(consts) != len(self.shapes) or all(c is not None for c in consts):
            raise ValueError("Concat needs one entry per input in consts and at least one variable input")
        self.consts = None
        # the constant term: the constants in their places, zeros where a variable goes (one flat tensor, so that
        # `Op.to`/`cast` move it like any other)
        parts = [as_tensor(c).reshape(s) if c is not None else torch.zeros(s, dtype=DTYPE) for c, s in zip(consts, self.shapes)]
        self.const = torch.cat(parts, dim=ax).reshape(-1) if any(c is not None for c in consts) else None
        self.variable = tuple(c is None for c in consts)

    @property
    def arity(self) -> int:  # type: ignore[override]
        return sum(self.variable)

    def in_sizes(self) -> tuple[int, ...]:
        return tuple(numel(s) for s, v in zip(self.shapes, self.variable) if v)

    @property
    def out_size(self) -> int:
        return numel(self.out_shape)

    def _join(self, h: tuple[torch.Tensor, ...], fill: float | None = 0.0) -> torch.Tensor:
        """The variables in their places; the constants' places 0 (`fill` 0) — `forward` adds `const`."""
        B = h[0].shape[0]
        it = iter(h)
        parts = [next(it).reshape(B, *s) if v else h[0].new_zeros(B, *s) for s, v in zip(self.shapes, self.variable)]
        return torch.cat(parts, dim=self.axis + 1).reshape(B, -1)

    def forward(self, *h: torch.Tensor) -> torch.Tensor:
        y = self._join(h)
        return y if self.const is None else y + self.const.to(y.dtype)

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        rows = A.shape[0]
        parts = torch.split(A.reshape(rows, *self.out_shape), [s[self.axis] for s in self.shapes], dim=self.axis + 1)
        c = A.new_zeros(rows) if self.const is None else A @ self.const.to(A.dtype)
        return [p.reshape(rows, -1) for p, v in zip(parts, self.variable) if v], c

    def ibp(self, *bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward(*(b[0] for b in bounds)), self.forward(*(b[1] for b in bounds))

    def abs_forward(self, *d: torch.Tensor) -> torch.Tensor:
        return self._join(d)

    def sparse(self):
        from scipy import sparse

        src = torch.cat([torch.full(s, i, dtype=torch.long) for i, s in enumerate(self.shapes)], dim=self.axis).reshape(-1).numpy()
        pos = torch.cat([torch.arange(numel(s)).reshape(s) for s in self.shapes], dim=self.axis).reshape(-1).numpy()
        mats = []
        for i, s in enumerate(self.shapes):
            if not self.variable[i]:
                continue
            rows = np.flatnonzero(src == i)
            mats.append(sparse.csr_matrix((np.ones(rows.size), (rows, pos[rows])), shape=(self.out_size, numel(s))))
        return mats, (np.zeros(self.out_size) if self.const is None else self.const.numpy().copy())


@dataclass(eq=False)
class Select(Affine):
    """y[j] = x[index[j]] for any index into the input (repeats allowed): a Gather, Slice, Split, Expand or Tile on a
    variable, a broadcast of one operand of a two-variable op to the other's shape."""

    index: torch.Tensor
    in_size: int

    copies: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.index = torch.as_tensor(self.index, dtype=torch.long).reshape(-1)
        self.in_size = int(self.in_size)
        if self.index.numel() and not (0 <= int(self.index.min()) and int(self.index.max()) < self.in_size):
            raise ValueError(f"Select indices must lie in 0..{self.in_size - 1}")

    def in_sizes(self) -> tuple[int, ...]:
        return (self.in_size,)

    def unit_sources(self) -> torch.Tensor:
        return self.index

    @property
    def out_size(self) -> int:
        return self.index.numel()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h[:, self.index]

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        return [A.new_zeros(A.shape[0], self.in_size).index_add_(1, self.index, A)], A.new_zeros(A.shape[0])

    def ibp(self, bounds: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward(bounds[0]), self.forward(bounds[1])

    def abs_forward(self, d: torch.Tensor) -> torch.Tensor:
        return self.forward(d)

    def sparse(self):
        from scipy import sparse

        n = self.index.numel()
        return [sparse.csr_matrix((np.ones(n), (np.arange(n), self.index.cpu().numpy())), shape=(n, self.in_size))], np.zeros(n)


@dataclass(eq=False)
class Permute(Select):
    """y[j] = x[index[j]] for a permutation `index` (a Transpose): a Select whose back is a scatter, not a sum."""

    in_size: int = -1  # the index's length

    def __post_init__(self) -> None:
        self.index = torch.as_tensor(self.index, dtype=torch.long).reshape(-1)
        if not torch.equal(torch.sort(self.index).values, torch.arange(self.index.numel(), device=self.index.device)):
            raise ValueError("Permute needs a permutation of 0..n-1")
        self.in_size = self.index.numel()

    def back(self, A: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        out = torch.empty_like(A)
        out[:, self.index] = A
        return [out], A.new_zeros(A.shape[0])


