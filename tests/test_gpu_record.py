"""benchmarks.gpu_record reads what gpu.sh brought back: a run that stopped at a failed stage, or a test log cut off
by gpu.sh's time limit, is never recorded as a met goal."""

from __future__ import annotations

import json

from benchmarks import gpu_record
from pipeline.stages import STAGES


def _folder(tmp_path, stages, suite_log):
    (tmp_path / "gpu.json").write_text(json.dumps({"device": "GPU X"}))
    (tmp_path / "stage-seconds.json").write_text(json.dumps({"stages": stages, "total_s": 20.0}))
    (tmp_path / "fast-suite.log").write_text(suite_log)
    return gpu_record.section(tmp_path)


def _goal(sec, part):
    (g,) = [g for g in gpu_record.goals(sec) if part in g["goal"]]
    return g


def test_a_run_with_every_stage_done_in_time_is_met(tmp_path):
    stages = {s: {"seconds": 1.0, "device": "cuda", "status": "done"} for s in STAGES}
    sec = _folder(tmp_path, stages, "....\n1119 passed, 9 skipped in 31.2s\n")
    assert _goal(sec, "every stage")["met"]
    assert _goal(sec, "fast_suite")["met"]


def test_a_run_that_stopped_at_a_failed_stage_is_not_met(tmp_path):
    stages = {"train": {"seconds": 5.2, "status": "done"}, "harden": {"seconds": 5.6, "status": "done"},
              "check": {"seconds": 10.7, "status": "failed"}}
    g = _goal(_folder(tmp_path, stages, ""), "every stage")
    assert not g["met"]
    assert "check (failed)" in g["note"] and "swap (not run)" in g["note"]


def test_a_suite_cut_off_before_its_summary_is_not_met(tmp_path):
    sec = _folder(tmp_path, {}, "........ [ 31%]\n.....ss [ 38%]\nOSError: cannot send (already closed?)\n")
    g = _goal(sec, "fast_suite")
    assert not g["met"] and "cut off" in g["note"]
    failed = _folder(tmp_path, {}, "FAILED tests/a.py::t - x\n1 failed, 7 passed, 1169 deselected in 70.48s (0:01:10)\n")
    assert not _goal(failed, "fast_suite")["met"]
