"""The paper's figures: a table as an image, the (t, c) heatmap of Figure 1, the validation and Spearman curves of
Figure 3."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import render

from .runs import MODES, Record
from .tables import spearman_curves

def plot_table(header: list[str], cells: list[list[str]], path: Path, title: str) -> Path:
    chars = sum(max(len(str(r[j])) for r in [header, *cells]) for j in range(len(header)))
    fig = render.figure(min(0.5 + 0.075 * chars, 30), 0.6 + 0.25 * (len(cells) + 1))
    ax = fig.add_subplot(1, 1, 1)
    ax.axis("off")
    tab = ax.table(cellText=cells or [["-"] * len(header)], colLabels=header, loc="center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(7)
    tab.auto_set_column_width(list(range(len(header))))
    ax.set_title(title, fontsize=9)
    return render.save(fig, path, tight=True)


def plot_tc_heatmap(grid: dict[str, Any], path: Path, title: str) -> Path:
    fig = render.figure(1.6 + 1.2 * len(grid["c"]), 1.4 + 0.9 * len(grid["t"]))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(grid["drift"], cmap="viridis", aspect="auto")
    cb = fig.colorbar(im, ax=ax)
    cb.set_label("Δλ (mean drift V_λ)")
    ax.set_xticks(range(len(grid["c"])), [f"{c:g}" for c in grid["c"]])
    ax.set_yticks(range(len(grid["t"])), [f"{t:g}" for t in grid["t"]])
    ax.set_xlabel("c (η_s = c·η_w)")
    ax.set_ylabel("t (temperature)")
    lo, hi = np.nanmin(grid["drift"]), np.nanmax(grid["drift"])
    for i in range(len(grid["t"])):
        for j in range(len(grid["c"])):
            v = grid["delta_bvs"][i, j] if not math.isnan(grid["gelu_bvs"]) else grid["bvs"][i, j]
            if math.isnan(v):
                continue
            dark = (grid["drift"][i, j] - lo) < 0.5 * (hi - lo) if hi > lo else True
            ax.text(j, i, f"{v:+.4f}" if not math.isnan(grid["gelu_bvs"]) else f"{v:.4f}", ha="center", va="center",
                    fontsize=8, color="white" if dark else "black")
    ax.set_title(title, fontsize=9)
    return render.save(fig, path)


def plot_figure3(recs: list[Record], tc: tuple[float, float], path: Path, title: str) -> Path:
    fig = render.figure(11, 4)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    curves: dict[str, list[Record]] = defaultdict(list)
    for r in recs:
        if not r.hardenable:
            curves["ReLU" if r.variant == "relu" else r.variant.upper() if r.variant != "gelu" else "GELU"].append(r)
        elif not r.annealed and (r.t, r.c) == tc:
            curves[f"λ-GELU {MODES.get(r.mode, r.mode)}"].append(r)
    for i, (name, rs) in enumerate(sorted(curves.items())):
        n = min(len(r.val) for r in rs)
        v = np.array([r.val[:n] for r in rs])
        e = np.arange(1, n + 1)
        color = f"C{i}"
        left.plot(e, v.mean(0), color=color, label=f"{name} (n={len(rs)})")
        if len(rs) > 1:
            left.fill_between(e, v.mean(0) - v.std(0), v.mean(0) + v.std(0), color=color, alpha=0.2)
        left.axvline(np.mean([r.best_index + 1 for r in rs]), color=color, ls="--", lw=0.8)
    left.set_xlabel("epoch")
    left.set_ylabel(f"validation {recs[0].metric}")
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    curves = spearman_curves(recs, tc)
    for i, (pair, s) in enumerate(curves.items()):
        e = np.arange(1, len(s["mean"]) + 1)
        right.plot(e, s["mean"], color=f"C{i}", label=f"{pair} (n={s['n']})")
        right.fill_between(e, s["mean"] - s["std"], s["mean"] + s["std"], color=f"C{i}", alpha=0.2)
    right.set_xlabel("epoch")
    right.set_ylabel("Spearman ρ_S of layerwise λ")
    right.set_ylim(-1.05, 1.05)
    right.grid(alpha=0.3)
    if curves:
        right.legend(fontsize=7)
    else:  # ρ_S compares init modes: a sweep that ran one mode has none to compare
        right.text(0.5, 0.5, "one init mode ran:\nno ρ_S to compare", ha="center", va="center", transform=right.transAxes)
    fig.suptitle(title, fontsize=9)
    return render.save(fig, path)
