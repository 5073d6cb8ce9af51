"""The attack link ``pgd``: sat with a counterexample, else unknown (never unsat). Inside a chain of several links it
is a probe with its own small share of the property's time (`ATTACK_SHARE`), so that a property whose every bound is
out of reach never starves the bound links (`verifiers`)."""

from __future__ import annotations

import numpy as np

from . import attack
from .graph import Graph
from .ops.rounding import Rounding
from .problem import Budget, Problem, float32_in_box
from .registry import Verifier, register_verifier


# The attack's share of a property's time inside a chain of several links: a probe, so that on a property whose every
# bound is out of reach it never starves the bound (a chain's `Chain.check` gives it `Budget.part(probe_share)`)
ATTACK_SHARE = 0.1


@register_verifier("pgd")
class PgdVerifier(Verifier):
    """Attack only (`attack.pgd`): sat with a counterexample, else unknown (never unsat). On a network with grid
    roundings (int8) the gradient is a surrogate, so the box is first searched on the model itself
    (`attack.vertex_search`, half of the time). A point where the model gives a tie (the property's margin exactly 0)
    means the box reaches the unsafe set: no certificate exists, yet the point is not a counterexample (it must be
    strict, `Problem.confirm`). Then the bounds are not run and a chain gives the searches the rest of the property's
    time (`searches`, `Chain.check`): PGD once, the search on the model until the time is up, with fresh random
    points per try; without a strict point the property stays open with reason ``tie``. Inside a chain it is a probe
    (`probe_share`); a run that did all its steps is not repeated in a later turn on the same problem (its unknown is
    remembered), one cut short by its share is, with the longer turn's share."""

    probe_share = ATTACK_SHARE
    searches = True

    def __init__(self, steps: int = 40, restarts: int = 2, margin: float = 1e-4, seed: int = 0,
                 vertex_batch: int = 256, vertex_rounds: int = 400) -> None:
        self.steps, self.restarts, self.margin, self.seed = int(steps), int(restarts), float(margin), seed
        self.vertex_batch, self.vertex_rounds = int(vertex_batch), int(vertex_rounds)

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        grid = _on_grid(problem.network)
        said: dict[str, str] = {}
        if grid and problem.cache.get("tie") is None:
            status, x, said["search"] = self._vertices(problem, k, budget.part(0.5))
            if status == "sat":
                return status, x, said["search"]
        status, x, said["pgd"] = self._pgd(problem, k, budget, grid)
        if status == "sat":
            return status, x, said["pgd"]
        if grid and problem.cache.get("tie") is not None and not budget.expired():  # PGD first: a different search
            # the input boxes after this one get their part of what is left (`Verifier.check` takes them in order)
            mine = Budget(budget.left() / (len(problem.specs) - k), budget.clock)
            status, x, said["search"] = self._vertices(problem, k, mine)
            if status == "sat":
                return status, x, said["search"]
        return "unknown", None, "; ".join(said.values())

    def _pgd(self, problem: Problem, k: int, budget: Budget, grid: bool) -> tuple[str, np.ndarray | None, str]:
        key = ("pgd", k, self.steps, self.restarts, self.seed)
        if key in problem.cache:
            return "unknown", None, problem.cache[key]
        x, v = attack.pgd(problem.network, problem.specs[k], self.steps, self.restarts, self.margin, self.seed,
                          budget.expired)
        if x is not None:  # confirmed here, so that a candidate the model does not confirm leaves the search going
            x32, _, why = problem.confirm(k, x, budget.expired)
            if x32 is not None:
                return "sat", x32, "PGD counterexample"
            spec = problem.specs[k]
            if grid and spec.violation(problem.recheck(float32_in_box(x, spec.lb, spec.ub))) == 0:
                _tie(problem)  # the model ties there: the box reaches the unsafe set
            return "unknown", None, f"PGD counterexample: candidate {why}"
        msg = f"PGD ({self.steps} steps, {self.restarts + 1} starts per disjunct): best margin {v:.4g}"
        if budget.expired():
            return "unknown", None, msg + " (cut short by its share of the time)"
        problem.cache[key] = msg + " (an earlier turn)"
        return "unknown", None, msg

    def _vertices(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        """The search scored on the model: once per turn until a tie is known; after a tie, tries with fresh random
        points until a strict point or the end of `budget`."""
        spec = problem.specs[k]
        key = ("vertices", k, self.vertex_batch, self.vertex_rounds, self.seed)
        if key in problem.cache and problem.cache.get("tie") is None:
            return "unknown", None, problem.cache[key]
        lo, hi = float32_in_box(spec.lb, spec.lb, spec.ub), float32_in_box(spec.ub, spec.lb, spec.ub)
        seen = problem.cache.get(("vertex points", k), 0)
        while True:
            # a turn cut short by its share is taken again later with fresh random points (the next seed)
            tries = problem.cache[("vertex turns", k)] = problem.cache.get(("vertex turns", k), -1) + 1
            r = attack.vertex_search(problem.recheck_many, spec, lo, hi, self.vertex_batch, self.vertex_rounds,
                                     self.seed + tries, expired=budget.expired, left=budget.left)
            seen = problem.cache[("vertex points", k)] = seen + r.evaluated
            if r.x is not None:
                return "sat", r.x, f"search on the model ({seen} points scored)"
            if r.tie is not None:
                _tie(problem)
            if problem.cache.get("tie") is None or budget.expired():
                break
        if problem.cache.get("tie") is not None:
            return "unknown", None, (f"no certificate exists: the model gives a tie (margin exactly 0) at a point of "
                                     f"the box, so the box reaches the unsafe set; no point strictly in it found "
                                     f"({seen} points scored on the model)")
        msg = f"search on the model ({seen} points scored): best margin {r.violation:.4g}"
        if budget.expired():
            return "unknown", None, msg + " (cut short by its share of the time)"
        problem.cache[key] = msg + " (an earlier turn)"
        return "unknown", None, msg


def _tie(problem: Problem) -> None:
    """Note that the model gives a tie at a point of the box: no certificate exists (`Chain.check` then runs only the
    searches; `problem.open_reason` says ``tie``)."""
    problem.cache["tie"] = True
    problem.info["tie"] = True


def _on_grid(net: Graph) -> bool:
    """Whether the network rounds to a grid (an int8 graph): there the attack's gradient is only a surrogate."""
    return any(isinstance(n.op, Rounding) and n.op.step is not None for n in net.nodes[1:])
