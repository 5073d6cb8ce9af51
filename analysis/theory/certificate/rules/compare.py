"""Comparisons (`input_ids != pad_token_id` in Hugging Face's sequence classifiers): exact where neither side differs
between the networks (token ids, positions); a comparison of values that differ is a jump, and refused."""

from __future__ import annotations

import torch

from ..core import _Call, _NoRule

COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
               "logical_not", "logical_and", "logical_or", "__and__", "__or__", "__invert__", "isin")


def _compare(c: _Call):
    if any(bool(c.box(a).any()) for a in c.args[:2]):
        raise _NoRule(f"`{c.name}` compares values that differ between the networks: the result can jump")
    return torch.zeros((), dtype=torch.float64)
