"""Statistics over seeds for the multi-run tables: mean with a two-sided t-interval."""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95  # two-sided level of every interval in the tables


def mean_ci(xs: Iterable[float]) -> tuple[float, float, float, int]:
    """(mean, sample std, half-width of the 95% t-interval of the mean, n) over seeds; NaNs left out.
    One seed has no spread: std and interval are NaN (shown as no interval, never as ± 0)."""
    a = np.array([x for x in xs if not math.isnan(x)], dtype=np.float64)
    if a.size == 0:
        return math.nan, math.nan, math.nan, 0
    if a.size == 1:
        return float(a[0]), math.nan, math.nan, 1
    sd = float(a.std(ddof=1))
    return float(a.mean()), sd, float(sps.t.ppf(0.5 + CONFIDENCE / 2, a.size - 1) * sd / math.sqrt(a.size)), int(a.size)
