"""Checkpoints carry the spec that rebuilds their model; loading validates before trusting them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import CheckpointError
from .models import build_model
from .atomic_io import atomic_path

FORMAT = 1
REQUIRED = ("format", "spec", "state_dict")


def save(path: Path, model: nn.Module, spec: dict[str, Any], **extra: Any) -> None:
    payload = {"format": FORMAT, "spec": spec, "state_dict": model.state_dict(), **extra}
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_payload(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} is missing", path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # truncated zip, wrong pickle, ...: all mean the same to the user
        raise CheckpointError(f"checkpoint {path} is corrupt ({type(exc).__name__})", path) from None
    if not isinstance(payload, dict) or any(k not in payload for k in REQUIRED):
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(REQUIRED)}; it was not written by this pipeline", path)
    if payload["format"] != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {payload['format']}, this version reads {FORMAT}", path)
    return payload


def load_module(path: Path) -> nn.Module:
    """The model of a checkpoint alone, on the CPU in eval mode (picklable as `functools.partial(load_module, path)`:
    a worker process rebuilds it from the file, since a module with closures does not pickle)."""
    return load_model(path)[0]


def load_model(path: Path, map_location: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model from its spec and load the weights; returns (model in eval mode, payload)."""
    payload = load_payload(path, map_location)
    model = build_model(payload["spec"])
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint {path} does not match its own spec ({str(exc).splitlines()[0]})", path) from None
    return model.to(map_location).eval(), payload
