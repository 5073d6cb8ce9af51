"""Dropout: the identity in eval mode; random (no rule) in training mode."""

from __future__ import annotations

from ..core import _Call, _NoRule


def _dropout(c: _Call):
    p = c.bind(("input", "p", "training", "inplace"), {"p": 0.5, "training": True, "inplace": False})
    if p["training"] and p["p"] > 0:
        raise _NoRule("dropout in training mode is random")
    return c.box(p["input"])
