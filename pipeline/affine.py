"""Resizing an affine layer (nn.Linear, nn.Conv2d) in place: new output rows, or new input columns. The swap's
unfolding of linked pairs ([W; −W]) and the sparsity stage's pruning of dead units both go through these."""

from __future__ import annotations

import torch
from torch import nn

AFFINE = (nn.Linear, nn.Conv2d)


def set_outputs(layer: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """Give `layer` these output rows (weight [out, ...], bias [out] where the layer has one); returns it."""
    layer.weight = nn.Parameter(weight.detach().clone())
    if layer.bias is not None:
        layer.bias = nn.Parameter(bias.detach().clone())
    if isinstance(layer, nn.Linear):
        layer.out_features = weight.shape[0]
    else:
        layer.out_channels = weight.shape[0]
    return layer


def set_inputs(layer: nn.Module, weight: torch.Tensor) -> nn.Module:
    """Give `layer` these input columns (weight [out, in, ...]); returns it. Grouped convolutions are refused."""
    if isinstance(layer, nn.Conv2d) and layer.groups != 1:
        raise ValueError("grouped convolutions cannot be resized")
    layer.weight = nn.Parameter(weight.detach().clone())
    if isinstance(layer, nn.Linear):
        layer.in_features = weight.shape[1]
    else:
        layer.in_channels = weight.shape[1]
    return layer
