"""Progress of a long stage: tqdm's bar on a terminal; without one (a log file, a batch job) tqdm is silent, so
lines go to the log instead: one per step, or at most one every `every_s` seconds, and always the last. Every
stage that runs for more than a few seconds reports through this (train, check, sparsity; verify can too).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from tqdm import tqdm


def lines_to_log() -> bool:
    """Whether progress goes to the log as lines: stderr is not a terminal (tqdm draws its bar only on one)."""
    return not sys.stderr.isatty()


class Progress:
    """`total` steps of one task. `step(line=...)` advances the bar; without a terminal the line goes to `log`
    (at most every `every_s` seconds, and for the last step). `active=False` (a non-main rank) shows nothing."""

    def __init__(self, desc: str, total: int, unit: str = "it", log: Callable[[str], None] = print, active: bool = True,
                 every_s: float = 0.0):
        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=None if active else True, leave=True)
        self.total, self.done = total, 0
        self.active, self.lines = active, active and lines_to_log()
        self.log, self.every_s = log, every_s
        self.last = -float("inf")

    def step(self, n: int = 1, line: str | None = None, **postfix: Any) -> None:
        self.done += n
        self.bar.update(n)
        if postfix:
            self.bar.set_postfix(**postfix)
        now = time.monotonic()
        if self.lines and line is not None and (now - self.last >= self.every_s or self.done >= self.total):
            self.log(line)
            self.last = now

    def note(self, line: str) -> None:
        """A line that must be seen whatever the step: above the bar on a terminal, else to the log."""
        if not self.active:
            return
        if self.lines or self.bar.disable:
            self.log(line)
        else:
            self.bar.write(line)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
