"""The values an ONNX graph's tensors take while it is read: a variable (`Value`), an integer tensor waiting for its
DequantizeLinear (`QValue`), a dequantized node's grid (`Grid`), the inner part of a gate (`Pending`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..floats import Float


@dataclass
class Value:
    """A variable tensor: the graph node that computes it, its full ONNX shape (the batch axis as 1), and in an int8
    graph what is known of onnxruntime's float32 value of it (`Float`; None: not followed)."""

    node: int
    shape: tuple[int, ...]
    fl: Float | None = field(default=None, repr=False)


@dataclass
class QValue:
    """The integer output of a QuantizeLinear on a variable: read only by the DequantizeLinear of the same grid."""

    src: Value
    scale: np.ndarray  # per unit (flat, the source's shape)
    zero: np.ndarray  # per unit
    qmin: int
    qmax: int
    onnx_node: Any


@dataclass
class Grid:
    """What a dequantized node's values are known to be: points of this grid, in [lo, hi] per unit."""

    scale: np.ndarray
    zero: np.ndarray
    qmin: int
    qmax: int
    lo: torch.Tensor
    hi: torch.Tensor

    def same(self, q: Any) -> bool:
        """Is `q` (a QValue, a Grid, parameters read from a node) this grid: scale, zero point and range?"""
        return (self.qmin, self.qmax) == (q.qmin, q.qmax) and np.array_equal(self.scale, q.scale) and np.array_equal(self.zero, q.zero)


@dataclass
class Pending:
    """The inner part of a gate x·g(λx) (σ(λx), softplus(λx), erf(softplus(λx))): read only as part of the gate."""

    ops: tuple[str, ...]  # the ops read so far of a gate family's chain (`gate_patterns`)
    arg: Value
    onnx_node: Any
