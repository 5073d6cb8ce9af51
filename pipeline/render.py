"""The one Markdown and figure helper: tables for report.md and the paper report, matplotlib figures on
their own Agg canvas (never pyplot's global state or `matplotlib.use`), saved atomically.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from .atomic_io import atomic_path


def fmt(v: Any, digits: int = 4) -> str:
    """A cell: floats with `digits` decimals (scientific below 1e-3 and from 1e4), None and NaN as '—'."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "—"
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        return f"{v:.{digits}g}" if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4) else f"{v:.{digits}f}"
    return str(v)


def cell(v: Any) -> str:
    """Escape a cell for a Markdown table (pipes, newlines)."""
    return ("" if v is None else str(v)).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 4, align: str | None = None) -> str:
    """A Markdown table; non-string cells go through `fmt`. `align`: one of 'l', 'r', 'c' per column."""
    sep = "|" + "".join({"l": ":---|", "r": "---:|", "c": ":---:|"}.get(a, "---|") for a in (align or "-" * len(header)))
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", sep]
    lines += ["| " + " | ".join(cell(c if isinstance(c, str) else fmt(c, digits)) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def pct(x: float | None, digits: int = 0) -> str:
    return "—" if x is None or x != x else f"{100 * x:.{digits}f}%"


def figure(width: float, height: float, dpi: int = 120):
    """A matplotlib Figure with its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def save(fig, path: str | Path, tight: bool = False, layout: bool = True) -> Path:
    """tight_layout (unless the caller laid the figure out itself: `layout=False`), then an atomic PNG write."""
    path = Path(path)
    if layout:
        fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", **({"bbox_inches": "tight", "pad_inches": 0.1} if tight else {}))
    return path


def value_range(low: Any, high: Any, names: Sequence[str] = (), digits: int = 3) -> str:
    """A data set's valid input range in a sentence: one interval when every input shares it, else the spread of
    the per-feature bounds (how many features, the smallest low, the largest high, and the feature names at the
    extremes when given): never the whole list of per-feature numbers."""
    lo = [float(v) for v in low] if isinstance(low, (list, tuple)) else [float(low)]
    hi = [float(v) for v in high] if isinstance(high, (list, tuple)) else [float(high)]
    if len(set(lo)) == 1 and len(set(hi)) == 1:
        return f"[{lo[0]:.{digits}g}, {hi[0]:.{digits}g}]"
    i, j = min(range(len(lo)), key=lo.__getitem__), max(range(len(hi)), key=hi.__getitem__)
    where = f" ({names[i]}, {names[j]})" if len(names) == len(lo) else ""
    return (f"per feature ({len(lo)} features, raw units): lows from {min(lo):.{digits}g} to {max(lo):.{digits}g}, highs from "
            f"{min(hi):.{digits}g} to {max(hi):.{digits}g}; widest [{lo[i]:.{digits}g}, {hi[j]:.{digits}g}]{where}")
