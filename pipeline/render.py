"""The one Markdown and figure helper: tables for report.md and the paper report, matplotlib figures on
their own Agg canvas (never pyplot's global state or `matplotlib.use`), saved atomically.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from .rundir import atomic_path


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


def save(fig, path: str | Path, tight: bool = False) -> Path:
    """tight_layout, then an atomic PNG write."""
    path = Path(path)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", **({"bbox_inches": "tight", "pad_inches": 0.1} if tight else {}))
    return path
