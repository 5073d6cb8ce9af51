"""How many threads a run may use on a shared machine: the cores other work keeps busy now, sampled from /proc/stat
(`threads=0`, the default, in `pipeline.runner`; benchmarks/CONTENTION.md measured why)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def busy_cores(window: float = 0.5) -> float | None:
    """How many cores other work keeps busy right now: /proc/stat's non-idle share over `window` seconds, times
    the core count (None where /proc/stat is not there). The load average would remember a job that just ended."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        t0, i0 = sample()
        time.sleep(window)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (1 - (i1 - i0) / max(t1 - t0, 1)) * (os.cpu_count() or 1)


def choose_threads(threads: int) -> int:
    """`threads`, or for 0 the cores this process may use minus the cores other work keeps busy now (at least 1):
    on 2 cores with another job running, two threads would wait on each other at every parallel region."""
    if threads:
        return threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    busy = busy_cores()
    if busy is None:
        busy = os.getloadavg()[0]
    return max(1, min(cores, int(cores - busy + 0.5)))
