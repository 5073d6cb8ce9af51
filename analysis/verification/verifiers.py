"""The registered verifiers, one module per kind: here the bound links ``ibp``, ``crown``, ``alpha-crown`` (unsat or
unknown) and ``via-relu`` (a smooth network through its ReLU version), with the state they share (`BoundsState`);
``pgd`` (attack: sat or unknown) in `pgd_verifier`; ``bab`` (branch and bound on unstable ReLUs, β-CROWN-style
bounds, LP leaves) and ``milp`` (big-M MILP), both complete for ReLU networks, and ``marabou`` (complete, maraboupy) in
`complete_verifiers`.

``auto`` (`registry.STAGED`) is CROWN, then the attack as a probe with its own small share of the property's time
(`pgd_verifier.ATTACK_SHARE`), then α-CROWN, then branch and bound on the disjuncts the bounds left open (the
disjunction split, one search per open disjunct). The bounds come first so that an attack that finds nothing never
starves them (a ViT's attack once spent the whole limit and the bound never ran). Branch and bound, not the MILP, ends
the chain: it decides the hard properties faster (docs/EXPERIMENTS.md, "Branch and bound against the MILP").

A verifier that computes bounds says what its first bound pass is (`bound_pass`: the state its links share, holding
a `bounds.Bounder`): the property loop (`harness`, `first_pass`) runs that pass for all the properties of a network
at once before any property's own turn, and the links then find the bounds computed.

Limits are named for what they are: a `Budget` counts wall-clock seconds (VNN-COMP's rule; default) or CPU
seconds of this process and its waited-for children (``clock="cpu"``). HiGHS takes its limit as wall time, so
under the CPU clock it gets the CPU seconds left as wall seconds (it stops early, never late).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from . import bounds
from .gap import swap_gap
from .graph import Graph
from .problem import Budget, Problem
from .registry import Verifier, register_verifier


class BoundsState:
    """What the bound links leave for the next: the Bounder, the rows' best lower bounds, the open disjuncts. It is
    also a property's first bound pass (`Verifier.bound_pass`, batched by `first_pass`): its `bounder` gets CROWN
    with the other properties of the network, then `crowned()` takes the bounds; `alpha_rows()` are the rows its
    chain's α-CROWN would optimize. `problem.info` records the best finished pass ("bound") and its margin bound."""

    what = "CROWN"

    def __init__(self, problem: Problem, k: int, budget: Budget | None = None, graph: Graph | None = None):
        spec = problem.specs[k]
        self.info = problem.info
        # the graph its bounder is built from (the problem's network unless a verifier bounds another one);
        # `first_pass` batches the bounders of one graph
        self.source = problem.network if graph is None else graph
        self.bounder = bounds.Bounder(self.source, spec.lb, spec.ub, budget.expired if budget is not None else None)
        self.spec, self.owner = bounds.Spec.from_disjuncts(spec.disjuncts, self.bounder.device)
        self.n = len(spec.disjuncts)
        self.ibp = self.bounder.ibp_spec(self.spec)
        self.lower = self.ibp
        self.level = "ibp"
        self.alpha: tuple[int, float] | None = None  # (steps, lr) of the chain's α-CROWN, for the first pass
        self.failed: Exception | None = None  # what stopped CROWN in the first pass (an exp that may overflow)
        problem.info["unstable_ibp"] = sum(self.bounder.result().unstable("ibp"))
        problem.info["relus"] = self.source.num_relus
        self._record()

    def _record(self) -> None:
        self.info["bound"] = self.level
        self.info["margin_lb"] = float(self._margin())
        self.info["unstable_tight"] = sum(self.bounder.result().unstable())

    def update(self, lower: torch.Tensor) -> None:
        self.lower = torch.maximum(self.lower, lower)
        self._record()

    def crown(self) -> None:
        """CROWN bounds for every layer and the rows, once per property (later links start from them)."""
        if self.failed is not None:
            raise self.failed
        if self.level == "ibp":
            self.bounder.crown()
            self.crowned()

    def crowned(self) -> None:
        """Take the bounds of a CROWN pass that finished (a pass stopped by its budget left sound, partial intervals)."""
        if self.level == "ibp" and self.bounder.method != "ibp":
            self.level = "crown"
            self.update(self.bounder.spec_bounds(self.spec))

    def alpha_rows(self) -> tuple[bounds.Spec, list[int]] | None:
        """The rows α-CROWN optimizes next (None: its chain has no α-CROWN, CROWN did not finish, or nothing is open)."""
        return (self.spec, self.owner) if self.alpha is not None and self.level == "crown" and self.open else None

    def alpha_done(self, lower: torch.Tensor, complete: bool) -> None:
        """Take α-CROWN's bounds; `complete`: it ran its steps (else a later α-CROWN link runs it again)."""
        self.update(lower)
        if complete:
            self.level = "alpha-crown"
            self._record()

    def alpha_intermediate(self, steps: int, until: Callable[[], bool] | None = None) -> None:
        """α-CROWN-optimized bounds of the ReLU layers (what a MILP's big-M and a branch need), once: a call stopped
        by the budget or `until()` leaves the sites not reached to a later call (the next turn of a stage budget)."""
        if self.level != "alpha-milp":
            done = self.bounder.alpha_intermediate(steps, until=until)
            self.update(self.bounder.spec_bounds(self.spec))
            if done:
                self.level = "alpha-milp"
                self._record()

    @property
    def open(self) -> list[int]:
        ex = bounds.excluded(self.lower, self.owner, self.n)
        return [d for d in range(self.n) if not ex[d]]

    def answer(self, what: str, problem: Problem, lower: torch.Tensor | None = None) -> tuple[str, None, str]:
        """The answer the bounds give: `lower` (default: the best rows' bounds so far) decides it."""
        lower = self.lower if lower is None else lower
        problem.info["unstable_tight"] = sum(self.bounder.result().unstable())
        ex = bounds.excluded(lower, self.owner, self.n)
        margin = self._margin(lower)
        if all(ex):
            return "unsat", None, f"{what}: every disjunct excluded (smallest margin {margin:.4g})"
        return "unknown", None, f"{what}: {ex.count(False)}/{self.n} disjuncts open ({self._smallest(margin)})"

    @property
    def stage(self) -> str:
        """The link whose bounds these are (the stage a first-pass answer names)."""
        return self.level

    def verdict(self) -> str:
        """What the bounds found so far, in one phrase (the first pass's answer when they decide the property)."""
        name = {"ibp": "IBP", "crown": "CROWN", "alpha-crown": "α-CROWN"}.get(self.level, self.level)
        opn = self.open
        if not opn:
            return f"{name}: every disjunct excluded (smallest margin {self._margin():.4g})"
        return f"{name}: {len(opn)}/{self.n} disjuncts open ({self._smallest(self._margin())})"

    def _smallest(self, margin: float) -> str:
        """"smallest margin m"; a margin with no finite bound (an int8 LayerNorm's float32 error unbounded on rows the
        output reads, an unknown unit's ±`bounds.UNKNOWN`) says so, with the LayerNorm's rows when it is one."""
        if not bounds.unbounded_below(margin):
            return f"smallest margin {margin:.4g}"
        why = self.bounder.why_unbounded()
        return "smallest margin unbounded below" + (f": {why}" if why else "")

    def _margin(self, lower: torch.Tensor | None = None) -> float:
        """The best row of the hardest disjunct: > 0 proves the property."""
        best = [-np.inf] * self.n
        for v, j in zip((self.lower if lower is None else lower).tolist(), self.owner):
            best[j] = max(best[j], v)
        return min(best)


def bound_state(problem: Problem, k: int, budget: Budget | None = None) -> BoundsState:
    key = ("bounds", k)
    if key not in problem.cache:
        problem.cache[key] = BoundsState(problem, k, budget)
    st = problem.cache[key]
    if budget is not None:
        st.bounder.expired = budget.expired
    return st


@register_verifier("ibp")
class IbpVerifier(Verifier):
    """Interval bounds, the last layer folded into the property's rows: unsat or unknown."""

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = bound_state(problem, k, budget)
        return st.answer("IBP", problem, st.ibp)  # interval arithmetic's own answer, whatever else ran before


@register_verifier("crown")
class CrownVerifier(Verifier):
    """CROWN: back-substitution bounds for every layer, then for the property's rows: unsat or unknown."""

    def bound_pass(self, problem: Problem, k: int) -> BoundsState:
        return bound_state(problem, k)

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = bound_state(problem, k, budget)
        st.crown()
        return st.answer("CROWN", problem)


@register_verifier("alpha-crown")
class AlphaCrownVerifier(Verifier):
    """α-CROWN: the relaxations' slopes optimized for the property's rows (per row), intermediate bounds
    from CROWN; unsat or unknown. `intermediate`: also optimize the ReLU layers' bounds first (slower;
    worth it before a MILP, which `milp` does itself)."""

    def __init__(self, steps: int = 30, lr: float = 0.1, intermediate: bool = False) -> None:
        self.steps, self.lr, self.intermediate = int(steps), float(lr), bool(intermediate)

    def bound_pass(self, problem: Problem, k: int) -> BoundsState:
        return bound_state(problem, k)

    def alpha_pass(self) -> tuple[int, float] | None:
        return None if self.intermediate else (self.steps, self.lr)

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = bound_state(problem, k, budget)
        st.crown()
        if st.open and st.level == "crown":
            if self.intermediate:
                st.bounder.alpha_intermediate(max(1, self.steps * 2 // 3), self.lr)
            st.alpha_done(st.bounder.alpha_spec(st.spec, st.owner, self.steps, self.lr), True)
        return st.answer("α-CROWN", problem)


class _ViaReluState(BoundsState):
    """The via-relu route's bounds: those of the smooth network's ReLU version (`Graph.relu_version`, same weights) on
    the property's box, as a first bound pass like any other; the margin it records is the smooth network's (the
    ReLU version's rows minus their |smooth − ReLU| gap)."""

    what = "CROWN on the ReLU version"
    stage = "via-relu"

    def __init__(self, problem: Problem, k: int, relu: Graph):
        self.smooth = problem.network
        super().__init__(problem, k, graph=relu)

    def margins(self, lower: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the smooth network's row bounds: the ReLU version's minus Σ_k |C_rk|·Δ_k, the gap Δ per output)."""
        gap = swap_gap(self.smooth, self.bounder.pre)
        return (self.lower if lower is None else lower) - self.spec.C.abs() @ gap, gap

    def _record(self) -> None:
        self.info["bound"] = self.level
        margin, gap = self.margins()
        self.info["margin_lb"] = float(self._margin(margin))
        self.info["gap_max"] = float(gap.max())

    @property
    def open(self) -> list[int]:
        ex = bounds.excluded(self.margins()[0], self.owner, self.n)
        return [d for d in range(self.n) if not ex[d]]

    def verdict(self) -> str:
        method = {"ibp": "IBP", "crown": "CROWN", "alpha-crown": "α-CROWN"}.get(self.level, self.level)
        margin, gap = self.margins()
        return (f"ReLU version's margin by {method} minus the |smooth − ReLU| bound (largest {float(gap.max()):.3g}): "
                f"smallest {self._margin(margin):.4g}")


@register_verifier("via-relu")
class ViaReluVerifier(Verifier):
    """A certificate for a smooth network through its ReLU version (same weights, every gate → ReLU):
    the ReLU network's lower bound of each row A_r y − b_r (CROWN, then α-CROWN where needed) minus
    Σ_k |A_rk|·Δ_k, Δ = `swap_gap` (a sound bound on |smooth − ReLU| per output over the box, from the
    ReLU network's pre-activation bounds). unsat when that stays > 0 for a row of every disjunct; else
    unknown (never sat: a ReLU counterexample says nothing about the smooth network)."""

    def __init__(self, steps: int = 20, lr: float = 0.1) -> None:
        self.steps, self.lr = int(steps), float(lr)
        self._relu: dict[int, tuple[Graph, Graph]] = {}  # id(smooth graph) → (it, its ReLU version): one per network

    def bound_pass(self, problem: Problem, k: int) -> _ViaReluState:
        key = ("via-relu", k)
        if key not in problem.cache:
            smooth = problem.network
            if id(smooth) not in self._relu:
                self._relu[id(smooth)] = (smooth, smooth.relu_version())
            problem.cache[key] = _ViaReluState(problem, k, self._relu[id(smooth)][1])
        return problem.cache[key]

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = self.bound_pass(problem, k)
        b, rows, owner, n = st.bounder, st.spec, st.owner, st.n
        b.expired = budget.expired
        st.crown()
        if st.level == "ibp":
            return "timeout", None, f"{st.verdict()}; CROWN did not finish in its time"
        margin, gap = st.margins()
        # α-CROWN tightens the margin and the intervals (so the gap) by tens of percent, not by orders of magnitude:
        # hopeless when, for some disjunct, every row's gap term exceeds twice its ReLU margin bound (GELU, λ = 1)
        term = rows.C.abs() @ gap
        beyond = [True] * n
        for v, t, j in zip(st.lower.tolist(), term.tolist(), owner):
            beyond[j] = beyond[j] and t > 2 * abs(v)
        hopeless = any(beyond)
        if st.level == "crown" and not all(bounds.excluded(margin, owner, n)) and not hopeless and not budget.expired():
            b.alpha_intermediate(self.steps, self.lr)  # tighter intervals shrink the gap too
            st.alpha_done(b.alpha_spec(rows, owner, self.steps, self.lr), not budget.expired())
            margin, gap = st.margins()
        problem.info.update(relu_margin_lb=float(st.lower.max()), unstable_tight=sum(b.result().unstable()))
        return ("unsat" if all(bounds.excluded(margin, owner, n)) else "unknown"), None, st.verdict()
