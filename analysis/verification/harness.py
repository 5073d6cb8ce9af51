"""The one property loop: the verify stage, `analysis.api.verify` and `pipeline vnncomp` all answer their
properties here.

A `Task` is one property: how to build its `Problem` (the preparation: reading the network, parsing the property,
starting onnxruntime; timed as ``prepare_time``) and the verifier that answers it. Where the time goes, in every mode
(the time goes where it decides):

1. **The first bound pass** (`first_pass`): every property a worker holds gets one CROWN pass before any property
   gets anything else, the properties of one network batched into one call, then α-CROWN on the rows still open
   where there is time (`ALPHA_SHARE` of what is left). The pass of each network's first property runs alone and is
   timed; those costs (`Plan`) go to the run's `FirstPass`, which says in one sentence, when the limit given cannot
   cover one pass per property, the limit that would (`shortfall`), and which `run` returns with the outcomes. A
   property the pass decides is answered at once.
2. **Each open property's own turns**: its verifier's chain, whose bound links find the pass's bounds computed; the
   attack is a probe with its own small share (`pgd_verifier.ATTACK_SHARE`); then α-CROWN where the pass did not run it,
   then branch and bound, the properties nearest to a decision (the largest margin bound) first.

Two ways to spend time:

- `PerTask`: each task gets its own limit (VNN-COMP's per-instance timeout). Its share of its chunk's batched pass
  counts against it: a chunk (a network's tasks, cut into one chunk per job) may spend `PASS_SHARE` of its tasks'
  limits together on the pass, and the first task's measured pass no more than its own limit. With several jobs,
  each worker takes the next chunk from a shared queue.
- `StageBudget`: one budget for all tasks; the pass for all of them comes first, against the one deadline. Then
  rounds: every open task gets `first` seconds, then ×4 per round, capped by its fair share of what is left (time
  left / tasks still open), the nearest to a decision (branch and bound's global lower bound, else the margin bound)
  first; a task is final when it is decided or its method ended undecided inside its limit
  ("unknown"), or when no turn at least `MIN_TURN_SHARE` times its last is left to give it. When the fair share is
  too short for every open task, the farthest from a decision give their turns up to the nearest. Easy properties
  finish in the first round and the time they leave goes to the hard ones. A task keeps its Problem between rounds
  in its worker, so the bounds computed once are reused and branch and bound goes on from its open domains. With
  several jobs the tasks are dealt round-robin to the workers, each running its share against the one deadline.

The clock (`clock=`): "wall" counts wall seconds (VNN-COMP's rule); "cpu" counts the CPU seconds of the process
doing the work, every limit and the run's budget alike (each spawned worker its own from its start, so that each has
the whole budget, as each has the whole wall budget side by side), so that a loaded machine gives the same answers
more slowly. Reported seconds are wall seconds either way (and CPU seconds beside them).

Every limit holds within a second: a turn looks at its `Budget`, and past it by `problem.HARD_GRACE_S` it is
stopped from outside (`problem.hard_limit`). A task's reported seconds are all it spent (its share of the pass and
its turns). Why an open property is open: `problem.open_reason` ("budget": no bound pass finished in its time).

Workers are separate processes (spawned, one torch thread each: the matrices of one property are small, and
processes do not contend for the interpreter); `jobs=1` runs in this process. `on_done(outcome)` is called in
this process for every outcome as it arrives (provisional ones too), so callers can write their files as they go.

`device` ("cpu", "cuda", "cuda:N"; the caller's `resolve_device` turns "auto" into one, once): where every problem's bound passes and
branch and bound compute. On a GPU the worker processes share it (each its own CUDA context); the MILP, the attack's
re-checks and onnxruntime stay on the CPU cores of the worker that asked.

`progress="name"` shows the final answers as they come (`pipeline.progress`): a bar on a terminal, else a line each.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.shards import in_shard, parse_shard

from .pool import ALPHA_SHARE, MIN_TURN_SHARE, PASS_SHARE, ROUND_GROWTH, Loop, chunks, run_per_task, run_rounds  # noqa: F401
from .first_pass import Cost
from .pool import run_pool as _run_pool
from .problem import RESULTS, Budget, Result
from .tasks import FileTask, ModuleRecheck, OnnxRecheck, Outcome, PerTask, Plan, SpecTask, StageBudget, Task  # noqa: F401


# ---------------------------------------------------------------------------------------------
# how time is spent: what the workers' plans say about it


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


BUDGET_ROOM = 1.2  # the budget a short one names: the estimated need with this much room, rounded up to 10 s


class FirstPass:
    """One `run`'s first bound pass as its workers report it (their `Plan`s), and the one sentence every caller (the
    verify stage, `analysis.api.verify`, `pipeline vnncomp`) prints when its limit cannot cover one pass per property,
    said through `note` and kept in `lines`:

    - `StageBudget`: once for the run, when every worker has measured (before the passes go on) or every worker's pass
      has ended (a batch can cost more per property than one alone), whichever first shows the budget short; at the
      run's end when neither did and the passes fell short anyway;
    - `PerTask`: once per network whose measured pass its properties' limit cannot cover (workers take the networks as
      they go, so no moment knows them all).

    `setting` is the limit as the caller's user writes it, separator included ("verify.budget_s=", "timeout_s=",
    "--timeout "), so the sentence names the setting to change. `properties`: the properties that need a pass."""

    def __init__(self, limits: PerTask | StageBudget, setting: str, properties: int,
                 note: Callable[[str], None] | None = None):
        self.limits, self.setting, self.properties = limits, setting, properties
        self.note = note or (lambda line: None)
        self.plans: list[Plan] = []
        self.lines: list[str] = []
        self._said: set[tuple[str, ...]] = set()

    def __call__(self, plan: Plan) -> None:
        self.plans.append(plan)
        if isinstance(self.limits, StageBudget):
            latest = latest_plans(self.plans)
            if self.lines or len(latest) < plan.workers or len({p.reached is None for p in latest}) > 1:
                return
            self._say(self.sentence(self.plans))
            return
        networks = tuple(c.network for c in plan.costs)
        if networks not in self._said:
            line = self.sentence([plan])
            if line:
                self._said.add(networks)
                self._say(line)

    def _say(self, line: str | None) -> None:
        if line:
            self.lines.append(line)
            self.note(line)

    def finish(self) -> None:
        """At the run's end: a stage budget the passes fell short of is said, if it was not yet (a worker that stopped
        before reporting leaves the moment above unreached)."""
        if isinstance(self.limits, StageBudget) and not self.lines:
            self._say(self.sentence(self.plans))

    def sentence(self, plans: Sequence[Plan]) -> str | None:
        """The sentence for `plans` when the limit cannot cover one pass per property (None when it does): what one
        CROWN pass of each network cost on its first property (≥ where it did not finish in its time) or, once a stage
        budget's pass is over, how many properties it reached, and the setting that would cover it."""
        need = shortfall(plans, self.limits)
        if need is None:
            return None
        costs: dict[str, Cost] = {}
        for plan in plans:
            for c in plan.costs:
                if c.network not in costs or c.seconds > costs[c.network].seconds:
                    costs[c.network] = c
        each = ", ".join(f"{'≥ ' if not c.finished else ''}{c.seconds:.2g} s on {c.network}" for c in costs.values())
        more = " or more" if not all(c.finished for c in costs.values()) else ""
        latest = latest_plans(plans)
        if isinstance(self.limits, StageBudget):
            value, named = self.limits.seconds, would(need)
            if all(p.reached is not None for p in latest):
                reached, total = sum(p.reached for p in latest), sum(p.properties for p in latest)
                how = (f"the pass reached {reached} of {total} properties in {max(p.pass_seconds for p in latest):.0f} s "
                       f"(one CROWN pass took {each} on each network's first property alone)")
            else:
                how = (f"one CROWN pass took {each} (each network's first property); {self.properties} properties on "
                       f"{plans[0].workers} worker(s) need {'at least ' if more else ''}{need:.0f} s for it")
        else:
            value, named = min(self.limits.timeout if p.limit is None else p.limit for p in latest), math.ceil(need)
            how = f"one CROWN pass took {each} (its first property), more than {PASS_SHARE:g} of each property's limit"
            short = [p for p in latest if p.reached is not None and p.reached < p.properties]
            if short:
                how += (f"; the pass reached {sum(p.reached for p in short)} of {sum(p.properties for p in short)} "
                        f"properties")
        return (f"{self.setting}{value:g} cannot cover one bound pass per property: {how}; {self.setting}{named}{more} "
                f"would cover it. The properties the pass leaves open without time say `budget` as their reason.")

    def record(self) -> dict[str, Any]:
        """What a run record keeps of the first pass (the verify stage's summary.json): each network's measured pass (and
        `limit_s`, the per-property limit that covers it), the estimate (or, once the pass ended short, the extrapolation), how many properties it reached, whether the limit
        covered it, the limit that would, and the sentence said."""
        costs: dict[str, dict[str, Any]] = {}
        latest = latest_plans(self.plans)
        for plan in latest:
            for c in plan.costs:
                mine = costs.setdefault(c.network, {"seconds": c.seconds, "finished": c.finished, "properties": 0})
                mine["seconds"] = round(max(mine["seconds"], c.seconds), 4)
                mine["finished"] = mine["finished"] and c.finished
                mine["properties"] += c.properties
                # the per-property limit whose PASS_SHARE covers this pass (what an instance's timeout must be at least)
                mine["limit_s"] = math.ceil(mine["seconds"] / PASS_SHARE)
        short = shortfall(self.plans, self.limits)
        stage = isinstance(self.limits, StageBudget)
        done = [p for p in latest if p.reached is not None]
        return {"setting": self.setting.rstrip("= "),
                "budget_s": self.limits.seconds if stage else self.limits.timeout, "costs": costs,
                "needed_s": round(max((p.needed for p in latest), default=0.0), 2), "covered": short is None,
                "would_s": None if short is None else (would(short) if stage else math.ceil(short)),
                "reached": sum(p.reached for p in done) if done else None, "passes": sum(p.properties for p in done),
                "line": " ".join(self.lines)}

    @property
    def slowest(self) -> float | None:
        """The costliest measured pass of one network on its first property (None before any was measured)."""
        return max((c.seconds for p in self.plans for c in p.costs), default=None)


class Outcomes(list):
    """What `run` returns: the final `Outcome` of each task, in the order given, with the run's `first_pass`
    (`FirstPass`)."""

    def __init__(self, outcomes: Sequence[Outcome], first: FirstPass):
        super().__init__(outcomes)
        self.first_pass = first


def would(need: float) -> int:
    """The budget a short one names: the need with room, rounded up to 10 s."""
    return math.ceil(need * BUDGET_ROOM / 10) * 10


def resolve_device(name: str, setting: str = "device=") -> str:
    """"auto" | "cpu" | "cuda" | "cuda:N" → the device the verifiers compute on ("auto": a GPU when there is one);
    `pipeline.errors.DeviceError` (one line naming the choices, in the words of `setting`) for anything else or for
    CUDA on a machine without it."""
    from pipeline.devices import resolve

    return str(resolve(str(name), setting=setting))


def run(tasks: Sequence[Task], limits: PerTask | StageBudget, *, jobs: int = 1, clock: str = "wall",
        on_done: Callable[[Outcome], None] | None = None, options: dict[str, Any] | None = None,
        device: str = "cpu", progress: str | None = None, label: Callable[[Any], str] = str,
        setting: str | None = None, note: Callable[[str], None] | None = None,
        on_plan: Callable[[Plan], None] | None = None) -> Outcomes:
    """Answer every task; returns the final outcome of each, in the order given, with the first pass's summary
    (`Outcomes.first_pass`). `options` go to the verifiers; `device` is where they compute, as the caller resolved it
    once (`resolve_device`, in the words of its own setting: a bad name is the caller's `DeviceError`).
    `progress`: a name to show each final answer under (`label(key)` names the task in its line). `note(sentence)`:
    the budget sentence, when the limit cannot cover one bound pass per property (`FirstPass`), naming `setting`
    (default "budget_s=" for a stage budget, "timeout_s=" per task). `on_plan(plan)`: each worker's measured cost of one
    bound pass per network, as it comes."""
    from pipeline.progress import Progress

    options = dict(options or {})
    if device == "auto":  # a programming error: "auto" means different devices to a caller and its workers' records
        raise ValueError('harness.run takes a resolved device: pass resolve_device(name, setting), not "auto"')
    jobs = max(1, min(int(jobs), len(tasks)))
    if device.startswith("cuda"):  # the workers share the GPU: each plans with its share of the memory
        options.setdefault("sharers", jobs)
    on_done = on_done or (lambda o: None)
    final: dict[int, Outcome] = {}
    bar = Progress(progress, len(tasks), "property") if progress else None
    stage = isinstance(limits, StageBudget)
    first = FirstPass(limits, setting or ("budget_s=" if stage else "timeout_s="), sum(t.known is None for t in tasks), note)

    def planned(plan: Plan) -> None:
        first(plan)
        if on_plan is not None:
            on_plan(plan)

    def emit(o: Outcome) -> None:
        if o.final:
            final[o.index] = o
            if bar is not None:
                bar.step(line=f"    {progress}: {len(final)}/{len(tasks)} {label(o.key)}: {o.result.status} "
                              f"({o.result.seconds:.2f} s{', ' + o.result.stage if o.result.stage else ''})")
        on_done(o)

    indexed = list(enumerate(tasks))
    total = limits.seconds if stage else limits.wall_s
    started = Budget.read(clock)
    deadline = started + (math.inf if total is None else total)
    loop = Loop(limits, deadline, started, clock, options, device, jobs)
    if jobs == 1:
        if stage:
            run_rounds(indexed, loop, emit, planned)
        else:
            run_per_task(chunks(indexed, 1), loop, emit, planned)
    else:
        _run_pool(indexed, loop, emit, planned)
    if bar is not None:
        bar.close()
    first.finish()
    for i, task in indexed:  # a worker that crashed leaves its tasks without an answer
        if i not in final:
            final[i] = Outcome(i, task.key, Result("error", 0.0, message="its worker process stopped before answering"), 0.0)
    return Outcomes([final[i] for i in range(len(indexed))], first)


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
