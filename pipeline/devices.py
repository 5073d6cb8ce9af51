"""A model where a stage works, without moving the caller's: stages run their parts on the run's device or on the CPU
(`pipeline.stages.Stage.where`), and the API hands them a user's model, which must come back where it was."""

from __future__ import annotations

import copy

import torch
from torch import nn


def model_on(model: nn.Module, device: torch.device | str) -> nn.Module:
    """`model` itself when its parameters and buffers are on `device`, else a copy there (the caller's model stays put)."""
    device = torch.device(device)
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.device.type == device.type and (device.index is None or t.device.index == device.index) for t in tensors):
        return model
    return copy.deepcopy(model).to(device)


def cpu_model(model: nn.Module) -> nn.Module:
    """`model_on(model, "cpu")`: what float32 statements about CPU runs, ONNX export and onnxruntime comparisons use."""
    return model_on(model, "cpu")
