"""The one property loop (`analysis.verification.harness`): a per-task limit; a stage budget whose rounds give the
time easy properties leave to the hard ones (which a flat limit of the same total would not decide); the final and
provisional outcomes callers write as they arrive; worker processes that answer as one process does; shards."""

from __future__ import annotations

import time

import numpy as np
import pytest

from analysis.verification import harness
from analysis.verification.graph import Graph
from analysis.verification.ops import Linear
from analysis.verification.problem import Budget, Problem
from analysis.verification.registry import Verifier
from analysis.verification.vnnlib import robustness_spec
from pipeline.errors import ConfigError

EASY_S, HARD_S = 0.05, 1.5  # seconds of "work" a task needs before it can answer
FIRST_S = 0.5  # the first round's limit


class Sleepy(Verifier):
    """Answers unsat once it has worked `need` seconds on a property (sleeping: no CPU, so the machine's load does not
    change it); times out when the budget runs out first. Each call starts from scratch."""

    name = "sleepy"

    def __init__(self, need: float):
        self.need = need

    def solve(self, problem: Problem, k: int, budget: Budget):
        end = time.perf_counter() + self.need
        while time.perf_counter() < end:
            if budget.expired():
                return "timeout", None, "worked out of time"
            time.sleep(0.01)
        return "unsat", None, f"decided after {self.need:g} s"


def _spec():
    return robustness_spec(np.zeros(2), 0.1, -1.0, 1.0, 0, 2)


NET = Graph.sequential((2,), [Linear(np.eye(2), np.zeros(2))])


def _tasks(needs):
    return [harness.SpecTask(key=i, verifier=Sleepy(n), net=NET, specs=[_spec()]) for i, n in enumerate(needs)]


NEEDS = [EASY_S] * 6 + [HARD_S] * 2
BUDGET_S = 8.0
# Spawned workers' start (importing torch) under load, counted by the stage budget: 12 s sufficed on the 2-core machine;
# on a 16-core GPU machine running the suite with 8 xdist workers, every process imports torch's CUDA libraries at once.
# The tasks end when decided, so a larger allowance makes the test no slower.
POOL_START_S = 60.0


def test_a_stage_budget_gives_the_time_easy_properties_leave_to_the_hard_ones():
    seen = []
    t0 = time.perf_counter()
    out = harness.run(_tasks(NEEDS), harness.StageBudget(BUDGET_S, first=FIRST_S), on_done=seen.append)
    assert [o.result.status for o in out] == ["unsat"] * len(NEEDS) and all(o.final for o in out)
    assert time.perf_counter() - t0 < BUDGET_S
    hard = [o for o in seen if o.key >= 6]
    assert [o.final for o in hard] == [False, False, True, True]  # a provisional timeout in round 1, then decided
    assert all(o.result.status == "timeout" for o in hard[:2])
    # the same total as a flat limit per property decides none of the hard ones
    flat = harness.run(_tasks(NEEDS), harness.PerTask(BUDGET_S / len(NEEDS)))
    assert [o.result.status for o in flat][6:] == ["timeout", "timeout"]


def test_a_task_that_got_only_its_fair_share_early_gets_what_the_others_leave():
    """The hard task comes first while 20 easy ones are still open: its first turn is its fair share (6 s / 21), too
    short. The easy ones then finish at once, and the time they leave goes to the hard one on a later turn."""
    out = harness.run(_tasks([3 * EASY_S + HARD_S] + [EASY_S] * 20), harness.StageBudget(6.0, first=2.0))
    assert [o.result.status for o in out] == ["unsat"] * 21


class GivesUp(Verifier):
    """An incomplete method: ends undecided at once ("unknown"), whatever its limit; counts its calls."""

    name = "gives-up"
    calls = 0

    def solve(self, problem: Problem, k: int, budget: Budget):
        GivesUp.calls += 1
        return "unknown", None, "bounds too loose"


def test_an_undecided_answer_inside_the_limit_is_final_and_takes_no_share():
    """10 properties an incomplete method cannot decide end after one turn each, so the hard one gets the rest."""
    tasks = _tasks([3 * EASY_S + HARD_S]) + [harness.SpecTask(key=f"u{i}", verifier=GivesUp(), net=NET, specs=[_spec()])
                                              for i in range(10)]
    GivesUp.calls = 0
    out = harness.run(tasks, harness.StageBudget(4.0, first=1.0))
    assert out[0].result.status == "unsat" and [o.result.status for o in out[1:]] == ["unknown"] * 10
    assert GivesUp.calls == 10


def test_a_spent_budget_finalizes_every_task():
    out = harness.run(_tasks([HARD_S] * 3), harness.StageBudget(1.0, first=0.3))
    assert all(o.final and o.result.status == "timeout" for o in out)


def test_per_task_limits_and_known_answers():
    from analysis.verification.problem import Result

    tasks = _tasks([EASY_S, HARD_S])
    tasks[1].timeout = 0.2
    tasks.append(harness.SpecTask(key="known", known=Result("sat", 0.0, stage="clean")))
    out = harness.run(tasks, harness.PerTask(5.0))
    assert [o.result.status for o in out] == ["unsat", "timeout", "sat"] and out[2].result.stage == "clean"
    assert out[1].result.seconds < 1.0


def test_worker_processes_answer_as_one_process_does():
    """Rounds dealt to two spawned workers (the per-task queue is exercised by `pipeline vnncomp --jobs 2`). The stage
    budget's clock starts before the workers import torch, which took most of BUDGET_S on this 2-core machine while
    another test ran: POOL_START_S more keeps the comparison about the rounds (the tasks end when decided, not later)."""
    limits = harness.StageBudget(BUDGET_S + POOL_START_S, first=FIRST_S)
    one = harness.run(_tasks(NEEDS[4:]), limits)
    two = harness.run(_tasks(NEEDS[4:]), limits, jobs=2)
    assert [(o.key, o.result.status) for o in two] == [(o.key, o.result.status) for o in one]


def test_shards_are_disjoint_and_cover():
    items = list(range(11))
    parts = [harness.shard(items, f"{k}/3") for k in range(3)]
    assert sorted(i for p in parts for i in p) == items and parts[1] == [1, 4, 7, 10]
    for bad in ("3/3", "-1/2", "a/b", "1"):
        with pytest.raises(ConfigError, match="K/N"):
            harness.shard(items, bad)


def test_summarize_groups_in_first_seen_order():
    rows = [{"v": "a", "result": "unsat", "seconds": 1.0, "stage": "crown"},
            {"v": "a", "result": "sat", "seconds": 0.0, "stage": "clean"},
            {"v": "b", "result": "timeout", "seconds": 4.0, "stage": "bab"},
            {"v": "a", "result": "sat", "seconds": 3.0, "stage": "pgd"}]
    a, b = harness.summarize(rows, ("v",))
    assert (a["v"], a["properties"], a["unsat"], a["sat"], a["misclassified"]) == ("a", 3, 1, 2, 1)
    assert a["median_seconds"] == 2.0 and a["decided_fraction"] == 1.0 and b["decided_fraction"] == 0.0


def test_a_wall_budget_over_all_tasks_cuts_the_last_ones_and_names_them():
    """PerTask(wall_s=): no task runs past the run's budget, and a task not begun by then is a timeout that says so."""
    t0 = time.perf_counter()
    out = harness.run(_tasks([0.4] * 5), harness.PerTask(5.0, wall_s=1.0))
    took = time.perf_counter() - t0
    assert [o.result.status for o in out[:2]] == ["unsat", "unsat"]
    assert out[2].result.status == "timeout" and "not run" not in out[2].result.message  # begun with 0.2 s left
    assert all(o.result.status == "timeout" and "not run" in o.result.message for o in out[3:])
    assert took < 1.0 + 0.5
