"""Model registry. Every model is an `nn.Sequential` that starts with `Normalize`, so it takes inputs in
natural units and exports to one self-contained graph; activations come from the activation registry.

A checkpoint stores the `spec` dict that `build_model` takes, so it rebuilds its own model.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, Callable

import torch
from torch import nn

from .activations import ACTIVATIONS, GateContext, build_activation
from .config import GateConfig, ModelConfig

MakeAct = Callable[[int], nn.Module]  # channels -> activation module; act.expansion: outputs per input unit


class Normalize(nn.Module):
    """y = x·scale + shift (= (x − mean)/std). Mul/Add rather than Sub/Div: verifiers read it."""

    def __init__(self, mean: list[float], std: list[float], input_shape: tuple[int, ...]):
        super().__init__()
        mean_t = torch.tensor(mean, dtype=torch.float32)
        std_t = torch.tensor(std, dtype=torch.float32)
        # Broadcast over [N, C, H, W] (one value per channel) or [N, D] (one per feature).
        shape = (-1, 1, 1) if len(input_shape) == 3 else (-1,)
        self.register_buffer("scale", (1.0 / std_t).reshape(shape))
        self.register_buffer("shift", (-mean_t / std_t).reshape(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


def mlp(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, act: MakeAct) -> list[tuple[str, nn.Module]]:
    layers: list[tuple[str, nn.Module]] = [("flatten", nn.Flatten())]
    width = int(torch.tensor(input_shape).prod())
    for i, h in enumerate(cfg.hidden):
        layers += [(f"fc{i}", nn.Linear(width, h)), (f"act{i}", act(h))]
        width = h * act.expansion
    layers.append(("head", nn.Linear(width, num_classes)))
    return layers


def cnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, act: MakeAct) -> list[tuple[str, nn.Module]]:
    """3x3 convs, the 2nd and later with stride 2 (no pooling: every verifier reads strided Conv)."""
    if len(input_shape) != 3:
        raise ValueError(f"model.name=cnn needs image inputs (C, H, W), got shape {input_shape}; use model.name=mlp")
    c, h, w = input_shape
    layers: list[tuple[str, nn.Module]] = []
    for i, out in enumerate(cfg.channels):
        stride = 1 if i == 0 else 2
        layers += [(f"conv{i}", nn.Conv2d(c, out, 3, stride=stride, padding=1)), (f"act{i}", act(out))]
        c = out * act.expansion
        h, w = (h - 1) // stride + 1, (w - 1) // stride + 1
    n = len(cfg.channels)
    layers += [
        ("flatten", nn.Flatten()),
        ("fc", nn.Linear(c * h * w, cfg.cnn_hidden)),
        (f"act{n}", act(cfg.cnn_hidden)),
        ("head", nn.Linear(cfg.cnn_hidden * act.expansion, num_classes)),
    ]
    return layers


MODELS: dict[str, Callable[..., list[tuple[str, nn.Module]]]] = {"mlp": mlp, "cnn": cnn}


def make_spec(model_cfg: ModelConfig, activation: str, gate_cfg: GateConfig, info) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "model": asdict(model_cfg),
        "activation": activation,
        "gate": asdict(gate_cfg),
        "input_shape": list(info.input_shape),
        "num_classes": info.num_classes,
        "mean": list(info.mean),
        "std": list(info.std),
    }


class _ActFactory:
    """Callable channels -> activation module, carrying the activation's width expansion."""

    def __init__(self, make: Callable[[int], nn.Module], expansion: int):
        self.make, self.expansion = make, expansion

    def __call__(self, channels: int) -> nn.Module:
        return self.make(channels)


def build_model(spec: dict[str, Any]) -> nn.Sequential:
    model_cfg = ModelConfig(**spec["model"])
    gate_cfg = GateConfig(**spec["gate"])
    shape = tuple(spec["input_shape"])
    builder = MODELS[model_cfg.name]
    # First pass counts activation sites (increasing/decreasing λ init needs the depth).
    activation = ACTIVATIONS[spec["activation"]]
    counter = _ActFactory(lambda ch: nn.Identity(), activation.expansion)
    count = sum(1 for name, _ in builder(model_cfg, shape, spec["num_classes"], counter) if name.startswith("act"))
    shared: dict = {}
    sites = iter(range(count))
    act = _ActFactory(lambda ch: build_activation(spec["activation"], GateContext(ch, next(sites), count, gate_cfg, shared)),
                      activation.expansion)
    layers = builder(model_cfg, shape, spec["num_classes"], act)
    return nn.Sequential(OrderedDict([("norm", Normalize(spec["mean"], spec["std"], shape))] + layers))


def clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)
