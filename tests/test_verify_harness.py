"""The one property loop (`analysis.verification.harness`): a per-task limit; a stage budget whose rounds give the
time easy properties leave to the hard ones (which a flat limit of the same total would not decide); the final and
provisional outcomes callers write as they arrive; worker processes that answer as one process does; shards."""

from __future__ import annotations

import time

import numpy as np
import pytest

from analysis.verification import harness
from analysis.verification.graph import Graph
from analysis.verification.ops.affine import Linear
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


class Resumable(Verifier):
    """Answers unsat once it has worked `need` seconds on a property over all its turns (the work done is kept in the
    Problem, as branch and bound keeps its open domains); its margin bound is minus the work still to do."""

    name = "resumable"

    def __init__(self, need: float):
        self.need = need

    def solve(self, problem: Problem, k: int, budget: Budget):
        while problem.cache.get("done", 0.0) < self.need:
            problem.info["margin_lb"] = problem.cache.get("done", 0.0) - self.need
            if budget.expired():
                return "timeout", None, "worked out of time"
            time.sleep(0.01)
            problem.cache["done"] = problem.cache.get("done", 0.0) + 0.01
        return "unsat", None, f"decided after {self.need:g} s"


def test_the_last_rounds_time_goes_to_the_task_nearest_a_decision():
    """Three tasks each get 0.2 s, then 0.8 s; the 1.3 s left is a fair share of 0.43 s each, shorter than their last
    turns. The two farthest from a decision give theirs up, and the nearest gets all of it and needs 0.2 s (given in
    order, nearest first, a turn only when 1.5 times the last, it went to the farthest, which needs 3 s)."""
    tasks = [harness.SpecTask(key=k, verifier=Resumable(n), net=NET, specs=[_spec()])
             for k, n in (("far", 3.0), ("near", 1.2), ("farther", 4.0))]
    out = harness.run(tasks, harness.StageBudget(4.3, first=0.2))
    assert [o.result.status for o in out] == ["timeout", "unsat", "timeout"]


def test_nearness_reads_branch_and_bounds_lower_bound_first_and_puts_a_tie_last():
    from analysis.verification import pool
    from analysis.verification.problem import Result

    near = pool.closeness
    assert near(Result("timeout", 1.0, info={"margin_lb": -2.0, "bab_lower": -0.5})) == 0.5
    assert near(Result("timeout", 1.0, info={"margin_lb": -2.0})) == 2.0
    assert near(Result("timeout", 1.0, info={"margin_lb": -0.1, "tie": True})) == float("inf")
    assert near(Result("timeout", 1.0)) == float("inf")


def test_the_best_margin_is_the_higher_of_the_last_pass_and_branch_and_bounds_global_lower_bound():
    """details.csv, the report and api.verify read one value: branch and bound's global lower bound where it rose above
    the root pass's (a search of thousands of domains is not hidden behind its root), else the pass's, named."""
    from analysis.verification.problem import best_margin

    assert best_margin({"margin_lb": -3.42, "bound": "alpha-crown", "bab_lower": -2.19}) == (-2.19, "bab")
    assert best_margin({"margin_lb": -1.0, "bound": "crown", "bab_lower": -1.5}) == (-1.0, "crown")
    assert best_margin({"margin_lb": 0.7, "bound": "crown"}) == (0.7, "crown")
    assert best_margin({}) == (None, "")


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


def test_a_cpu_clock_budget_counts_the_work_not_the_waiting():
    """One stage budget on the two clocks: Sleepy's tasks wait (sleep) rather than compute, so 1 s of wall runs out
    before the hard ones are decided, while 1 s of this process's CPU does not (the loop's own work is a small part of
    it). So a loaded machine, which stretches the wall time of the same work, leaves a CPU budget's answers as they are."""
    needs = [EASY_S] * 2 + [HARD_S] * 2
    wall = harness.run(_tasks(needs), harness.StageBudget(1.0, first=FIRST_S))
    assert [o.result.status for o in wall] == ["unsat", "unsat", "timeout", "timeout"]
    cpu = harness.run(_tasks(needs), harness.StageBudget(1.0, first=FIRST_S), clock="cpu")
    assert [o.result.status for o in cpu] == ["unsat"] * 4
    assert sum(o.result.seconds for o in cpu) >= 2 * HARD_S  # reported seconds stay wall seconds
    two = harness.run(_tasks(needs), harness.StageBudget(1.0, first=FIRST_S), clock="cpu", jobs=2)
    assert [o.result.status for o in two] == ["unsat"] * 4


def test_a_spawned_worker_counts_a_cpu_budget_from_its_own_start():
    """A CPU clock reads each process's own seconds: a worker's deadline is its start plus the whole budget (the
    parent's clock, far ahead after a long test session, would give it none or too much); the wall clock is shared."""
    from analysis.verification.pool import Loop

    cpu = Loop(harness.StageBudget(5.0), deadline=1e6 + 5.0, started=1e6, clock="cpu").here()
    assert cpu.started <= Budget.read("cpu") and cpu.deadline - cpu.started == pytest.approx(5.0)
    wall = Loop(harness.StageBudget(5.0), deadline=123.0, started=118.0)
    assert wall.here() is wall


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


# ---------------------------------------------------------------------------------------------
# the first bound pass, the attack as a probe, limits held from outside, why a property is open


def _relu_net(seed: int = 0, width: int = 24):
    from analysis.verification.ops.relu import ReLU

    rng = np.random.default_rng(seed)
    return Graph.sequential((6,), [Linear(rng.normal(size=(width, 6)), rng.normal(size=width) * 0.1), ReLU(width),
                                   Linear(rng.normal(size=(width, width)) / 4, np.zeros(width)), ReLU(width),
                                   Linear(rng.normal(size=(3, width)), np.zeros(3))])


def _robustness_tasks(net, verifier="auto", radii=(1e-3, 0.03, 0.3, 1.0), n=6, seed=1):
    xs = np.random.default_rng(seed).normal(size=(n, 6))
    tasks = []
    for k, x in enumerate(xs):
        label = int(np.argmax(net.forward(x).numpy()))
        for eps in radii:
            tasks.append(harness.SpecTask(key=(k, eps), verifier=verifier, net=net,
                                          specs=[robustness_spec(x, eps, -10.0, 10.0, label, 3)]))
    return tasks


def test_the_first_pass_gives_the_verdicts_of_each_property_on_its_own_and_answers_what_it_decides():
    """The loop's answers (first pass batched over the network's properties, then turns) are each property's own
    verifier's answers on it alone; those the bounds decide come from the first pass, the rest from their turns."""
    from analysis.verification.problem import Problem as P
    from analysis.verification.registry import get_verifier

    net = _relu_net()
    tasks = _robustness_tasks(net)
    alone = [get_verifier("auto").run(P(t.specs, network=net), Budget(30.0)).status for t in tasks]
    assert {"sat", "unsat"} <= set(alone) and "timeout" not in alone
    plans = []
    for limits in (harness.StageBudget(60.0), harness.PerTask(30.0)):
        out = harness.run(tasks, limits, on_plan=plans.append)
        assert [o.result.status for o in out] == alone
        passed = [o for o in out if o.result.info.get("first_pass")]
        assert passed and all(o.result.status == "unsat" and "first bound pass" in o.result.message for o in passed)
        # every property got its pass; on a loaded machine a property's turn can go on past α-CROWN to the MILP
        assert all(o.result.info.get("bound") in ("crown", "alpha-crown", "alpha-milp") for o in out)
    assert [c.properties for c in plans[0].costs] == [len(tasks)] and all(c.finished for c in plans[0].costs)


def _slow_crown(seconds: float):
    """Bounder.crown that takes `seconds` more (sleeping in steps, looking at its budget as the real one does)."""
    from analysis.verification.bounds import Bounder

    real = Bounder.crown

    def crown(b):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            if b.expired():
                return
            time.sleep(0.005)
        real(b)
    return crown


def test_a_budget_that_cannot_cover_one_pass_per_property_says_so_and_each_open_property_says_budget(monkeypatch):
    """12 properties (radius 0.1: interval bounds decide none) whose CROWN pass takes 0.25 s each under a 1.5 s stage
    budget: the measured cost names the budget that would cover them (about 3 s); a property whose pass did not finish
    is open with reason "budget" and its interval margin bound, one whose pass finished is decided or says "timeout"."""
    from analysis.verification.bounds import Bounder
    from analysis.verification.problem import open_reason

    monkeypatch.setattr(Bounder, "crown", _slow_crown(0.25))
    net = _relu_net()
    tasks = _robustness_tasks(net, radii=(0.1,), n=12)
    plans = []
    t0 = time.perf_counter()
    out = harness.run(tasks, harness.StageBudget(1.5), on_plan=plans.append)
    assert time.perf_counter() - t0 < 1.5 + 1.0
    estimate, after = plans  # before the pass went on, and after it
    need = harness.shortfall([estimate], harness.StageBudget(1.5))
    assert need is not None and 0.25 * len(tasks) <= need <= 0.25 * len(tasks) + 1.0
    assert harness.shortfall([estimate], harness.StageBudget(need + 0.1)) is None
    assert after.reached < after.properties == len(tasks)  # the pass itself says it fell short, extrapolated alike
    assert 0.25 * len(tasks) <= harness.shortfall(plans, harness.StageBudget(1.5)) <= 0.25 * len(tasks) + 1.0
    assert out.first_pass.plans == plans and len(out.first_pass.lines) == 1  # one sentence for the run, returned
    assert out.first_pass.lines[0].startswith("budget_s=1.5 cannot cover one bound pass per property")
    assert not out.first_pass.record()["covered"]
    bound = [o.result.info["bound"] for o in out]
    assert 2 <= sum(b != "ibp" for b in bound) <= 7
    for o, b in zip(out, bound):
        why = open_reason(o.result)
        assert o.result.info.get("margin_lb") is not None
        assert why == ("budget" if b == "ibp" else "" if o.result.status in ("sat", "unsat") else "timeout"), o.result


def test_the_budget_sentence_per_task_is_said_once_per_network_it_does_not_cover():
    """Per-task limits (api.verify, vnncomp): a network whose pass costs more than `PASS_SHARE` of the limit is named once,
    however many of its chunks report, with the limit that would cover it; a network the limit covers is not named."""
    import math

    from analysis.verification.first_pass import Cost

    said = []
    fp = harness.FirstPass(harness.PerTask(0.4), "--timeout ", 4, said.append)
    slow = harness.Plan([Cost("a.onnx", 0.3, True, 2)], 0.3, 0.6, 1, limit=0.4)
    fp(slow)
    fp(slow)
    fp(harness.Plan([Cost("b.onnx", 0.1, True, 2)], 0.5, 0.6, 1, limit=0.4))  # 0.1 s under PASS_SHARE of 0.4 s
    assert said == fp.lines and len(said) == 1, said
    assert said[0].startswith("--timeout 0.4 cannot cover one bound pass per property: one CROWN pass took 0.3 s on a.onnx")
    assert f"--timeout {math.ceil(0.3 / harness.PASS_SHARE)} would cover it" in said[0]
    assert fp.slowest == 0.3


def _seconds_in(message: str, after: str) -> float:
    import re

    m = re.search(re.escape(after) + r"\s*([0-9.e+-]+) s", message)
    assert m, (after, message)
    return float(m.group(1))


def test_a_property_whose_limit_went_to_its_first_pass_says_which_limit_and_how_long_the_pass_took(monkeypatch):
    """A CROWN pass of 0.8 s under a per-property limit of 0.5 s: the property is not run, and its message names the
    limit that applied (0.5 s) and the pass's seconds, which are the row's seconds."""
    from analysis.verification.bounds import Bounder

    monkeypatch.setattr(Bounder, "crown", _slow_crown(0.8))
    net = _relu_net()
    out = harness.run(_robustness_tasks(net, radii=(0.1,), n=1), harness.PerTask(0.5))
    r = out[0].result
    assert r.status == "timeout" and r.message.startswith("not run: its limit of 0.5 s went to its first bound pass"), r.message
    assert _seconds_in(r.message, "which took") == pytest.approx(r.seconds, abs=SAID_S)


SAID_S = 5e-3  # a message's seconds are written to 3 significant digits


def test_the_attack_is_a_probe_that_never_starves_the_bound():
    """An attack that would run far past the limit (10⁶ steps) before a bound that proves the property at once: inside
    the chain it gets its share of the limit, and the bound answers within the limit."""
    from analysis.verification.problem import Problem as P
    from analysis.verification.registry import get_verifier
    from analysis.verification.pgd_verifier import ATTACK_SHARE

    net = _relu_net()
    task = _robustness_tasks(net, radii=(1e-3,), n=1)[0]
    limit = 2.0
    r = get_verifier("pgd+crown", steps=10 ** 6).run(P(task.specs, network=net), Budget(limit))
    assert r.status == "unsat" and r.stage == "crown" and r.seconds < limit
    assert r.info["stage_seconds"]["pgd"] <= ATTACK_SHARE * limit + 0.1


class Stubborn(Verifier):
    """Ignores its budget: works `need` seconds in one call that never looks at the clock."""

    name = "stubborn"

    def __init__(self, need: float, busy: bool):
        self.need, self.busy = need, busy

    def solve(self, problem: Problem, k: int, budget: Budget):
        if self.busy:  # pure Python
            end = time.perf_counter() + self.need
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(self.need)
        return "unsat", None, "worked past its limit"


@pytest.mark.parametrize("busy", [False, True])
def test_every_limit_holds_within_a_second_even_for_work_that_ignores_it(busy):
    from analysis.verification.problem import HARD_GRACE_S

    tasks = [harness.SpecTask(key=i, verifier=Stubborn(5.0, busy), net=NET, specs=[_spec()]) for i in range(2)]
    t0 = time.perf_counter()
    out = harness.run(tasks, harness.PerTask(0.3))
    took = time.perf_counter() - t0
    assert [o.result.status for o in out] == ["timeout", "timeout"] and "stopped from outside" in out[0].result.message
    for o in out:  # the times said are the ones that applied: its turn's, what came before it, its limit
        said = o.result.message
        assert _seconds_in(said, "its limit:") == 0.3, said
        assert _seconds_in(said, "after its turn of") + _seconds_in(said, "(after") <= 0.3 + SAID_S, said
    assert all(o.result.seconds <= 0.3 + HARD_GRACE_S + 0.2 for o in out) and took < 2 * (0.3 + 1.0)
    out = harness.run(tasks[:1], harness.StageBudget(0.6, first=0.3))
    assert out[0].result.status == "timeout" and time.perf_counter() - t0 - took < 0.6 + 1.0
    import torch

    assert torch.is_grad_enabled()


def test_a_stage_budget_keeps_each_tasks_own_cap():
    """`Task.timeout` inside a stage budget (the stage's verify.timeout_s) caps each task's time in all: the hard tasks
    time out at their cap although the budget would have given them the time to decide."""
    tasks = _tasks([EASY_S, HARD_S, HARD_S])
    for t in tasks:
        t.timeout = 0.4
    out = harness.run(tasks, harness.StageBudget(6.0, first=0.3))
    assert [o.result.status for o in out] == ["unsat", "timeout", "timeout"]
    assert all(o.result.seconds <= 0.4 + 0.1 for o in out)
