"""Provable sparsity: ReLU units that are dead (input ≤ 0) or always active (input ≥ 0) for EVERY input in
the data's valid range, by the tight bounds (CROWN, then α-CROWN for each ReLU layer's unstable units).

A unit proven dead can be pruned and a unit proven always active folded into the next layer without
changing the network's output anywhere in the domain, unlike units that are dead on the validation set
only. The IBP counts are reported beside the tight ones (the loose baseline).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .bounds import Bounder
from .graph import Graph
from .ops.relu import ReLU
from .readers import module_path, read


AUTO_ALPHA_UNITS = 4096  # "auto": α-CROWN up to this many ReLUs (the default MLP's 1024 take ~4 s), CROWN beyond


def stable_units(model: Any, input_shape: Sequence[int] | None, low: Any, high: Any, method: str = "auto",
                 steps: int = 20) -> list[dict[str, Any]]:
    """Per ReLU site of a swapped (ReLU) model, in forward order, over the box [low, high] (scalars or arrays
    broadcast to the input shape, the data's valid range, e.g. [0, 1]^784):

    {"site": module name (or index), "units", "dead", "active" (tight counts), "dead_ibp", "active_ibp",
     "dead_mask", "active_mask" (bool arrays of the tight result)}.

    `model`: an nn.Module (with `input_shape`; "site" is then its module path), an ONNX path or a `Graph`; `method`: "ibp", "crown",
    "alpha-crown", or "auto" (α-CROWN up to `AUTO_ALPHA_UNITS` ReLUs, CROWN beyond). An unbounded domain (an
    infinite `low`/`high`) proves nothing: ValueError."""
    net: Graph = read(model, input_shape)
    if method == "auto":
        method = "alpha-crown" if net.num_relus <= AUTO_ALPHA_UNITS else "crown"
    shape = net.input_shape
    lo = np.broadcast_to(np.asarray(low, dtype=np.float64), shape).reshape(-1)
    hi = np.broadcast_to(np.asarray(high, dtype=np.float64), shape).reshape(-1)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError("the input domain is unbounded (the data set declares no finite valid range): no unit is provably stable")
    b = Bounder(net, lo, hi)
    if method in ("crown", "alpha-crown"):
        b.crown()
    if method == "alpha-crown":
        b.alpha_intermediate(steps)
    out = []
    torch_model = isinstance(model, torch.nn.Module)
    for s, k in enumerate(b.sites):
        node = b.net.nodes[k]
        if not isinstance(node.op, ReLU):
            continue
        l, u = b.pre[s]
        il, iu = b.ibp_pre[s]
        site = module_path(node.name) if torch_model else (node.op.source or node.name or str(s))
        out.append({"site": site, "units": int(l.numel()),
                    "dead": int((u <= 0).sum()), "active": int((l >= 0).sum()),
                    "dead_ibp": int((iu <= 0).sum()), "active_ibp": int((il >= 0).sum()),
                    "dead_mask": (u <= 0).cpu().numpy(), "active_mask": (l >= 0).cpu().numpy(), "method": method})
    return out


def check_by_sampling(model: Any, input_shape: Sequence[int], low: Any, high: Any, result: list[dict[str, Any]],
                      n: int = 2000, seed: int = 0) -> bool:
    """Do n uniform samples of the box agree with every claim (dead units ≤ 0, active ones ≥ 0)? For tests."""
    net = read(model, input_shape)
    gen = torch.Generator().manual_seed(seed)
    shape = net.input_shape
    lo = torch.from_numpy(np.broadcast_to(np.asarray(low, dtype=np.float64), shape).reshape(-1).copy())
    hi = torch.from_numpy(np.broadcast_to(np.asarray(high, dtype=np.float64), shape).reshape(-1).copy())
    h = lo + (hi - lo) * torch.rand(n, lo.numel(), generator=gen, dtype=torch.float64)
    merged = net.merged()
    vals = merged.values(h)
    relus = [k for k in merged.activations if isinstance(merged.nodes[k].op, ReLU)]
    for r, k in zip(result, relus):
        z = vals[merged.nodes[k].inputs[0]]
        if bool((z[:, torch.as_tensor(r["dead_mask"])] > 0).any()) or bool((z[:, torch.as_tensor(r["active_mask"])] < 0).any()):
            return False
    return True
