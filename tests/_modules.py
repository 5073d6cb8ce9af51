"""Small torch modules the verification tests build networks from (not a test module)."""

from __future__ import annotations

import torch
from torch import nn


class Affine(nn.Module):
    """y = x·scale + shift with buffers, the Mul/Add normalization the exporter and the verifiers read."""

    def __init__(self, scale, shift):
        super().__init__()
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))
        self.register_buffer("shift", torch.as_tensor(shift, dtype=torch.float32))

    def forward(self, x):
        return x * self.scale + self.shift
