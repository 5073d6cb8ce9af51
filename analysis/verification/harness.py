"""The one property loop: the verify stage, `analysis.api.verify` and `pipeline vnncomp` all answer their
properties here.

A `Task` is one property: how to build its `Problem` (the preparation: reading the network, parsing the property,
starting onnxruntime; timed as ``prepare_time``) and the verifier that answers it. Where the time goes, in every mode
(the time goes where it decides):

1. **The first bound pass** (`first_pass`): every property a worker holds gets one CROWN pass before any property
   gets anything else, the properties of one network batched into one call, then α-CROWN on the rows still open
   where there is time (`ALPHA_SHARE` of what is left). The pass of each network's first property runs alone and is
   timed; `on_plan` receives those costs (`Plan`) and `shortfall` says which limit would cover one pass per property
   when the one given does not. A property the pass decides is answered at once.
2. **Each open property's own turns**: its verifier's chain, whose bound links find the pass's bounds computed; the
   attack is a probe with its own small share (`verifiers.ATTACK_SHARE`); then α-CROWN where the pass did not run it,
   then branch and bound, the properties nearest to a decision (the largest margin bound) first.

Two ways to spend time:

- `PerTask`: each task gets its own limit (VNN-COMP's per-instance timeout). Its share of its chunk's batched pass
  counts against it: a chunk (a network's tasks, cut into one chunk per job) may spend `PASS_SHARE` of its tasks'
  limits together on the pass, and the first task's measured pass no more than its own limit. With several jobs,
  each worker takes the next chunk from a shared queue.
- `StageBudget`: one wall-clock budget for all tasks; the pass for all of them comes first, against the one
  deadline. Then rounds: every open task gets `first` seconds, then ×4 per round, capped by its fair share of what
  is left (time left / tasks still open), the nearest to a decision (branch and bound's global lower bound, else the
  margin bound) first; a task is final when it is decided or its method ended undecided inside its limit
  ("unknown"), or when no turn at least `MIN_TURN_SHARE` times its last is left to give it. When the fair share is
  too short for every open task, the farthest from a decision give their turns up to the nearest. Easy properties
  finish in the first round and the time they leave goes to the hard ones. A task keeps its Problem between rounds
  in its worker, so the bounds computed once are reused and branch and bound goes on from its open domains. With
  several jobs the tasks are dealt round-robin to the workers, each running its share against the one deadline.

Every limit holds within a second: a turn looks at its `Budget`, and past it by `problem.HARD_GRACE_S` it is
stopped from outside (`problem.hard_limit`). A task's reported seconds are all it spent (its share of the pass and
its turns). Why an open property is open: `problem.open_reason` ("budget": no bound pass finished in its time).

Workers are separate processes (spawned, one torch thread each: the matrices of one property are small, and
processes do not contend for the interpreter); `jobs=1` runs in this process. `on_done(outcome)` is called in
this process for every outcome as it arrives (provisional ones too), so callers can write their files as they go.

`device` ("cpu", "cuda", "cuda:N"; `resolve_device` turns "auto" into one): where every problem's bound passes and
branch and bound compute. On a GPU the worker processes share it (each its own CUDA context); the MILP, the attack's
re-checks and onnxruntime stay on the CPU cores of the worker that asked.

`progress="name"` shows the final answers as they come (`pipeline.progress`): a bar on a terminal, else a line each.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue as queue_mod
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.shards import in_shard, parse_shard

from . import first_pass
from .graph import Graph
from .problem import DECISIVE, HARD_GRACE_S, RESULTS, Budget, Overrun, Problem, Result, best_margin, hard_limit, open_reason
from .readers import read
from .registry import get_verifier, one_line
from .vnnlib import VnnlibSpec, read_vnnlib_all

ROUND_GROWTH = 4.0  # each StageBudget round multiplies the per-task limit by this
# a task open after a turn gets another only when it can be at least as long as its last. Its Problem is kept, so
# branch and bound goes on from the domains its last turn left and the links before it re-run on kept bounds (the
# attack's probe share is what they cost): any turn adds, and a longer one adds more
MIN_TURN_SHARE = 1.0
# a chunk's first pass may use this share of its properties' limits together (PerTask); α-CROWN over the rows still open
# then this share of what is left (both modes): the rest is each property's own turn
PASS_SHARE = 0.5
ALPHA_SHARE = 0.5


# ---------------------------------------------------------------------------------------------
# tasks


@dataclass
class Task:
    """One property. Subclasses say how its Problem is built; `key` identifies it to the caller."""

    key: Any
    verifier: Any = "auto"  # a registry name or chain, or a Verifier
    timeout: float | None = None  # PerTask: this task's limit (None: the default of PerTask)
    known: Result | None = None  # an answer known without solving (a misclassified sample); nothing is built
    network: str = ""  # its network's name in messages (default: the ONNX file's name, or "network")

    def build(self, cache: dict[Any, Any]) -> Problem:
        raise NotImplementedError

    def network_key(self) -> Any:
        """What identifies its network in a worker: the first pass batches the properties of one network."""
        raise NotImplementedError

    def network_label(self) -> str:
        """Its network in one word, for the first pass's costs."""
        raise NotImplementedError


@dataclass
class FileTask(Task):
    """A VNN-COMP instance: an ONNX file and a VNN-LIB file (plain; `vnncomp` gunzips first)."""

    onnx: Path | None = None
    vnnlib: Path | None = None

    def build(self, cache: dict[Any, Any]) -> Problem:
        for p in (self.onnx, self.vnnlib):
            if p is None or not Path(p).is_file():
                raise FileNotFoundError(f"{p} is missing")
        key = ("graph", str(self.onnx))
        if key not in cache:
            cache[key] = read(self.onnx)
        try:
            specs = read_vnnlib_all(self.vnnlib)
        except ValueError as e:
            first = (str(e).strip().splitlines() or [""])[0]
            raise ValueError(f"malformed VNN-LIB: {first} ({Path(self.vnnlib).name})") from None
        problem = Problem(specs, network=cache[key], onnx=Path(self.onnx), vnnlib_path=Path(self.vnnlib))
        skey = ("session", str(self.onnx))
        if skey not in cache:
            from pipeline import onnx_io  # onnxruntime, imported on first use

            cache[skey] = onnx_io.session(self.onnx)
        problem.cache["session"] = cache[skey]
        for k in range(len(specs)):
            problem.check_shapes(k)
        problem.recheck(specs[0].lb)  # onnxruntime's first run belongs to the preparation
        return problem

    def network_key(self) -> Any:
        return ("file", str(self.onnx))

    def network_label(self) -> str:
        return self.network or (Path(self.onnx).name if self.onnx is not None else "network")


@dataclass
class SpecTask(Task):
    """A property in memory: a graph, its specs, and what a counterexample is re-checked on (default: the graph)."""

    net: Graph | None = None
    specs: list[VnnlibSpec] = field(default_factory=list)
    recheck: Callable[[np.ndarray], np.ndarray] | None = None

    def build(self, cache: dict[Any, Any]) -> Problem:
        return Problem(self.specs, network=self.net, recheck=self.recheck)

    def network_key(self) -> Any:
        return ("graph", id(self.net))  # tasks sent to a worker together share their graph there too

    def network_label(self) -> str:
        return self.network or "network"


class ModuleRecheck:
    """Re-checks a candidate on a torch module in float32. Given `load`, a picklable function that builds the module
    again (`functools.partial(pipeline.checkpoint.load_module, path)`), it travels to worker processes as that
    function and loads the model there on first use (a module with closures does not pickle)."""

    def __init__(self, model: torch.nn.Module | None, input_shape: Sequence[int],
                 load: Callable[[], torch.nn.Module] | None = None):
        self.model, self.input_shape, self.load = model, tuple(input_shape), load

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "model": None} if self.load is not None else self.__dict__

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.many(np.asarray(x).reshape(1, -1))[0]

    def many(self, xs: np.ndarray) -> np.ndarray:
        if self.model is None:
            self.model = self.load()
        with torch.no_grad():
            x = torch.as_tensor(np.asarray(xs), dtype=torch.float32).reshape(-1, *self.input_shape)
            return self.model.eval()(x).double().numpy().reshape(len(x), -1)


class OnnxRecheck:
    """Re-checks a candidate in onnxruntime on an ONNX file (picklable; the session starts on first use)."""

    def __init__(self, path: str | Path):
        self.path, self._session = Path(path), None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_session": None}

    def session(self):
        from pipeline import onnx_io  # onnxruntime, imported on first use

        if self._session is None:
            self._session = onnx_io.session(self.path)
        return self._session

    def __call__(self, x: np.ndarray) -> np.ndarray:
        from pipeline import onnx_io

        return onnx_io.forward_flat(self.session(), x)

    def many(self, xs: np.ndarray) -> np.ndarray:
        from pipeline import onnx_io

        return onnx_io.forward_many(self.session(), xs)


# ---------------------------------------------------------------------------------------------
# how time is spent


@dataclass(frozen=True)
class PerTask:
    timeout: float  # for tasks without their own
    # wall seconds for all tasks together (None: no such limit): no task runs past it, one not begun by then is a
    # timeout that says it was not run (a measurement that must end inside another limit, benchmarks/gpu_verify.py)
    wall_s: float | None = None


@dataclass(frozen=True)
class StageBudget:
    seconds: float  # wall clock for every task together
    first: float = 1.0  # the first round's limit per task


@dataclass
class Outcome:
    index: int  # position of the task in the list given
    key: Any
    result: Result
    prepare_seconds: float
    final: bool = True  # False: a StageBudget round that did not decide it; a later outcome replaces it

    def row(self) -> dict[str, Any]:
        """The fields every caller's result row shares (the verify stage's details.csv, `api.verify`'s rows, `pipeline
        vnncomp`'s results.csv): the answer, why it is open, the link that answered, its seconds, the best margin bound
        and what found it, and the verifier's message."""
        res = self.result
        margin, bound = best_margin(res.info)
        return {"result": res.status, "reason": open_reason(res), "stage": res.stage, "seconds": res.seconds,
                "margin_lb": margin, "bound": bound, "message": res.message}


@dataclass(frozen=True)
class Plan:
    """What one worker (`worker`, of `workers`) found about its first pass, twice: before it goes on (`reached` None),
    one CROWN pass of each of its networks on the network's first property, alone (`costs`), and `needed`, the seconds
    since the run began by which its pass for every property is estimated to end (a pass per property at the measured
    cost); and after it (`reached` of its `properties` got a finished pass, in `pass_seconds`), `needed`
    extrapolated from the pass's own rate when it did not reach them all (a batched call can cost more per property
    than one alone). `elapsed`: seconds since the run began when it was sent. `shortfall` reads them."""

    costs: list[first_pass.Cost]
    elapsed: float
    needed: float
    workers: int
    limit: float | None = None  # per-task limits: the smallest limit of the tasks measured
    worker: int = 0
    reached: int | None = None
    properties: int = 0
    pass_seconds: float = 0.0


def latest_plans(plans: Sequence[Plan]) -> list[Plan]:
    """Each worker's latest plan, in the order the workers first reported."""
    return list({p.worker: p for p in plans}.values())


def shortfall(plans: Sequence[Plan], limits: PerTask | StageBudget) -> float | None:
    """The limit that would cover one bound pass per property, when the one given does not (None when it does), from
    each worker's latest plan: for a stage budget the seconds in all; for per-task limits the seconds per property
    whose `PASS_SHARE` covers the costliest pass (a pass that did not finish in the time it had, or a first pass that
    did not reach every property, counts as not covered)."""
    if not plans:
        return None
    latest = latest_plans(plans)
    short = any(p.reached is not None and p.reached < p.properties for p in latest)
    if isinstance(limits, StageBudget):
        need = max(p.needed for p in latest)
        return max(need, limits.seconds) if need > limits.seconds or short else None
    per = [c.seconds for p in plans for c in p.costs]
    per += [p.pass_seconds / p.reached for p in latest if p.reached]
    need = max(per) / PASS_SHARE
    limit = min(limits.timeout if p.limit is None else p.limit for p in latest)
    return need if need > limit or short or not all(c.finished for p in plans for c in p.costs) else None


# ---------------------------------------------------------------------------------------------
# solving one task


BUDGET_ROOM = 1.2  # the budget a short one names: the estimated need with this much room, rounded up to 10 s


class PassWatch:
    """One budget part's first-pass plans as the workers send them, and its budget line said once: when every worker
    has measured (before the passes go on) or every worker's pass has ended (a batch can cost more per property than
    one alone), whichever first shows the budget short."""

    def __init__(self, budget: float, setting: str, properties: int, note: Callable[[str], None]):
        self.budget, self.setting, self.properties, self.note = budget, setting, properties, note
        self.plans: list[Plan] = []
        self.said = False

    def __call__(self, plan: Plan) -> None:
        self.plans.append(plan)
        latest = latest_plans(self.plans)
        if self.said or len(latest) < plan.workers or len({p.reached is None for p in latest}) > 1:
            return
        line = budget_line(self.plans, self.budget, self.setting, self.properties)
        if line:
            self.said = True
            self.note(line)


def budget_line(plans: Sequence[Plan], budget: float, setting: str, properties: int) -> str | None:
    """One line when `setting` (= `budget` seconds) cannot cover one bound pass per property, with the budget that
    would (None when it covers them): the measured cost of one pass of each network, on its first property, or, once
    the pass is over, how many properties it reached."""
    need = shortfall(plans, StageBudget(budget))
    if need is None:
        return None
    costs: dict[str, Any] = {}
    for plan in plans:
        for c in plan.costs:
            if c.network not in costs or c.seconds > costs[c.network].seconds:
                costs[c.network] = c
    each = ", ".join(f"{'≥ ' if not c.finished else ''}{c.seconds:.2g} s on {c.network}" for c in costs.values())
    latest = latest_plans(plans)
    if all(p.reached is not None for p in latest):
        reached, total = sum(p.reached for p in latest), sum(p.properties for p in latest)
        how = (f"the pass reached {reached} of {total} properties in {max(p.pass_seconds for p in latest):.0f} s (one "
               f"CROWN pass took {each} on each network's first property alone)")
    else:
        lower = "at least " if not all(c.finished for c in costs.values()) else ""
        how = (f"one CROWN pass took {each} (each network's first property); {properties} properties on "
               f"{plans[0].workers} worker(s) need {lower}{need:.0f} s for it")
    return (f"    verify: {setting}={budget:g} cannot cover one bound pass per property: {how}; {setting}={would(need)} "
            f"would. The pass runs for every property first; the properties it leaves open without time say `budget` "
            f"in details.csv.")


def pass_record(plans: Sequence[Plan], budget: float, setting: str, properties: int) -> dict[str, Any]:
    """What summary.json keeps of the first pass: each network's measured pass, the estimate (or, once the pass ended
    short, the extrapolation), how many properties it reached, whether the budget covered it, and the line said when it
    did not."""
    costs: dict[str, dict[str, Any]] = {}
    latest = latest_plans(plans)
    for plan in latest:
        for c in plan.costs:
            mine = costs.setdefault(c.network, {"seconds": c.seconds, "finished": c.finished, "properties": 0})
            mine["seconds"] = round(max(mine["seconds"], c.seconds), 4)
            mine["finished"] = mine["finished"] and c.finished
            mine["properties"] += c.properties
    short = shortfall(plans, StageBudget(budget))
    done = [p for p in latest if p.reached is not None]
    return {"setting": setting, "budget_s": budget, "costs": costs,
            "needed_s": round(max((p.needed for p in latest), default=0.0), 2), "covered": short is None,
            "would_s": None if short is None else would(short),
            "reached": sum(p.reached for p in done) if done else None, "passes": sum(p.properties for p in done),
            "line": (budget_line(plans, budget, setting, properties) or "").strip()}


def would(need: float) -> int:
    """The budget a short one names: the need with room, rounded up to 10 s."""
    return math.ceil(need * BUDGET_ROOM / 10) * 10


def resolve_device(name: str, setting: str = "device=") -> str:
    """"auto" | "cpu" | "cuda" | "cuda:N" → the device the verifiers compute on ("auto": a GPU when there is one);
    `pipeline.errors.DeviceError` (one line naming the choices, in the words of `setting`) for anything else or for
    CUDA on a machine without it."""
    from pipeline.devices import resolve

    return str(resolve(str(name), setting=setting))


class _Worker:
    """One process's share of the tasks: their problems (built once, kept between turns, each network's graph read once
    per ONNX file: `FileTask.build`'s cache), the verifiers, and the seconds each task has spent so far (its share of
    the first pass, then its turns): a task's reported time is all of it."""

    def __init__(self, clock: str, options: dict[str, Any], device: str, emit: Callable[[Any], None]):
        self.clock, self.options, self.device, self.emit = clock, options, device, emit
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
        def now() -> float:
            return Budget.read("wall")

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
        began = Budget.read("wall")
        for g, members in groups.items():
            if items[g]:
                costs += first_pass.measure(items[g], lambda it: measure_deadline(it.index), members[0][1].network_label())
        note(costs, sum(c.seconds * (c.properties - 1) for c in costs))
        for primary in (True, False):  # the properties' own networks first, another network's bounds after
            for g, members in groups.items():
                mine = [it for it in items[g] if it.primary == primary and not it.tried]
                if mine:
                    first_pass.crown(mine, crown_deadline(sorted({it.index for it in mine})))
        every = [it for g in groups for it in items[g]]
        note(costs, 0.0, first_pass.reached(every), len(every), Budget.read("wall") - began, began)
        at = alpha_deadline([i for members in groups.values() for i, _ in members])  # one share for all networks
        for g in groups:
            first_pass.alpha(items[g], at)
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


def _closeness(result: Result | None, problem: Problem | None = None) -> float:
    """How near a property came to a decision (for the order of later rounds): its margin's lower bound (branch and
    bound's over its open domains, once it has run); a tie comes last."""
    info = result.info if result is not None else (problem.info if problem is not None else {})
    if info.get("tie"):  # the box reaches the unsafe set: no bound can decide it, only a strict point found
        return math.inf
    v = best_margin(info)[0]  # branch and bound's global lower bound, once it has one and it is the higher
    return -float(v) if v is not None and math.isfinite(float(v)) else math.inf


def _plan_note(note: Callable[[Plan], None] | None, started: float, workers: int, limit: float | None = None
               ) -> Callable[..., None]:
    """`send(costs, rest)` before the pass goes on; `send(costs, 0.0, reached, properties, pass_seconds, began)` after
    it (`began`: when the pass began, on the wall clock)."""
    def send(costs: list[first_pass.Cost], rest: float, reached: int | None = None, properties: int = 0,
             pass_seconds: float = 0.0, began: float = 0.0) -> None:
        if note is None or not costs:
            return
        now = Budget.read("wall")
        needed = now - started + rest
        if reached is not None and reached < properties:  # extrapolated from the pass's own rate
            needed = began - started + pass_seconds * properties / max(reached, 1)
        note(Plan(costs, round(now - started, 3), round(needed, 3), workers, limit, os.getpid(), reached, properties,
                  round(pass_seconds, 3)))
    return send


def _run_per_task(chunks: Iterable[list[tuple[int, Task]]], limits: PerTask, clock: str, options: dict[str, Any],
                  emit: Callable[[Outcome], None], device: str = "cpu", deadline: float = math.inf,
                  note: Callable[[Plan], None] | None = None, started: float = 0.0, workers: int = 1) -> None:
    w = _Worker(clock, options, device, emit)

    def limit(task: Task) -> float:
        return task.timeout if task.timeout is not None else limits.timeout

    for chunk in chunks:
        tasks = dict(chunk)
        if Budget.read("wall") >= deadline:
            for i, task in chunk:
                emit(Outcome(i, task.key, task.known or Result("timeout", 0.0, message="not run: the run's wall budget was spent"), 0.0))
            continue
        # the first property of a network is measured alone, within its own limit; the rest share PASS_SHARE of theirs
        open_ = w.first_pass(chunk, *w.deadlines(tasks, limit, deadline, PASS_SHARE, ALPHA_SHARE),
                             _plan_note(note, started, workers, min(limit(task) for _, task in chunk)), limit)
        for i in open_:
            task = tasks[i]
            seconds = min(limit(task) - w.spent.get(i, 0.0), deadline - Budget.read("wall"))
            if seconds <= 0:
                why = (f"its limit of {limit(task):.3g} s went to its first bound pass, which took {w.spent.get(i, 0.0):.3g} s"
                       if Budget.read("wall") < deadline else "the run's wall budget was spent")
                emit(Outcome(i, task.key, w.unrun(i, task, why), w.prepare(i)))
            else:
                emit(Outcome(i, task.key, w.solve(i, task, seconds, limit(task)), w.prepare(i)))
            w.drop(i)


def _run_rounds(indexed: Sequence[tuple[int, Task]], limits: StageBudget, deadline: float, clock: str,
                options: dict[str, Any], emit: Callable[[Outcome], None], device: str = "cpu",
                note: Callable[[Plan], None] | None = None, started: float = 0.0, workers: int = 1) -> None:
    w = _Worker(clock, options, device, emit)
    tasks = dict(indexed)

    def cap(task: Task) -> float:  # a task's own limit within the stage budget (the stage's verify.timeout_s)
        return task.timeout if task.timeout is not None else math.inf

    # the stage's one deadline for the pass of every property (it comes first), each within its own cap
    open_ids = w.first_pass(indexed, *w.deadlines(tasks, cap, deadline, 1.0, ALPHA_SHARE), _plan_note(note, started, workers),
                            cap)
    # the open ones nearest to a decision first
    open_ids.sort(key=lambda i: _closeness(None, w.problems.get(i, (None, 0.0))[0]))
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
            left = deadline - Budget.read("wall")
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
        still.sort(key=lambda it: _closeness(last[it[0]]))
        open_ = still
        limit *= ROUND_GROWTH


def run(tasks: Sequence[Task], limits: PerTask | StageBudget, *, jobs: int = 1, clock: str = "wall",
        on_done: Callable[[Outcome], None] | None = None, options: dict[str, Any] | None = None,
        device: str = "cpu", progress: str | None = None, label: Callable[[Any], str] = str,
        on_plan: Callable[[Plan], None] | None = None) -> list[Outcome]:
    """Answer every task; returns the final outcome of each, in the order given. `options` go to the verifiers;
    `device` is where they compute ("auto" resolved here). `progress`: a name to show each final answer under
    (`label(key)` names the task in its line). `on_plan(plan)`: each worker's measured cost of one bound pass per
    network, as it comes (before its first pass goes on; `shortfall` says what limit would cover it)."""
    from pipeline.progress import Progress

    options = dict(options or {})
    device = resolve_device(device)
    jobs = max(1, min(int(jobs), len(tasks)))
    if device.startswith("cuda"):  # the workers share the GPU: each plans with its share of the memory
        options.setdefault("sharers", jobs)
    on_done = on_done or (lambda o: None)
    final: dict[int, Outcome] = {}
    bar = Progress(progress, len(tasks), "property") if progress else None

    def emit(o: Outcome) -> None:
        if o.final:
            final[o.index] = o
            if bar is not None:
                bar.step(line=f"    {progress}: {len(final)}/{len(tasks)} {label(o.key)}: {o.result.status} "
                              f"({o.result.seconds:.2f} s{', ' + o.result.stage if o.result.stage else ''})")
        on_done(o)

    indexed = list(enumerate(tasks))
    total = limits.seconds if isinstance(limits, StageBudget) else limits.wall_s
    started = Budget.read("wall")
    deadline = started + (math.inf if total is None else total)
    if jobs == 1:
        if isinstance(limits, StageBudget):
            _run_rounds(indexed, limits, deadline, clock, options, emit, device, on_plan, started, 1)
        else:
            _run_per_task(_chunks(indexed, 1), limits, clock, options, emit, device, deadline, on_plan, started, 1)
    else:
        _run_pool(indexed, limits, jobs, deadline, clock, options, emit, device, on_plan, started)
    if bar is not None:
        bar.close()
    for i, task in indexed:  # a worker that crashed leaves its tasks without an answer
        if i not in final:
            final[i] = Outcome(i, task.key, Result("error", 0.0, message="its worker process stopped before answering"), 0.0)
    return [final[i] for i in range(len(indexed))]


def _run_pool(indexed: list[tuple[int, Task]], limits: PerTask | StageBudget, jobs: int, deadline: float, clock: str,
              options: dict[str, Any], emit: Callable[[Outcome], None], device: str = "cpu",
              on_plan: Callable[[Plan], None] | None = None, started: float = 0.0) -> None:
    ctx = mp.get_context("spawn")  # fork after torch's thread pools started can hang
    out = ctx.Queue()
    if isinstance(limits, PerTask):
        work = ctx.Queue()
        for chunk in _chunks(indexed, jobs):
            work.put(chunk)
        shares = [("queue", work)] * jobs
    else:
        shares = [("rounds", indexed[j::jobs]) for j in range(jobs)]
    procs = [ctx.Process(target=_worker, args=(mode, w, limits, deadline, clock, options, out, device, started, jobs),
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


# ---------------------------------------------------------------------------------------------
# workers


def _worker(mode: str, work: Any, limits: PerTask | StageBudget, deadline: float, clock: str, options: dict[str, Any],
            out: Any, device: str, started: float, workers: int) -> None:
    torch.set_num_threads(1)
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
            _run_per_task(pull(), limits, clock, options, out.put, device, deadline, note, started, workers)
        else:
            _run_rounds(work, limits, deadline, clock, options, out.put, device, note, started, workers)
    except BaseException as e:  # reported to the parent, which fails every task this worker still held
        out.put(("crash", one_line(e)))
    finally:
        out.put(("done", os.getpid()))


def _chunks(indexed: Sequence[tuple[int, Task]], jobs: int) -> list[list[tuple[int, Task]]]:
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


# ---------------------------------------------------------------------------------------------
# shards and summaries


def shard(items: Sequence[Any], spec: str | None) -> list[int]:
    """Indices of the items in shard "K/N" (those with index ≡ K mod N): N shards are disjoint and cover every item.
    "K/N" is read as `pipeline sweep --shard` reads it (`pipeline.shards`)."""
    if not spec:
        return list(range(len(items)))
    part = parse_shard(spec)
    return [i for i in range(len(items)) if in_shard(i, part)]


def summarize(rows: Sequence[dict[str, Any]], by: Sequence[str]) -> list[dict[str, Any]]:
    """Group rows (each with "result", "seconds" and optionally "stage", "unstable_ibp", "unstable_tight") by the
    keys `by`, in first-seen order: counts per result, fractions over all rows of the group (a misclassified sample,
    stage "clean", counts as sat), and median/max seconds and mean unstable counts over the rows a verifier ran on."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, sel in groups.items():
        c = {s: sum(r["result"] == s for r in sel) for s in RESULTS}
        ran = [r for r in sel if r.get("stage") != "clean"]
        m = len(sel)

        def mean(k: str) -> float | None:
            vals = [float(r[k]) for r in ran if str(r.get(k, "")) != ""]
            return statistics.fmean(vals) if vals else None

        secs = [float(r["seconds"]) for r in ran]
        out.append({**dict(zip(by, key)), "properties": m, **c, "misclassified": m - len(ran),
                    "certified_fraction": c["unsat"] / m, "falsified_fraction": c["sat"] / m,
                    "decided_fraction": (c["sat"] + c["unsat"]) / m,
                    "median_seconds": statistics.median(secs) if secs else None, "max_seconds": max(secs) if secs else None,
                    "mean_unstable_ibp": mean("unstable_ibp"), "mean_unstable_tight": mean("unstable_tight")})
    return out
