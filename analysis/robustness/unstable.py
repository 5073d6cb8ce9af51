"""How hard a ReLU network is to verify at ε, read off its units: after one CROWN pass over each sample's L∞ box, the
ReLUs whose input interval still straddles 0 (unstable: l < 0 < u, the units branch and bound must split; the proxy of
Xiao et al. 2019, "Training for faster adversarial robustness verification via inducing ReLU stability"), and per
layer the share whose sign is fixed over the box: stable active (l ≥ 0) or stable dead (u ≤ 0).

Over the whole input domain the same counts are `analysis.verification.stability.stable_units` (provable sparsity);
here the box is a sample's ε-ball, as the verify stage poses its properties.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis.verification.bounds import Bounder
from analysis.verification.graph import Graph
from analysis.verification.ops.relu import ReLU


def unstable_at(net: Graph, xs: np.ndarray, eps: float, low: Any = -math.inf, high: Any = math.inf) -> dict[str, Any]:
    """One CROWN pass per sample over [max(x − eps, low), min(x + eps, high)] (`xs`: flat rows in the graph's input
    units). Returns {"eps", "samples", "relus", "unstable": per-sample totals (list), "unstable_ibp": the same by interval
    arithmetic alone, "layers": per ReLU site in forward order {"site", "units", "unstable", "active", "dead"} as
    shares of the site's units averaged over the samples}."""
    xs = np.asarray(xs, dtype=np.float64).reshape(len(xs), -1)
    lo = np.broadcast_to(np.asarray(low, dtype=np.float64), xs.shape[1:])
    hi = np.broadcast_to(np.asarray(high, dtype=np.float64), xs.shape[1:])
    bounders = [Bounder(net, np.maximum(x - eps, lo), np.minimum(x + eps, hi)) for x in xs]
    Bounder.crown_many(bounders)
    results = [b.result() for b in bounders]
    merged = bounders[0].net if bounders else net.merged()
    relu = [i for i, k in enumerate(merged.activations) if isinstance(merged.nodes[k].op, ReLU)]
    layers = []
    for i in relu:
        node = merged.nodes[merged.activations[i]]
        units = int(results[0].pre[i][0].numel()) if results else 0
        fixed = [r.stable()[i] for r in results]
        dead = [float(d.sum()) / units for d, _ in fixed]
        active = [float((a & ~d).sum()) / units for d, a in fixed]  # a unit pinned at 0 (l = u = 0) counts as dead
        layers.append({"site": node.op.source or node.name or str(i), "units": units,
                       "unstable": float(np.mean([r.unstable()[i] / units for r in results])) if results else math.nan,
                       "active": float(np.mean(active)) if results else math.nan,
                       "dead": float(np.mean(dead)) if results else math.nan})
    return {"eps": float(eps), "samples": len(xs), "relus": sum(l["units"] for l in layers),
            "unstable": [int(sum(r.unstable()[i] for i in relu)) for r in results],
            "unstable_ibp": [int(sum(r.unstable("ibp")[i] for i in relu)) for r in results], "layers": layers}


def unstable_sweep(net: Graph, xs: np.ndarray, epsilons: Sequence[float], low: Any = -math.inf,
                   high: Any = math.inf) -> list[dict[str, Any]]:
    """`unstable_at` at each ε."""
    return [unstable_at(net, xs, e, low, high) for e in epsilons]
