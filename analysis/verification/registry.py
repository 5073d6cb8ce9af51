"""The Verifier base class, the registry of verifiers, and chains of them.

A verifier answers one `problem.Problem` under one `problem.Budget` with a `problem.Result`. The registered
verifiers live in `verifiers.py`, `pgd_verifier.py` and `complete_verifiers.py` (registered when the package is
imported). A chain ``a+b+…`` runs its links in order on one shared Problem until one answers sat or unsat, under one
budget; later links reuse what earlier ones computed (the bounds, the disjuncts still open); a link that is a probe
(`Verifier.probe_share`, the attack) gets only that share of the chain's limit. ``auto`` is the staged chain `STAGED`:
the bound first, the attack as a probe, then α-CROWN and branch and bound.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .ops.base import OutOfDomain, UnsupportedModel
from .problem import DECISIVE, Budget, Problem, Result

STAGED = "crown+pgd+alpha-crown+bab"


@dataclass
class Answer:
    """What a verifier's `check` found: a sat answer carries the confirmed float32 point and its re-checked output."""

    status: str
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    message: str = ""
    stage: str = ""


class Verifier:
    """Subclasses implement `solve(problem, k, budget)` for spec k of a problem (or `check` for the whole problem).
    A sat from `solve` is a candidate: `check` confirms it (`Problem.confirm`) or keeps it as unknown. `run` times
    the call and turns exceptions into ``error``."""

    name: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()  # importable modules this verifier needs
    # inside a chain of several links, the share of the chain's limit this link may use (None: all that is left)
    probe_share: ClassVar[float | None] = None
    # a link that searches for counterexamples (rather than bounds them): after a tie it has the chain's time to itself
    searches: ClassVar[bool] = False

    @classmethod
    def available(cls) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in cls.requires)

    def refuses(self, problem: Problem) -> str | None:
        """Why this verifier cannot work on the problem's network (one line naming what would), or None. A chain
        skips such a link and says so; run alone, it is the answer's error."""
        return None

    def verify(self, onnx_path: Any, vnnlib_path: str | Path, timeout_s: float, clock: str = "wall") -> Result:
        """One property from files (onnx: a path, bytes or a ModelProto)."""
        wall0, cpu0 = Budget.read("wall"), Budget.read("cpu")
        try:
            problem = Problem.from_files(onnx_path, Path(vnnlib_path))
        except Exception as e:
            return Result("error", Budget.read("wall") - wall0, message=one_line(e), cpu_seconds=Budget.read("cpu") - cpu0)
        return self.run(problem, Budget(timeout_s, clock))

    def run(self, problem: Problem, budget: Budget) -> Result:
        wall0, cpu0 = Budget.read("wall"), Budget.read("cpu")
        why = self.refuses(problem)
        try:
            a = Answer("error", message=why, stage=self.name) if why else self.check(problem, budget)
        except OutOfDomain as e:  # the box is too wide for a relaxation (an exp that may overflow): not decided
            a = Answer("unknown", message=one_line(e), stage=self.name)
        except Exception as e:  # a verifier failing on one instance must not stop a benchmark
            a = Answer("error", message=one_line(e), stage=self.name)
        if a.status != "sat":
            a.x = a.y = None
        elif a.x is None:
            a = Answer("error", message=f"{a.stage} reported a counterexample but gave no input. {a.message}", stage=a.stage)
        return Result(a.status, Budget.read("wall") - wall0, a.x, a.y, a.message, a.stage, Budget.read("cpu") - cpu0,
                      dict(problem.info))

    def check(self, problem: Problem, budget: Budget) -> Answer:
        """Every spec (input box) of the problem: sat if one is, unsat if all are."""
        messages, worst = [], "unsat"
        rank = {"unsat": 0, "unknown": 1, "timeout": 2, "error": 3}
        for k in range(len(problem.specs)):
            if budget.expired():
                return Answer("timeout", message=f"{self.name}: no time left", stage=self.name)
            problem.check_shapes(k)
            status, x, msg = self.solve(problem, k, budget)
            if status == "sat":
                answer = confirmed(problem, k, x, msg, self.name, budget.expired)
                if answer.status == "sat":
                    return answer
                status, msg = answer.status, answer.message
            if rank[status] > rank[worst]:
                worst = status
            messages.append(msg)
        prefix = f"{len(problem.specs)} input boxes: " if len(problem.specs) > 1 else ""
        return Answer(worst, message=prefix + "; ".join(m for m in messages if m), stage=self.name)

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        raise NotImplementedError

    def bound_pass(self, problem: Problem, k: int) -> Any:
        """The state of this verifier's first bound pass on spec k (it holds a `bounds.Bounder` whose CROWN the
        property loop batches with the network's other properties, `first_pass`), or None when it computes no bounds."""
        return None

    def alpha_pass(self) -> tuple[int, float] | None:
        """(steps, lr) of the α-CROWN on the rows that the first pass runs after CROWN, or None."""
        return None


def confirmed(problem: Problem, k: int, x: np.ndarray | None, message: str, stage: str,
              expired: Callable[[], bool] | None = None) -> Answer:
    """A candidate counterexample of spec k as an Answer: sat when `Problem.confirm` accepts it, else unknown."""
    if x is None:
        return Answer("error", message=f"{stage} reported a counterexample but gave no input. {message}", stage=stage)
    x32, y, why = problem.confirm(k, x, expired)
    if x32 is None:
        return Answer("unknown", message=f"{message}: candidate {why}", stage=stage)
    problem.cache["sat_spec"] = k
    return Answer("sat", x32, y, f"{message}; {why}" if message else why, stage)


VERIFIERS: dict[str, type[Verifier]] = {}


def register_verifier(name: str):
    def deco(cls: type[Verifier]) -> type[Verifier]:
        if name in VERIFIERS:
            raise ValueError(f"verifier {name!r} is already registered")
        cls.name = name
        VERIFIERS[name] = cls
        return cls
    return deco


def resolve(name: str) -> str:
    """"auto" → the staged chain; anything else unchanged."""
    return STAGED if name == "auto" else name


def check_name(name: str) -> None:
    """ValueError (one line, the choices listed) unless `name` is "auto", a verifier or a chain of them."""
    parts = resolve(name).split("+")
    bad = [p for p in parts if p not in VERIFIERS]
    if bad or not name:
        raise ValueError(f"unknown verifier {bad[0] if bad else name!r} in {name!r}; choose from auto, "
                         f"{', '.join(VERIFIERS)} or chains of them joined by '+' (e.g. {STAGED})")


def get_verifier(name: str, **options: Any) -> Verifier:
    """The verifier registered under `name`, or a `Chain` for "a+b+…" / "auto"; `options` go to every
    link that takes them (by constructor parameter name)."""
    check_name(name)
    name = resolve(name)
    if "+" in name:
        return Chain(name, **options)
    return _build(name, options)


def _build(name: str, options: dict[str, Any]) -> Verifier:
    cls = VERIFIERS[name]
    params = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in options.items() if k in params})


def available_verifiers() -> list[str]:
    """Registered verifiers whose dependencies are installed."""
    return sorted(n for n, cls in VERIFIERS.items() if cls.available())


class Chain(Verifier):
    """Links run in order on one Problem until one answers sat or unsat; one budget for all."""

    def __init__(self, name: str, **options: Any):
        self.name = name
        self.links = [_build(part, options) for part in name.split("+")]

    @classmethod
    def available(cls) -> bool:
        return True

    def bound_pass(self, problem: Problem, k: int) -> Any:
        """The first link's that has one."""
        return next((st for st in (link.bound_pass(problem, k) for link in self.links) if st is not None), None)

    def alpha_pass(self) -> tuple[int, float] | None:
        return next((a for a in (link.alpha_pass() for link in self.links) if a is not None), None)

    def check(self, problem: Problem, budget: Budget) -> Answer:
        """The links in order, until one answers sat or unsat. Once a search finds a tie (`PgdVerifier`: the box
        reaches the unsafe set, so no certificate exists) the bounding links are skipped and the searching links get
        the time that is left."""
        messages: list[str] = []
        answer = Answer("timeout", stage=self.name)
        n = len(self.links)
        for i, link in enumerate(self.links + [x for x in self.links if x.searches]):
            tied = problem.cache.get("tie") is not None
            if tied and not link.searches or i >= n and not tied:
                continue
            why = link.refuses(problem)
            if why:
                messages.append(f"{link.name}: not run ({why})")
                continue
            if budget.expired():
                messages.append(f"{link.name}: not run, no time left")
                answer = Answer("timeout", stage=self.name)
                break
            t0 = Budget.read("wall")
            probe = link.probe_share is not None and len(self.links) > 1 and not tied
            mine = budget.part(link.probe_share) if probe else budget
            try:
                answer = link.check(problem, mine)
            except OutOfDomain as e:  # the box is too wide for a relaxation (an exp that may overflow): not decided
                answer = Answer("unknown", message=one_line(e), stage=link.name)
            except UnsupportedModel as e:
                answer = Answer("error", message=one_line(e), stage=link.name)
            spent = problem.info.setdefault("stage_seconds", {})
            spent[link.name] = round(spent.get(link.name, 0.0) + Budget.read("wall") - t0, 4)
            messages.append(f"{link.name}: {answer.status}" + (f" ({answer.message})" if answer.message else ""))
            answer.stage = link.name
            if answer.status in DECISIVE or answer.status == "error" or (tied and budget.expired()):
                break
        if answer.status not in DECISIVE and budget.expired():
            answer.status = "timeout"
        answer.message = "; ".join(messages)
        return answer


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
