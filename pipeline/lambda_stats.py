"""λ statistics over a run's per-epoch λ table ([epochs × layers]): the drift V_λ, the Spearman rank correlation
ρ_S of layerwise profiles across runs (the λ-GELU paper's), and the λ plot. The train stage's report section and
`pipeline report` (analysis/paper/) use them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from pipeline import render

LambdaTable = Sequence[Sequence[float]] | np.ndarray


def as_table(lams: LambdaTable) -> np.ndarray:
    """[epochs, layers] float64; a 1-D input is one layer over epochs."""
    a = np.asarray(lams, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"λ table must be [epochs × layers] with at least one of each, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("λ table has non-finite entries")
    return a


def per_layer_drift(lams: LambdaTable) -> np.ndarray:
    """Σ_e |λ_ℓ(e+1) − λ_ℓ(e)| for each layer ℓ: [layers]."""
    a = as_table(lams)
    return np.abs(np.diff(a, axis=0)).sum(axis=0)


def drift(lams: LambdaTable) -> float:
    """V_λ = (1/L) Σ_ℓ Σ_{e=1}^{T−1} |λ_ℓ(e+1) − λ_ℓ(e)| (λ-GELU paper, Sec. IV-A); 0 for one epoch."""
    return float(per_layer_drift(lams).mean())


def spearman(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Spearman rank correlation of two layerwise λ profiles.

    Returns {"rho", "pvalue", "n", "reason"}; rho and pvalue are nan, with the reason, when ranks
    are undefined: fewer than 2 layers, or a constant profile (e.g. uniform init at epoch 0).
    """
    x, y = np.asarray(a, dtype=np.float64).reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"profiles have different lengths: {x.size} vs {y.size}")
    n = int(x.size)
    reason = None
    if n < 2:
        reason = "fewer than 2 layers"
    elif np.ptp(x) == 0 or np.ptp(y) == 0:
        which = " and ".join(k for k, v in (("first", x), ("second", y)) if np.ptp(v) == 0)
        reason = f"constant profile ({which}): every layer has the same λ, ranks are undefined"
    if reason is not None:
        return {"rho": math.nan, "pvalue": math.nan, "n": n, "reason": reason}
    res = spearmanr(x, y)
    return {"rho": float(res.statistic), "pvalue": float(res.pvalue), "n": n, "reason": None}


def spearman_over_epochs(run_a: LambdaTable, run_b: LambdaTable) -> list[dict[str, Any]]:
    """ρ_S(e) between two runs' profiles at each common epoch (the paper's Fig. 3, right)."""
    a, b = as_table(run_a), as_table(run_b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"runs have different layer counts: {a.shape[1]} vs {b.shape[1]}")
    return [{"epoch": e, **spearman(a[e], b[e])} for e in range(min(a.shape[0], b.shape[0]))]


# Per layer a line style and a marker, and line widths from thick (drawn first) to thin (on top): layers that
# anneal to the same λ_target coincide, and each stays visible under the next.
LAYER_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 2)), "P"))


def plot_lambda(lams: LambdaTable, path: str | Path, **kw: Any) -> Path:
    """`lambda_figure` saved as PNG."""
    return render.save(lambda_figure(lams, **kw), path)


def lambda_figure(
    lams: LambdaTable,
    layer_names: Sequence[str] | None = None,
    title: str | None = None,
    switch_epoch: int | None = None,
    target: float | None = None,
    marked_epoch: int | None = None,
):
    """λ per layer over epochs, on its own Agg canvas (no global backend switch).

    `switch_epoch` marks where annealing starts (Algorithm 1's e_s), `target` draws λ_target, `marked_epoch` the
    epoch whose checkpoint ships. Epochs are numbered from 1 on the x axis, with whole-number ticks.
    """
    from matplotlib.ticker import MaxNLocator

    a = as_table(lams)
    names = list(layer_names) if layer_names is not None else [f"layer {i}" for i in range(a.shape[1])]
    if len(names) != a.shape[1]:
        raise ValueError(f"{len(names)} layer names for {a.shape[1]} layers")
    fig = render.figure(6.4, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    epochs = np.arange(1, a.shape[0] + 1)
    n = len(names)
    for i, name in enumerate(names):
        style, marker = LAYER_STYLES[i % len(LAYER_STYLES)]
        width = 3.0 - 2.0 * i / max(n - 1, 1)
        ax.plot(epochs, a[:, i], linestyle=style, marker=marker if a.shape[0] <= 30 else None, ms=3 + 4 * (n - 1 - i) / max(n - 1, 1),
                lw=width, color=f"C{i % 10}", alpha=0.85, label=name)
    if switch_epoch is not None:
        ax.axvline(switch_epoch, color="grey", ls="--", lw=1, label="annealing starts")
    if marked_epoch is not None:
        ax.axvline(marked_epoch, color="tab:red", ls=":", lw=1.5, label=f"shipped (epoch {marked_epoch})")
    if target is not None:
        ax.axhline(target, color="black", ls=":", lw=1, label="λ_target")
    if target is not None and target / max(a.min(), 1e-12) > 50:
        ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("λ")
    ax.set_title(title or "λ per layer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(names) > 6 else 1)
    return fig
