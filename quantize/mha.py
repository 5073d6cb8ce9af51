"""nn.MultiheadAttention's fused eval-mode fast path, switched off where a graph is traced: by the exporter
(quantize/export.py) and by the rounding bound (quantize/rounding.py), which must follow the same unfused path."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def mha_fastpath(enabled: bool) -> Iterator[None]:
    """nn.MultiheadAttention's fused eval-mode fast path on or off for a block, restored afterwards: the
    TorchScript exporter has no symbolic for the fused op (`aten::_native_multi_head_attention`), while
    the unfused path exports as MatMul/Softmax and computes the same function."""
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)
