"""Devices: a device name resolved (`resolve`: the run's `device=`, torchrun's per-process GPU, the verifier's
`verify.device`), and a model where a stage works, without moving the caller's: stages run their parts on the run's
device or on the CPU (`pipeline.stages.Stage.where`), and the API hands them a user's model, which must come back where
it was."""

from __future__ import annotations

import copy

import torch
from torch import nn

from .errors import DeviceError


def resolve(name: str, local_rank: int | None = None, setting: str = "device=") -> torch.device:
    """`auto|cpu|cuda|cuda:N` to a torch device ("auto": a GPU when there is one); `local_rank`: the GPU a bare `cuda`
    means for one process of several (torchrun's). A name that is no device, or CUDA where there is none, is a one-line
    `DeviceError` naming the choices, in the words of `setting` (how the user wrote it: "device=", "verify.device=",
    "--device ")."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(f"{setting}{name} asked for CUDA but none is available; use {setting}cpu or {setting}auto")
    if name == "cuda" and local_rank is not None:
        name = f"cuda:{local_rank}"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"{setting}{name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DeviceError(f"{setting}{name} but this machine has {torch.cuda.device_count()} GPU(s); use cuda:0 .. "
                          f"cuda:{torch.cuda.device_count() - 1} or {setting}auto")
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"{setting}{name!r} is not supported; use auto, cpu, cuda or cuda:N")
    return dev


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
