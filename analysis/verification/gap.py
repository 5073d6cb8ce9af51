"""The swap gap: a sound bound on |smooth(x) − ReLU(x)| over a box, through each op's own rule (`Activation.gap`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .graph import Graph
from .ops.base import DTYPE


def swap_gap(smooth: Graph, relu_pre: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """A sound bound, per output, on |smooth(x) − relu(x)| for every x in the box on which `relu_pre` bounds
    the ReLU network's activation inputs (site by site; relu = `smooth.relu_version()`, same weights).

    δ bounds |z' − z| elementwise (z' the smooth network's values, z the ReLU network's), node by node; δ = 0 on
    the input. Affine maps carry it as |M|·δ (`Affine.abs_forward`); an activation site with ReLU-network input
    z ∈ [l, u] and δ on its input gives its output's, `gap(l, u, δ)`: a ReLU's 1-Lipschitz δ (0 where dead), a gate's
    distance to ReLU (`ops.gates.Gate.gap`), an op both networks share its own Lipschitz bound."""
    net = smooth.merged()
    sites = net.activations
    if len(relu_pre) != len(sites):
        raise ValueError(f"{len(relu_pre)} pre-activation bounds for {len(sites)} activation sites")
    site_of = {k: s for s, k in enumerate(sites)}
    d: list[torch.Tensor | None] = [None] * len(net.nodes)
    d[0] = torch.zeros(1, net.num_inputs, dtype=DTYPE, device=net.device)
    for k, node in enumerate(net.nodes[1:], start=1):
        if node.op.affine:
            d[k] = node.op.abs_forward(*(d[i] for i in node.inputs))
            continue
        l, u = relu_pre[site_of[k]]
        d[k] = node.op.gap(l, u, d[node.inputs[0]][0])[None]
    return d[net.output][0]
