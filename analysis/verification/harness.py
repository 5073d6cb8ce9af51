"""The one property loop: the verify stage, `analysis.api.verify` and `pipeline vnncomp` all answer their
properties here.

A `Task` is one property: how to build its `Problem` (the preparation: reading the network, parsing the property,
starting onnxruntime; timed as ``prepare_time``) and the verifier that answers it. Two ways to spend time:

- `PerTask`: each task gets its own limit (VNN-COMP's per-instance timeout); with several jobs, each worker takes
  the next task from a shared queue.
- `StageBudget`: one wall-clock budget for all tasks. Rounds: every open task gets `first` seconds, then ×4 per
  round, capped by its fair share of what is left (time left / tasks still open); a task is final when it is
  decided or its method ended undecided inside its limit ("unknown"), or when no turn at least `MIN_TURN_GROWTH`
  times its last is left to give it. Easy properties finish in the first round and the time they leave goes to
  the hard ones. Later rounds start with the tasks whose bounds came closest to a decision; a task keeps its
  Problem between rounds in its worker, so the bounds computed once are reused. With several jobs the tasks are
  dealt round-robin to the workers, each running rounds on its share against the one deadline.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.shards import in_shard, parse_shard

from .graph import Graph
from .problem import DECISIVE, RESULTS, Budget, Problem, Result
from .readers import read
from .registry import get_verifier, one_line
from .vnnlib import VnnlibSpec, read_vnnlib_all

ROUND_GROWTH = 4.0  # each StageBudget round multiplies the per-task limit by this
MIN_TURN_GROWTH = 1.5  # a task open after a turn gets another only when it can be this much longer


# ---------------------------------------------------------------------------------------------
# tasks


@dataclass
class Task:
    """One property. Subclasses say how its Problem is built; `key` identifies it to the caller."""

    key: Any
    verifier: Any = "auto"  # a registry name or chain, or a Verifier
    timeout: float | None = None  # PerTask: this task's limit (None: the default of PerTask)
    known: Result | None = None  # an answer known without solving (a misclassified sample); nothing is built

    def build(self, cache: dict[Any, Any]) -> Problem:
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


@dataclass
class SpecTask(Task):
    """A property in memory: a graph, its specs, and what a counterexample is re-checked on (default: the graph)."""

    net: Graph | None = None
    specs: list[VnnlibSpec] = field(default_factory=list)
    recheck: Callable[[np.ndarray], np.ndarray] | None = None

    def build(self, cache: dict[Any, Any]) -> Problem:
        return Problem(self.specs, network=self.net, recheck=self.recheck)


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
        if self.model is None:
            self.model = self.load()
        with torch.no_grad():
            x = torch.as_tensor(np.asarray(x), dtype=torch.float32).reshape(1, *self.input_shape)
            return self.model.eval()(x).double().numpy().reshape(-1)


class OnnxRecheck:
    """Re-checks a candidate in onnxruntime on an ONNX file (picklable; the session starts on first use)."""

    def __init__(self, path: str | Path):
        self.path, self._session = Path(path), None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_session": None}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        from pipeline import onnx_io  # onnxruntime, imported on first use

        if self._session is None:
            self._session = onnx_io.session(self.path)
        return onnx_io.forward_flat(self._session, x)


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


# ---------------------------------------------------------------------------------------------
# solving one task


def resolve_device(name: str) -> str:
    """"auto" | "cpu" | "cuda" | "cuda:N" → the device the verifiers compute on ("auto": a GPU when there is one);
    ValueError (one line naming the choices) for anything else or for CUDA on a machine without it."""
    from pipeline.devices import resolve
    from pipeline.errors import PipelineError

    try:
        return str(resolve(str(name)))
    except PipelineError as e:
        raise ValueError(str(e)) from None


def _solve(task: Task, cache: dict[Any, Any], problems: dict[int, tuple[Problem, float]], index: int,
           seconds: float, clock: str, options: dict[str, Any], device: str = "cpu") -> tuple[Result, float]:
    if task.known is not None:
        return task.known, 0.0
    if index in problems:
        problem, prepare = problems[index]
    else:
        t0 = Budget.read("wall")
        try:
            problem = task.build(cache)
        except Exception as e:
            return Result("error", 0.0, message=one_line(e)), Budget.read("wall") - t0
        problem.device = device
        prepare = Budget.read("wall") - t0
        problems[index] = (problem, prepare)
    if isinstance(task.verifier, str):
        vkey = ("verifier", task.verifier)
        if vkey not in cache:
            cache[vkey] = get_verifier(task.verifier, **options)
        verifier = cache[vkey]
    else:
        verifier = task.verifier
    result = verifier.run(problem, Budget(seconds, clock))
    if result.status not in DECISIVE and result.status != "error" and result.seconds > seconds:
        result = Result("timeout", result.seconds, None, None, result.message, result.stage, result.cpu_seconds, result.info)
    return result, prepare


def _closeness(result: Result) -> float:
    """How near a property came to a decision (for the order of later rounds): its margin's lower bound."""
    v = result.info.get("margin_lb")
    return -float(v) if v is not None and math.isfinite(float(v)) else math.inf


def _run_per_task(indexed: Iterable[tuple[int, Task]], limits: PerTask, clock: str, options: dict[str, Any],
                  emit: Callable[[Outcome], None], device: str = "cpu", deadline: float = math.inf) -> None:
    cache: dict[Any, Any] = {}
    for i, task in indexed:
        problems: dict[int, tuple[Problem, float]] = {}
        seconds = min(task.timeout if task.timeout is not None else limits.timeout, deadline - Budget.read("wall"))
        if seconds <= 0:
            emit(Outcome(i, task.key, Result("timeout", 0.0, message="not run: the run's wall budget was spent"), 0.0))
            continue
        result, prepare = _solve(task, cache, problems, i, seconds, clock, options, device)
        emit(Outcome(i, task.key, result, prepare))


def _run_rounds(indexed: Sequence[tuple[int, Task]], limits: StageBudget, deadline: float, clock: str,
                options: dict[str, Any], emit: Callable[[Outcome], None], device: str = "cpu") -> None:
    cache: dict[Any, Any] = {}
    problems: dict[int, tuple[Problem, float]] = {}
    open_ = list(indexed)
    last: dict[int, Result] = {}
    ran: dict[int, float] = {}  # each open task's longest turn so far
    limit = limits.first
    while open_:
        still = []
        for n, (i, task) in enumerate(open_):
            left = deadline - Budget.read("wall")
            seconds = min(limit, left / (len(open_) - n))
            if seconds <= ran.get(i, 0.0) * MIN_TURN_GROWTH or left <= 0:
                # no longer turn than its last one is to be had: its time is spent (a task is re-solved from its kept
                # Problem each turn: its bounds are kept and branch and bound goes on from the domains its last turn
                # left, but the links before it run again, so a turn no longer than the last decides little more)
                prev = last.get(i)
                result = prev if prev is not None else Result("timeout", 0.0, message="not run: the stage budget was spent")
                emit(Outcome(i, task.key, result, problems.get(i, (None, 0.0))[1]))
                problems.pop(i, None)
                continue
            result, prepare = _solve(task, cache, problems, i, seconds, clock, options, device)
            ran[i] = seconds
            # only a timeout can change with more time: "unknown" means the method ended inside its limit undecided
            final = result.status != "timeout" or task.known is not None
            emit(Outcome(i, task.key, result, prepare, final))
            if final:
                problems.pop(i, None)
            else:
                last[i] = result
                still.append((i, task))
        still.sort(key=lambda it: _closeness(last[it[0]]))
        open_ = still
        limit *= ROUND_GROWTH


# ---------------------------------------------------------------------------------------------
# workers


def _worker(mode: str, work: Any, limits: PerTask | StageBudget, deadline: float, clock: str, options: dict[str, Any],
            out: Any, device: str = "cpu") -> None:
    torch.set_num_threads(1)
    try:
        if mode == "queue":
            def pull() -> Iterable[tuple[int, Task]]:
                while True:
                    try:
                        item = work.get_nowait()
                    except queue_mod.Empty:
                        return
                    yield item
            _run_per_task(pull(), limits, clock, options, out.put, device, deadline)
        else:
            _run_rounds(work, limits, deadline, clock, options, out.put, device)
    except BaseException as e:  # reported to the parent, which fails every task this worker still held
        out.put(("crash", one_line(e)))
    finally:
        out.put(("done", os.getpid()))


def run(tasks: Sequence[Task], limits: PerTask | StageBudget, *, jobs: int = 1, clock: str = "wall",
        on_done: Callable[[Outcome], None] | None = None, options: dict[str, Any] | None = None,
        device: str = "cpu", progress: str | None = None, label: Callable[[Any], str] = str) -> list[Outcome]:
    """Answer every task; returns the final outcome of each, in the order given. `options` go to the verifiers;
    `device` is where they compute ("auto" resolved here). `progress`: a name to show each final answer under
    (`label(key)` names the task in its line)."""
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
    deadline = Budget.read("wall") + (math.inf if total is None else total)
    if jobs == 1:
        if isinstance(limits, StageBudget):
            _run_rounds(indexed, limits, deadline, clock, options, emit, device)
        else:
            _run_per_task(indexed, limits, clock, options, emit, device, deadline)
    else:
        _run_pool(indexed, limits, jobs, deadline, clock, options, emit, device)
    if bar is not None:
        bar.close()
    for i, task in indexed:  # a worker that crashed leaves its tasks without an answer
        if i not in final:
            final[i] = Outcome(i, task.key, Result("error", 0.0, message="its worker process stopped before answering"), 0.0)
    return [final[i] for i in range(len(indexed))]


def _run_pool(indexed: list[tuple[int, Task]], limits: PerTask | StageBudget, jobs: int, deadline: float, clock: str,
              options: dict[str, Any], emit: Callable[[Outcome], None], device: str = "cpu") -> None:
    ctx = mp.get_context("spawn")  # fork after torch's thread pools started can hang
    out = ctx.Queue()
    if isinstance(limits, PerTask):
        work = ctx.Queue()
        for item in indexed:
            work.put(item)
        shares = [("queue", work)] * jobs
    else:
        shares = [("rounds", indexed[j::jobs]) for j in range(jobs)]
    procs = [ctx.Process(target=_worker, args=(mode, w, limits, deadline, clock, options, out, device), daemon=True)
             for mode, w in shares]
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
            elif msg[0] == "done":
                running -= 1
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


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
