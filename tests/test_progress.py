"""Progress of long stages: without a terminal, lines go to the log (one per step or at most one every
`every_s` seconds, and always the last); the check stage reports its batches through it."""

from __future__ import annotations

import torch
from torch import nn

from analysis import bounds_check as check
from pipeline import progress
from pipeline.activations import LambdaGELU
from pipeline.data import Split


def test_lines_are_throttled_but_the_last_always_comes(monkeypatch):
    monkeypatch.setattr(progress, "lines_to_log", lambda: True)
    lines: list[str] = []
    clock = iter([0.0, 1.0, 2.0, 6.0, 7.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with progress.Progress("t", 5, log=lines.append, every_s=5.0) as p:
        for i in range(1, 6):
            p.step(line=f"step {i}")
    assert lines == ["step 1", "step 4", "step 5"]  # at 0 s, at 6 s (≥ 5 s later), and the last


def test_an_inactive_progress_writes_nothing(monkeypatch):
    monkeypatch.setattr(progress, "lines_to_log", lambda: True)
    lines: list[str] = []
    with progress.Progress("t", 2, log=lines.append, active=False) as p:
        p.step(line="a")
        p.step(line="b")
    assert lines == []


def test_the_check_stage_reports_its_batches(capsys):
    g = LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1)
    g.freeze(torch.tensor([160.0]))
    net = nn.Sequential(nn.Linear(4, 8), g, nn.Linear(8, 2))
    x = torch.randn(50, 4)
    split = Split(x, torch.zeros(50, dtype=torch.long))
    check.empirical_check(net, split, 20, "cpu", 1e-3, 3.0, 1e-9, progress="check v")
    check.swap_certificate(net, split, 20, x[:1], progress="check v")
    out = capsys.readouterr().out  # stderr is no terminal under pytest: progress goes to the log
    assert "check v: per-layer statistics, batch 1/3" in out and "check v: per-layer statistics, batch 3/3" in out
    assert "check v: swap certificate, batch 1/3" in out and "check v: swap certificate, batch 3/3" in out
