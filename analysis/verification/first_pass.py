"""The first bound pass: before any property gets its own turn (the attack's probe, α-CROWN, branch and bound), every
property of a network gets one CROWN pass, the network's properties batched into one call (`Bounder.crown_many`: the
boxes a batch dimension, as α,β-CROWN batches domains), then α-CROWN on the rows still open where there is time
(`Bounder.alpha_spec_many`). The property loop (`harness`) runs it for each worker's share of the properties.

Why: a pass is what decides most properties, and a budget split evenly over every property can leave each a share
shorter than one pass (docs/EXPERIMENTS.md, "The first pass"), so every property gets it before anything else, and the
pass of a network's first property runs alone and is timed (`Cost`): from it the caller learns whether its
budget covers one pass per property and says so when it does not.

An `Item` is one input box of one property with its verifier's bound-pass state (`Verifier.bound_pass`: it holds a
`bounds.Bounder`; the links of the property's chain later find its bounds). Each item's share of a batched call's
time is recorded (`Item.seconds`, wall seconds as every reported time): the property's reported time includes it.
Every pass stops at its deadline, read on the loop's clock (each bounder's `expired`, and `problem.hard_limit` from
outside on the wall clock); what it leaves is sound (intervals only narrowed), and an item whose pass did not finish
gets CROWN again in its own turn, within its own limit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .bounds import Bounder
from .problem import Budget, Overrun, Problem, hard_limit


@dataclass
class Item:
    """One input box (spec `k`) of the property at position `index` of the caller's list, and its bound-pass state."""

    index: int
    problem: Problem
    k: int
    state: Any
    seconds: float = 0.0  # its share of the passes' time so far
    tried: bool = False  # its CROWN pass has run (finished or stopped): the first pass does not run it again

    @property
    def primary(self) -> bool:
        """Are its bounds the property's own network's (not another one's: the via-relu route's ReLU version)?"""
        return self.state.source is self.problem.network


@dataclass(frozen=True)
class Cost:
    """One CROWN pass of a network as measured on its first property, alone: `seconds` (a lower bound when not
    `finished` in the time it had), and how many properties of that network the caller holds."""

    network: str
    seconds: float
    finished: bool
    properties: int


def _now() -> float:
    return Budget.read("wall")


def _by_graph(items: Sequence[Item]) -> dict[int, list[Item]]:
    """Items whose bounders are built from one graph, in order (a network's smooth route and its ReLU version apart)."""
    groups: dict[int, list[Item]] = {}
    for it in items:
        groups.setdefault(id(it.state.source), []).append(it)
    return groups


def _until(deadline: float, clock: str) -> Callable[[], bool]:
    return lambda: Budget.read(clock) >= deadline


def _crown(items: Sequence[Item], deadline: float, clock: str = "wall") -> None:
    """CROWN for the items' bounders (one graph) in one `crown_many` call, each stopping at `deadline`; each item's
    share of the call's time recorded. A bounder whose pass raised (an exp that may overflow) is tried alone, and what
    stopped it is kept for its turn to report (`state.failed`)."""
    todo = [it for it in items if not it.tried and it.state.level == "ibp" and it.state.failed is None]
    if not todo:
        return
    for it in todo:
        it.tried = True
        it.state.bounder.expired = _until(deadline, clock)
    t0 = _now()
    try:
        with hard_limit(deadline - Budget.read(clock), clock):
            try:
                Bounder.crown_many([it.state.bounder for it in todo])
            except Exception:
                for it in todo:
                    if it.state.bounder.crown_failed is not None:  # its pass raised: the same pass would again
                        it.state.failed = it.state.bounder.crown_failed
                    elif it.state.bounder.method == "ibp":
                        try:
                            it.state.bounder.crown()
                        except Exception as e:
                            it.state.failed = e
    except Overrun:
        pass  # the passes not finished keep sound, partial intervals; their turns run CROWN again
    share = (_now() - t0) / len(todo)
    for it in todo:
        it.seconds += share
        it.state.crowned()


def measure(items: Sequence[Item], deadline: Callable[[Item], float], network: str, clock: str = "wall") -> list[Cost]:
    """The CROWN pass of the first item of each graph among `items` (one network's), alone and timed until
    `deadline(item)` on `clock`: what one pass of that graph costs. The rest are left for `crown`."""
    costs = []
    for group in _by_graph(items).values():
        first = group[0]
        before = first.seconds
        _crown([first], deadline(first), clock)
        name = network if first.primary else f"{network}, {first.state.what}"
        costs.append(Cost(name, first.seconds - before, first.state.level != "ibp", len(group)))
    return costs


def crown(items: Sequence[Item], deadline: float, clock: str = "wall") -> None:
    """CROWN for every item still without it, batched per graph, until `deadline` on `clock`."""
    for group in _by_graph(items).values():
        _crown(group, deadline, clock)


def alpha(items: Sequence[Item], deadline: float, clock: str = "wall") -> None:
    """α-CROWN on the open rows of the items whose chain has α-CROWN (`state.alpha_rows()`), batched per graph and
    settings, the ones nearest to a proof first, until `deadline`. An item it did not finish gets α-CROWN again in its
    turn."""
    todo = [it for it in items if it.state.alpha_rows() is not None]
    todo.sort(key=lambda it: -it.state.info.get("margin_lb", float("-inf")))
    groups: dict[tuple[int, tuple[int, float]], list[Item]] = {}
    for it in todo:
        groups.setdefault((id(it.state.source), it.state.alpha), []).append(it)
    for (_, (steps, lr)), group in groups.items():
        if Budget.read(clock) >= deadline:
            return
        for it in group:
            it.state.bounder.expired = _until(deadline, clock)
        t0 = _now()
        lowers = None
        try:
            with hard_limit(deadline - Budget.read(clock), clock):
                lowers = Bounder.alpha_spec_many([(it.state.bounder, *it.state.alpha_rows()) for it in group], steps, lr)
        except Overrun:
            pass
        except Exception:  # an op whose lines are refused on this box: the item's own turn reports it
            pass
        complete = Budget.read(clock) < deadline
        share = (_now() - t0) / len(group)
        for n, it in enumerate(group):
            it.seconds += share
            if lowers is not None:
                it.state.alpha_done(lowers[n], complete)


def reached(items: Sequence[Item]) -> int:
    """How many items got a finished CROWN pass (or one that stopped for a reason other than time: its turn reports it)."""
    return sum(it.state.level != "ibp" or it.state.failed is not None for it in items)


def decided(items: Sequence[Item]) -> bool:
    """Do the items (every input box of one property) all exclude every disjunct?"""
    return bool(items) and all(not it.state.open for it in items)
