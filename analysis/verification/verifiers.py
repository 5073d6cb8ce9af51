"""The registered verifiers: ``pgd`` (attack: sat or unknown), ``ibp``, ``crown``, ``alpha-crown`` (bounds: unsat or
unknown), ``bab`` (branch and bound on unstable ReLUs, β-CROWN-style bounds, LP leaves) and ``milp`` (big-M MILP;
big-M constants and stable/unstable split from the tight bounds), both complete for ReLU networks, ``marabou``
(complete, maraboupy), ``via-relu`` (a smooth network through its ReLU version).

``auto`` (`registry.STAGED`) is CROWN, then the attack as a probe with its own small share of the property's time
(`ATTACK_SHARE`), then α-CROWN, then branch and bound on the disjuncts the bounds left open (the disjunction split,
one search per open disjunct). The bounds come first so that an attack that finds nothing never starves them (a
ViT's attack once spent the whole limit and the bound never ran). Branch and bound, not the MILP, ends the chain: it
decides the hard properties faster (docs/EXPERIMENTS.md, "Branch and bound against the MILP").

A verifier that computes bounds says what its first bound pass is (`bound_pass`: the state its links share, holding
a `bounds.Bounder`): the property loop (`harness`, `first_pass`) runs that pass for all the properties of a network
at once before any property's own turn, and the links then find the bounds computed.

Limits are named for what they are: a `Budget` counts wall-clock seconds (VNN-COMP's rule; default) or CPU
seconds of this process and its waited-for children (``clock="cpu"``). HiGHS takes its limit as wall time, so
under the CPU clock it gets the CPU seconds left as wall seconds (it stops early, never late).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from . import attack, bounds, marabou, milp, smooth_bab
from .gap import swap_gap
from .graph import Graph
from .ops.rounding import Rounding
from .problem import BOX_TOL, Budget, Problem, float32_in_box
from .refine import Refiner
from .registry import Answer, Verifier, confirmed, register_verifier


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


class _BoundsState:
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


def _state(problem: Problem, k: int, budget: Budget | None = None) -> _BoundsState:
    key = ("bounds", k)
    if key not in problem.cache:
        problem.cache[key] = _BoundsState(problem, k, budget)
    st = problem.cache[key]
    if budget is not None:
        st.bounder.expired = budget.expired
    return st


@register_verifier("ibp")
class IbpVerifier(Verifier):
    """Interval bounds, the last layer folded into the property's rows: unsat or unknown."""

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = _state(problem, k, budget)
        return st.answer("IBP", problem, st.ibp)  # interval arithmetic's own answer, whatever else ran before


@register_verifier("crown")
class CrownVerifier(Verifier):
    """CROWN: back-substitution bounds for every layer, then for the property's rows: unsat or unknown."""

    def bound_pass(self, problem: Problem, k: int) -> _BoundsState:
        return _state(problem, k)

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = _state(problem, k, budget)
        st.crown()
        return st.answer("CROWN", problem)


@register_verifier("alpha-crown")
class AlphaCrownVerifier(Verifier):
    """α-CROWN: the relaxations' slopes optimized for the property's rows (per row), intermediate bounds
    from CROWN; unsat or unknown. `intermediate`: also optimize the ReLU layers' bounds first (slower;
    worth it before a MILP, which `milp` does itself)."""

    def __init__(self, steps: int = 30, lr: float = 0.1, intermediate: bool = False) -> None:
        self.steps, self.lr, self.intermediate = int(steps), float(lr), bool(intermediate)

    def bound_pass(self, problem: Problem, k: int) -> _BoundsState:
        return _state(problem, k)

    def alpha_pass(self) -> tuple[int, float] | None:
        return None if self.intermediate else (self.steps, self.lr)

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = _state(problem, k, budget)
        st.crown()
        if st.open and st.level == "crown":
            if self.intermediate:
                st.bounder.alpha_intermediate(max(1, self.steps * 2 // 3), self.lr)
            st.alpha_done(st.bounder.alpha_spec(st.spec, st.owner, self.steps, self.lr), True)
        return st.answer("α-CROWN", problem)


@register_verifier("milp")
class MilpVerifier(Verifier):
    """The complete method for ReLU networks (`milp.solve`): big-M constants and the stable/unstable split
    from the tightest bounds available (computed here when no bound link ran before: CROWN, then α-CROWN
    for the ReLU layers), on the disjuncts the bounds left open."""

    requires = ("scipy",)

    def __init__(self, margin: float = 1e-4, lp_first: bool = True, tighten: bool = True, steps: int = 20,
                 skip_closed: bool = True) -> None:
        self.margin, self.lp_first, self.tighten, self.steps = float(margin), bool(lp_first), bool(tighten), int(steps)
        self.skip_closed = bool(skip_closed)  # False: every disjunct through the MILP, even those the bounds closed

    def bound_pass(self, problem: Problem, k: int) -> _BoundsState | None:
        return _state(problem, k) if self.tighten else None

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = _state(problem, k, budget)
        if self.tighten:
            st.crown()
        if not st.open and self.skip_closed:
            return st.answer("bounds", problem)
        if self.tighten and st.level != "alpha-milp":
            st.alpha_intermediate(self.steps)
            if not st.open and self.skip_closed:
                return st.answer("α-CROWN (intermediate)", problem)
        problem.info["unstable_tight"] = sum(st.bounder.result().unstable())
        opn = st.open if self.skip_closed else list(range(st.n))
        order = [max(float(st.lower[i]) for i, j in enumerate(st.owner) if j == d) for d in opn]
        return milp.solve(st.bounder.net, problem.specs[k], st.bounder.pre, opn, budget.left, self.margin,
                          self.lp_first, order)


@register_verifier("marabou")
class MarabouVerifier(Verifier):
    """maraboupy 2.0 in a child process on the ONNX file and the VNN-LIB file themselves (`marabou.run`);
    with `tight_bounds`, the pre-activation bounds of a bound link that ran before are handed to it."""

    requires = ("maraboupy", "onnx")

    def __init__(self, grace_s: float = 20.0, log_dir: str | Path | None = None, python: str | None = None,
                 clock: str = "wall", wall_factor: float = 20.0, tight_bounds: bool = True) -> None:
        self.grace_s, self.clock, self.wall_factor = float(grace_s), clock, float(wall_factor)
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.python, self.tight_bounds = python, tight_bounds

    @classmethod
    def available(cls) -> bool:
        return marabou.available()

    def check(self, problem: Problem, budget: Budget) -> Answer:
        if not isinstance(problem.onnx, (str, Path)) or problem.vnnlib_path is None:
            return Answer("error", message="marabou needs the ONNX and VNN-LIB files", stage=self.name)
        tight = None
        st = problem.cache.get(("bounds", 0))
        if self.tight_bounds and st is not None and len(problem.specs) == 1:
            tight = {}
            for s, k in enumerate(st.bounder.sites):
                src = getattr(st.bounder.net.nodes[k].op, "source", "")
                if src:
                    l, u = st.bounder.pre[s]
                    tight[src] = (l.tolist(), u.tolist())
        log = self.log_dir / f"{problem.vnnlib_path.stem}.marabou.log" if self.log_dir is not None else None
        status, x, msg = marabou.run(Path(problem.onnx), problem.vnnlib_path, max(budget.left(), 0.0), clock=budget.clock,
                                     grace_s=self.grace_s, wall_factor=self.wall_factor, python=self.python,
                                     log_path=log, bounds=tight)
        if status == "sat" and x is not None:
            k = next((k for k, s in enumerate(problem.specs) if s.in_box(x, BOX_TOL)), 0)
            return confirmed(problem, k, x, msg, self.name, budget.expired)
        return Answer(status, message=msg, stage=self.name)


class _ViaReluState(_BoundsState):
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


# the most of the time left that the intermediate layers' α-CROWN may take before branch and bound starts: unbounded, it
# can take half a limit the search then needs little of (docs/EXPERIMENTS.md, "Branch-and-bound settings")
INTERMEDIATE_SHARE = 0.25


@register_verifier("bab")
class BabVerifier(Verifier):
    """Branch and bound on unstable ReLUs with β-CROWN bounds (`bab.bab`), one search over every disjunct the bounds
    left open, from the tightest bounds available (computed here when no bound link ran before: CROWN, then α-CROWN
    for the ReLU layers). Complete for ReLU networks."""

    def __init__(self, batch: int = 0, bab_steps: int = 10, lr: float = 0.05, steps: int = 20, candidates: int | None = None,
                 intermediate_share: float = INTERMEDIATE_SHARE, rebound: int | None = None, refine: bool | None = None,
                 sharers: int = 1, grid_values: int | None = None) -> None:
        from .bab import Settings

        self.settings = Settings(batch=int(batch), steps=int(bab_steps), lr_alpha=float(lr), lr_beta=float(lr),
                                 sharers=int(sharers))
        if rebound is not None:  # else the search's own default (bab.Settings)
            self.settings.rebound = int(rebound)
        # MILP refinement of a deep net's early sites beside the search (`refine`); None: only when the search runs on
        # a GPU and the machine has a core for each worker's refinement beside its search (on a CPU it does not pay:
        # docs/EXPERIMENTS.md, "MILP refinement beside branch and bound")
        self.refine = refine
        self.sharers = int(sharers)
        if candidates is not None:  # else the search's own default (bab.Settings)
            self.settings.candidates = int(candidates)
        if grid_values is not None:  # else the search's own default (bab.Settings)
            self.settings.grid_values = int(grid_values)
        self.steps = int(steps)
        if not 0 < float(intermediate_share) <= 1:
            raise ValueError(f"intermediate_share must be in (0, 1], got {intermediate_share}")
        self.intermediate_share = float(intermediate_share)

    def bound_pass(self, problem: Problem, k: int) -> _BoundsState:
        return _state(problem, k)

    def refuses(self, problem: Problem) -> str | None:
        if problem.network is not None and problem.network.smooth:
            return ("branch and bound splits ReLUs and this network has smooth gates, which keep their relaxations; "
                    "to search further, verify its ReLU version (pipeline.to_relu)")
        return None

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        from . import bab

        st = _state(problem, k, budget)
        st.crown()
        if st.open:
            st.alpha_intermediate(self.steps, Budget(self.intermediate_share * budget.left(), budget.clock).expired)
        if not st.open:
            return st.answer("bounds", problem)
        problem.info["unstable_tight"] = sum(st.bounder.result().unstable())
        opn = st.open
        b, spec = st.bounder, problem.specs[k]
        if problem.network.num_relus == 0 and smooth_bab.sites(b):  # a network of smooth activations: split their intervals
            status, x, msg, stats = smooth_bab.search(b, spec, opn, budget.expired,
                                                      lambda x: problem.confirm(k, x, budget.expired)[0])
            problem.info["bab_domains"] = stats["domains"]
            return status, x, f"{len(opn)} open disjuncts: {msg}"
        refiner = None
        auto = b.device.type == "cuda" and (os.cpu_count() or 1) >= 2 * self.sharers
        if (self.refine if self.refine is not None else auto) and Refiner.worth_it(b):
            rows, _ = bounds.Spec.from_disjuncts([spec.disjuncts[d] for d in opn], b.device)
            refiner = Refiner(b, rows.C, budget.left).start()
        try:
            # a stage budget's next turn on this problem goes on from the domains this one leaves open
            status, x, msg, stats = bab.bab(b, spec, opn, budget.expired, budget.left, self.settings,
                                            lambda x: problem.confirm(k, x, budget.expired)[0], refiner,
                                            problem.cache.setdefault(("bab", k), {}))
        finally:
            if refiner is not None:
                refiner.stop()
        problem.info["bab_domains"] = stats["domains"]
        if stats.get("global_lower") is not None:  # how near it came: the order of a stage budget's later rounds
            problem.info["bab_lower"] = float(stats["global_lower"])
        if "grid_splits" in stats:
            problem.info["bab_grid_splits"] = stats["grid_splits"]
        if refiner is not None:
            problem.info["refine"] = dict(refiner.stats)
            r = refiner.stats
            msg += f"; MILP refinement of the early sites: {r['units']} units, {r['tightened']} tightened"
        return status, x, f"{len(opn)} open disjuncts: {msg}"
