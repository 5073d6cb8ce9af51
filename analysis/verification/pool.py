"""The property loop's workers (`analysis.verification.harness.run` starts them; the loop itself is described there):
one process's share of the tasks (`_Worker`: problems kept between turns, the first bound pass, a turn), the two ways
of spending time over them (`run_per_task` for per-task limits, `run_rounds` for one stage budget) and the spawned
processes that run them side by side (`run_pool`). `Loop` is what all of them share."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue as queue_mod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from . import first_pass
from .problem import DECISIVE, HARD_GRACE_S, Budget, Overrun, Problem, Result, best_margin, hard_limit
from .registry import get_verifier, one_line
from .tasks import Outcome, PerTask, Plan, StageBudget, Task

ROUND_GROWTH = 4.0  # each StageBudget round multiplies the per-task limit by this
# a task open after a turn gets another only when it can be at least as long as its last. Its Problem is kept, so
# branch and bound goes on from the domains its last turn left and the links before it re-run on kept bounds (the
# attack's probe share is what they cost): any turn adds, and a longer one adds more
MIN_TURN_SHARE = 1.0
# a chunk's first pass may use this share of its properties' limits together (PerTask); α-CROWN over the rows still open
# then this share of what is left (both modes): the rest is each property's own turn
PASS_SHARE = 0.5
ALPHA_SHARE = 0.5


@dataclass(frozen=True)
class Loop:
    """What every part of one run of the loop shares, in this process and in each worker (it pickles): the limits, the
    one deadline and when the run began, both read on `clock` (`Budget.read(clock)` seconds): the clock that turns,
    passes and the run's budget are all measured on; the verifiers' options, the device they compute on and how many
    workers share the tasks."""

    limits: PerTask | StageBudget
    deadline: float
    started: float
    clock: str = "wall"
    options: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    workers: int = 1

    def now(self) -> float:
        return Budget.read(self.clock)

    def here(self) -> "Loop":
        """This loop as a spawned worker reads it: a CPU clock counts each process's own seconds, so a worker's budget
        starts when it does (each worker its whole budget, as every worker has the whole wall budget side by side)."""
        if self.clock == "wall":
            return self
        now = self.now()
        return replace(self, started=now, deadline=now + (self.deadline - self.started))


class _Worker:
    """One process's share of the tasks: their problems (built once, kept between turns, each network's graph read once
    per ONNX file: `FileTask.build`'s cache), the verifiers, and the seconds each task has spent so far (its share of
    the first pass, then its turns): a task's reported time is all of it."""

    def __init__(self, loop: Loop, emit: Callable[[Any], None]):
        self.clock, self.options, self.device, self.emit = loop.clock, loop.options, loop.device, emit
        self.now = loop.now
        self.cache: dict[Any, Any] = {}
        self.problems: dict[int, tuple[Problem, float]] = {}
        self.spent: dict[int, float] = {}
        self.spent_cpu: dict[int, float] = {}  # its turns' CPU seconds (the first pass is timed on the wall clock only)
        self.items: dict[int, list[first_pass.Item]] = {}  # each task's first-pass items (one per input box)

    def verifier(self, task: Task):
        if not isinstance(task.verifier, str):
            return task.verifier
        vkey = ("verifier", task.verifier)
        if vkey not in self.cache:
            self.cache[vkey] = get_verifier(task.verifier, **self.options)
        return self.cache[vkey]

    def problem(self, i: int, task: Task) -> tuple[Problem | None, Result | None]:
        """Task i's Problem (built on first use: its preparation, timed), or the error that building it raised."""
        if i not in self.problems:
            t0 = Budget.read("wall")
            try:
                problem = task.build(self.cache)
            except Exception as e:
                return None, Result("error", 0.0, message=one_line(e))
            problem.device = self.device
            self.problems[i] = (problem, Budget.read("wall") - t0)
        return self.problems[i][0], None

    def deadlines(self, tasks: dict[int, Task], limit: Callable[[Task], float], deadline: float, crown_share: float,
                  alpha_share: float) -> tuple[Callable, Callable, Callable]:
        """The first pass's deadlines (measure, crown, α) for tasks with per-task limits `limit(task)` (∞: none) inside
        one `deadline`: the first property of a network alone within what its limit has left; the batched passes
        within the given shares of what their tasks' limits have left together (and of the time to `deadline`)."""
        now = self.now

        def pooled(share: float) -> Callable[[list[int]], float]:
            def at(indices: list[int]) -> float:
                left = sum(limit(tasks[i]) - self.spent.get(i, 0.0) for i in indices)
                return min(deadline if share >= 1 else now() + share * (deadline - now()), now() + share * left)
            return at

        return (lambda i: min(deadline, now() + limit(tasks[i]) - self.spent.get(i, 0.0))), pooled(crown_share), \
            pooled(alpha_share)

    def prepare(self, i: int) -> float:
        return self.problems.get(i, (None, 0.0))[1]

    def drop(self, i: int) -> None:
        self.problems.pop(i, None)
        self.items.pop(i, None)

    # -- the first pass ----------------------------------------------------------------------
    def first_pass(self, indexed: Sequence[tuple[int, Task]], measure_deadline: Callable[[int], float],
                   crown_deadline: Callable[[list[int]], float], alpha_deadline: Callable[[list[int]], float],
                   note: Callable[[list[first_pass.Cost], float], None],
                   limit: Callable[[Task], float] = lambda task: math.inf) -> list[int]:
        """Every task's first bound pass (`first_pass`), per network: the first property of each network alone and
        timed (until `measure_deadline(its index)`), then `note(costs, seconds the rest are estimated to need)`, then
        the rest batched (until `crown_deadline(their indices)`), then α-CROWN (until `alpha_deadline`). Emits the final
        answer of every task the pass decided within its `limit`, and of every task that could not be built; returns
        the indices still open."""
        groups: dict[Any, list[tuple[int, Task]]] = {}
        for i, task in indexed:
            if task.known is not None:
                self.emit(Outcome(i, task.key, task.known, 0.0))
                continue
            problem, error = self.problem(i, task)
            if error is not None:
                self.emit(Outcome(i, task.key, error, 0.0))
                continue
            groups.setdefault(task.network_key(), []).append((i, task))
        items: dict[Any, list[first_pass.Item]] = {}
        for g, members in groups.items():
            items[g] = [it for i, task in members for it in self._items(i, task)]
        costs: list[first_pass.Cost] = []
        began = self.now()
        for g, members in groups.items():
            if items[g]:
                costs += first_pass.measure(items[g], lambda it: measure_deadline(it.index), members[0][1].network_label(),
                                            self.clock)
        note(costs, sum(c.seconds * (c.properties - 1) for c in costs))
        for primary in (True, False):  # the properties' own networks first, another network's bounds after
            for g, members in groups.items():
                mine = [it for it in items[g] if it.primary == primary and not it.tried]
                if mine:
                    first_pass.crown(mine, crown_deadline(sorted({it.index for it in mine})), self.clock)
        every = [it for g in groups for it in items[g]]
        note(costs, 0.0, first_pass.reached(every), len(every), self.now() - began, began)
        at = alpha_deadline([i for members in groups.values() for i, _ in members])  # one share for all networks
        for g in groups:
            first_pass.alpha(items[g], at, self.clock)
        tasks = dict(indexed)
        still = []
        for g, members in groups.items():
            for i, _ in members:
                mine = self.items.get(i, [])
                for it in mine:
                    self.spent[i] = self.spent.get(i, 0.0) + it.seconds
                    it.seconds = 0.0
                if not first_pass.decided(mine) or self.spent.get(i, 0.0) > limit(tasks[i]):
                    still.append(i)
                    continue
                problem = self.problems[i][0]
                stage = mine[0].state.stage
                msg = (f"{stage}: unsat ({'; '.join(it.state.verdict() for it in mine)}); the first bound pass, batched "
                       f"over {len({it.index for it in items[g]})} properties of {tasks[i].network_label()}")
                self.emit(Outcome(i, tasks[i].key, Result("unsat", self.spent.get(i, 0.0), message=msg, stage=stage,
                                                           info={**problem.info, "first_pass": True}), self.prepare(i)))
                self.drop(i)
        return still

    def _items(self, i: int, task: Task) -> list[first_pass.Item]:
        """Task i's first-pass items: its verifier's bound-pass state per input box (none when it computes no bounds, or
        when building the state fails: its turn then meets the same error and reports it)."""
        problem = self.problems[i][0]
        verifier = self.verifier(task)
        mine = []
        t0 = Budget.read("wall")
        try:
            for k in range(len(problem.specs)):
                problem.check_shapes(k)
                st = verifier.bound_pass(problem, k)
                if st is None:
                    return []
                st.alpha = verifier.alpha_pass()
                mine.append(first_pass.Item(i, problem, k, st))
        except Exception:
            return []
        if mine:
            mine[0].seconds += Budget.read("wall") - t0  # the states' interval bounds
            self.items[i] = mine
        return mine

    # -- a turn ------------------------------------------------------------------------------
    def solve(self, i: int, task: Task, seconds: float, limit: float = math.inf) -> Result:
        """One turn of task i with `seconds` (its problem kept: the bounds and open domains of earlier turns go on);
        the time reported is all the task has spent. A turn past its time by `problem.HARD_GRACE_S` is stopped from
        outside (`problem.hard_limit`); its message names the turn's time, what came before it and the task's `limit`."""
        if task.known is not None:
            return task.known
        problem, error = self.problem(i, task)
        if error is not None:
            return error
        verifier = self.verifier(task)
        t0, c0 = Budget.read("wall"), Budget.read("cpu")
        try:
            with hard_limit(seconds, self.clock):
                result = verifier.run(problem, Budget(seconds, self.clock))
        except Overrun:
            result = Result("timeout", Budget.read("wall") - t0, message=f"{verifier.name}: {self.overrun(i, seconds, limit)}",
                            cpu_seconds=Budget.read("cpu") - c0, info=dict(problem.info))
        if result.status not in DECISIVE and result.status != "error" and result.seconds > seconds:
            result = replace(result, status="timeout")
        before, cpu = self.spent.get(i, 0.0), self.spent_cpu.get(i, 0.0)
        self.spent[i], self.spent_cpu[i] = before + result.seconds, cpu + result.cpu_seconds
        return replace(result, seconds=self.spent[i], cpu_seconds=self.spent_cpu[i])

    def overrun(self, i: int, seconds: float, limit: float) -> str:
        """Why a turn was stopped from outside, in the times that applied: the turn's own, what the task spent before it
        (its share of the first bound pass, earlier turns) and its whole limit."""
        before = self.spent.get(i, 0.0)
        whole = f"; its limit: {limit:.3g} s" if math.isfinite(limit) else ""
        return (f"stopped from outside {HARD_GRACE_S:g} s after its turn of {seconds:.3g} s ran out (after {before:.3g} s "
                f"spent before the turn{whole})")

    def unrun(self, i: int, task: Task, why: str) -> Result:
        """A timeout for a task that gets no turn (or no further one), saying why, with what its bounds found so far
        (the last pass that finished, its margin bound)."""
        problem = self.problems.get(i, (None, 0.0))[0]
        info = dict(problem.info) if problem is not None else {}
        margin, which = best_margin(info)
        bound = f" (its bounds: {which}, margin bound {margin:.4g})" if margin is not None else ""
        return Result("timeout", self.spent.get(i, 0.0), message=f"not run: {why}{bound}", info=info)


def closeness(result: Result | None, problem: Problem | None = None) -> float:
    """How near a property came to a decision (for the order of later rounds): its margin's lower bound (branch and
    bound's over its open domains, once it has run); a tie comes last."""
    info = result.info if result is not None else (problem.info if problem is not None else {})
    if info.get("tie"):  # the box reaches the unsafe set: no bound can decide it, only a strict point found
        return math.inf
    v = best_margin(info)[0]  # branch and bound's global lower bound, once it has one and it is the higher
    return -float(v) if v is not None and math.isfinite(float(v)) else math.inf


def _plan_note(note: Callable[[Plan], None] | None, loop: Loop, limit: float | None = None) -> Callable[..., None]:
    """`send(costs, rest)` before the pass goes on; `send(costs, 0.0, reached, properties, pass_seconds, began)` after
    it (`began`: when the pass began, on the loop's clock)."""
    def send(costs: list[first_pass.Cost], rest: float, reached: int | None = None, properties: int = 0,
             pass_seconds: float = 0.0, began: float = 0.0) -> None:
        if note is None or not costs:
            return
        started, workers = loop.started, loop.workers
        now = loop.now()
        needed = now - started + rest
        if reached is not None and reached < properties:  # extrapolated from the pass's own rate
            needed = began - started + pass_seconds * properties / max(reached, 1)
        note(Plan(costs, round(now - started, 3), round(needed, 3), workers, limit, os.getpid(), reached, properties,
                  round(pass_seconds, 3)))
    return send


def run_per_task(chunks: Iterable[list[tuple[int, Task]]], loop: Loop, emit: Callable[[Outcome], None],
                 note: Callable[[Plan], None] | None = None) -> None:
    """Per-task limits (`PerTask`): chunk by chunk, the chunk's first pass, then each open task's one turn within what
    its limit has left."""
    w = _Worker(loop, emit)
    limits, deadline = loop.limits, loop.deadline

    def limit(task: Task) -> float:
        return task.timeout if task.timeout is not None else limits.timeout

    for chunk in chunks:
        tasks = dict(chunk)
        if loop.now() >= deadline:
            for i, task in chunk:
                emit(Outcome(i, task.key, task.known or Result("timeout", 0.0, message="not run: the run's budget was spent"), 0.0))
            continue
        # the first property of a network is measured alone, within its own limit; the rest share PASS_SHARE of theirs
        open_ = w.first_pass(chunk, *w.deadlines(tasks, limit, deadline, PASS_SHARE, ALPHA_SHARE),
                             _plan_note(note, loop, min(limit(task) for _, task in chunk)), limit)
        for i in open_:
            task = tasks[i]
            seconds = min(limit(task) - w.spent.get(i, 0.0), deadline - loop.now())
            if seconds <= 0:
                why = (f"its limit of {limit(task):.3g} s went to its first bound pass, which took {w.spent.get(i, 0.0):.3g} s"
                       if loop.now() < deadline else "the run's budget was spent")
                emit(Outcome(i, task.key, w.unrun(i, task, why), w.prepare(i)))
            else:
                emit(Outcome(i, task.key, w.solve(i, task, seconds, limit(task)), w.prepare(i)))
            w.drop(i)


def run_rounds(indexed: Sequence[tuple[int, Task]], loop: Loop, emit: Callable[[Outcome], None],
               note: Callable[[Plan], None] | None = None) -> None:
    """One stage budget (`StageBudget`): every task's first pass against the one deadline, then rounds of growing
    turns for the open ones, the nearest to a decision first."""
    w = _Worker(loop, emit)
    limits, deadline = loop.limits, loop.deadline
    tasks = dict(indexed)

    def cap(task: Task) -> float:  # a task's own limit within the stage budget (the stage's verify.timeout_s)
        return task.timeout if task.timeout is not None else math.inf

    # the stage's one deadline for the pass of every property (it comes first), each within its own cap
    open_ids = w.first_pass(indexed, *w.deadlines(tasks, cap, deadline, 1.0, ALPHA_SHARE), _plan_note(note, loop),
                            cap)
    # the open ones nearest to a decision first
    open_ids.sort(key=lambda i: closeness(None, w.problems.get(i, (None, 0.0))[0]))
    open_ = [(i, tasks[i]) for i in open_ids]
    last: dict[int, Result] = {}
    ran: dict[int, float] = {}  # each open task's last turn
    limit = limits.first

    def turn(i: int, task: Task, share: float) -> float:  # its next turn at a fair share of what is left
        return min(limit, share, cap(task) - w.spent.get(i, 0.0))

    def worth(i: int, seconds: float) -> bool:
        return seconds > 0 and seconds >= ran.get(i, 0.0) * MIN_TURN_SHARE

    def spent(i: int, task: Task) -> None:  # its time is spent: its last answer is final
        why = (f"its own limit of {cap(task):.3g} s was spent: it took {w.spent.get(i, 0.0):.3g} s" if cap(task) <= w.spent.get(i, 0.0)
               else "the stage budget was spent")
        emit(Outcome(i, task.key, last.get(i) or w.unrun(i, task, why), w.prepare(i)))
        w.drop(i)

    while open_:
        still = []
        queue = list(open_)  # the nearest to a decision first
        while queue:
            left = deadline - loop.now()
            # when what is left cannot give every task in the queue a turn worth having, the farthest from a decision
            # give theirs up, so that the nearest get one (split evenly, the last round's time went to no one)
            while len(queue) > 1 and not worth(queue[-1][0], turn(*queue[-1], left / len(queue))):
                spent(*queue.pop())
            i, task = queue.pop(0)
            seconds = turn(i, task, left / (len(queue) + 1))
            if left <= 0 or not worth(i, seconds):
                spent(i, task)
                continue
            result = w.solve(i, task, seconds, cap(task))
            ran[i] = seconds
            # only a timeout can change with more time: "unknown" means the method ended inside its limit undecided
            final = result.status != "timeout" or task.known is not None
            emit(Outcome(i, task.key, result, w.prepare(i), final))
            if final:
                w.drop(i)
            else:
                last[i] = result
                still.append((i, task))
        still.sort(key=lambda it: closeness(last[it[0]]))
        open_ = still
        limit *= ROUND_GROWTH


def run_pool(indexed: list[tuple[int, Task]], loop: Loop, emit: Callable[[Outcome], None],
             on_plan: Callable[[Plan], None] | None = None) -> None:
    """`loop.workers` spawned processes: per-task limits from a shared queue of chunks, a stage budget dealt
    round-robin; their outcomes and plans passed on here as they come."""
    jobs = loop.workers
    ctx = mp.get_context("spawn")  # fork after torch's thread pools started can hang
    out = ctx.Queue()
    if isinstance(loop.limits, PerTask):
        work = ctx.Queue()
        for chunk in chunks(indexed, jobs):
            work.put(chunk)
        shares = [("queue", work)] * jobs
    else:
        shares = [("rounds", indexed[j::jobs]) for j in range(jobs)]
    procs = [ctx.Process(target=_worker, args=(mode, w, loop, out),
                         daemon=True) for mode, w in shares]
    for p in procs:
        p.start()
    running = len(procs)
    try:
        while running:
            try:
                msg = out.get(timeout=1.0)
            except queue_mod.Empty:
                if not any(p.is_alive() for p in procs):
                    break
                continue
            if isinstance(msg, Outcome):
                emit(msg)
            elif msg[0] == "plan":
                if on_plan is not None:
                    on_plan(msg[1])
            elif msg[0] == "done":
                running -= 1
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


def _worker(mode: str, work: Any, loop: Loop, out: Any) -> None:
    torch.set_num_threads(1)
    loop = loop.here()
    note = lambda plan: out.put(("plan", plan))  # noqa: E731
    try:
        if mode == "queue":
            def pull() -> Iterable[list[tuple[int, Task]]]:
                while True:
                    try:
                        item = work.get_nowait()
                    except queue_mod.Empty:
                        return
                    yield item
            run_per_task(pull(), loop, out.put, note)
        else:
            run_rounds(work, loop, out.put, note)
    except BaseException as e:  # reported to the parent, which fails every task this worker still held
        out.put(("crash", one_line(e)))
    finally:
        out.put(("done", os.getpid()))


def chunks(indexed: Sequence[tuple[int, Task]], jobs: int) -> list[list[tuple[int, Task]]]:
    """Per-task limits: the tasks of each network (in order) cut into `jobs` chunks, so each worker's first pass batches
    a network's properties and the workers share the network's properties between them."""
    groups: dict[Any, list[tuple[int, Task]]] = {}
    for item in indexed:
        groups.setdefault(item[1].network_key() if item[1].known is None else ("known",), []).append(item)
    out = []
    for members in groups.values():
        size = max(1, math.ceil(len(members) / jobs))
        out += [members[j:j + size] for j in range(0, len(members), size)]
    return out
