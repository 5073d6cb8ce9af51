"""The registered verifiers: ``pgd`` (attack: sat or unknown), ``ibp``, ``crown``, ``alpha-crown`` (bounds: unsat or
unknown), ``bab`` (branch and bound on unstable ReLUs, β-CROWN-style bounds, LP leaves) and ``milp`` (big-M MILP;
big-M constants and stable/unstable split from the tight bounds), both complete for ReLU networks, ``marabou``
(complete, maraboupy), ``via-relu`` (a smooth network through its ReLU version).

``auto`` (`registry.STAGED`) is the attack, then CROWN, then α-CROWN, then branch and bound on the disjuncts the
bounds left open (the disjunction split, one search per open disjunct). Branch and bound replaced the MILP there
by measurement: on the default model's hardest ε = 0.005 properties (300+ unstable ReLUs) it decided in 1.6 s and
14 s what the MILP did in 32 s and not within 60 s; on digits MLPs it was 1.2–3x faster.

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

from . import attack, bounds, marabou, milp
from .refine import Refiner
from .problem import BOX_TOL, Budget, Problem
from .registry import Answer, Verifier, confirmed, register_verifier


@register_verifier("pgd")
class PgdVerifier(Verifier):
    """Attack only (`attack.pgd`): sat with a counterexample, else unknown (never unsat)."""

    def __init__(self, steps: int = 40, restarts: int = 2, margin: float = 1e-4, seed: int = 0) -> None:
        self.steps, self.restarts, self.margin, self.seed = int(steps), int(restarts), float(margin), seed

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        spec = problem.specs[k]
        x, v = attack.pgd(problem.network, spec, self.steps, self.restarts, self.margin, self.seed, budget.expired)
        if x is not None:
            return "sat", x, "PGD counterexample"
        return "unknown", None, f"PGD ({self.steps} steps, {self.restarts + 1} starts per disjunct): best margin {v:.4g}"


class _BoundsState:
    """What the bound links leave for the next: the Bounder, the rows' best lower bounds, the open disjuncts."""

    def __init__(self, problem: Problem, k: int, budget: Budget):
        spec = problem.specs[k]
        self.bounder = bounds.Bounder(problem.network, spec.lb, spec.ub, budget.expired)
        self.spec, self.owner = bounds.Spec.from_disjuncts(spec.disjuncts, self.bounder.device)
        self.n = len(spec.disjuncts)
        self.lower = self.bounder.ibp_spec(self.spec)
        self.level = "ibp"
        problem.info["unstable_ibp"] = sum(self.bounder.result().unstable("ibp"))
        problem.info["relus"] = problem.network.num_relus

    def update(self, lower: torch.Tensor) -> None:
        self.lower = torch.maximum(self.lower, lower)

    def crown(self) -> None:
        """CROWN bounds for every layer and the rows, once per property (later links start from them)."""
        if self.level == "ibp":
            self.bounder.crown()
            self.update(self.bounder.spec_bounds(self.spec))
            self.level = "crown"

    def alpha_intermediate(self, steps: int, until: Callable[[], bool] | None = None) -> None:
        """α-CROWN-optimized bounds of the ReLU layers (what a MILP's big-M and a branch need), once: a call stopped
        by the budget or `until()` leaves the sites not reached to a later call (the next turn of a stage budget)."""
        if self.level != "alpha-milp":
            done = self.bounder.alpha_intermediate(steps, until=until)
            self.update(self.bounder.spec_bounds(self.spec))
            if done:
                self.level = "alpha-milp"

    @property
    def open(self) -> list[int]:
        ex = bounds.excluded(self.lower, self.owner, self.n)
        return [d for d in range(self.n) if not ex[d]]

    def answer(self, what: str, problem: Problem) -> tuple[str, None, str]:
        problem.info["unstable_tight"] = sum(self.bounder.result().unstable())
        problem.info["margin_lb"] = float(self._margin())
        opn = self.open
        if not opn:
            return "unsat", None, f"{what}: every disjunct excluded (smallest margin {self._margin():.4g})"
        return "unknown", None, f"{what}: {len(opn)}/{self.n} disjuncts open (smallest margin {self._margin():.4g})"

    def _margin(self) -> float:
        """The best row of the hardest disjunct: > 0 proves the property."""
        best = [-np.inf] * self.n
        for v, j in zip(self.lower.tolist(), self.owner):
            best[j] = max(best[j], v)
        return min(best)


def _state(problem: Problem, k: int, budget: Budget) -> _BoundsState:
    key = ("bounds", k)
    if key not in problem.cache:
        problem.cache[key] = _BoundsState(problem, k, budget)
    st = problem.cache[key]
    st.bounder.expired = budget.expired
    return st


@register_verifier("ibp")
class IbpVerifier(Verifier):
    """Interval bounds, the last layer folded into the property's rows: unsat or unknown."""

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = _state(problem, k, budget)
        return st.answer("IBP", problem)


@register_verifier("crown")
class CrownVerifier(Verifier):
    """CROWN: back-substitution bounds for every layer, then for the property's rows: unsat or unknown."""

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

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = _state(problem, k, budget)
        st.crown()
        if st.open and st.level == "crown":
            if self.intermediate:
                st.bounder.alpha_intermediate(max(1, self.steps * 2 // 3), self.lr)
            st.update(st.bounder.alpha_spec(st.spec, st.owner, self.steps, self.lr))
            st.level = "alpha-crown"
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


@register_verifier("via-relu")
class ViaReluVerifier(Verifier):
    """A certificate for a smooth network through its ReLU version (same weights, every gate → ReLU):
    the ReLU network's lower bound of each row A_r y − b_r (CROWN, then α-CROWN where needed) minus
    Σ_k |A_rk|·Δ_k, Δ = `bounds.swap_gap` (a sound bound on |smooth − ReLU| per output over the box, from the
    ReLU network's pre-activation bounds). unsat when that stays > 0 for a row of every disjunct; else
    unknown (never sat: a ReLU counterexample says nothing about the smooth network)."""

    def __init__(self, steps: int = 20, lr: float = 0.1) -> None:
        self.steps, self.lr = int(steps), float(lr)

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        smooth = problem.network
        spec = problem.specs[k]
        b = bounds.Bounder(smooth.relu_version(), spec.lb, spec.ub, budget.expired)
        rows, owner = bounds.Spec.from_disjuncts(spec.disjuncts, b.device)
        b.crown()
        lower = b.spec_bounds(rows)
        n = len(spec.disjuncts)

        def certified(lower: torch.Tensor) -> tuple[list[bool], torch.Tensor, torch.Tensor]:
            gap = bounds.swap_gap(smooth, b.pre)
            margin = lower - rows.C.abs() @ gap
            return bounds.excluded(margin, owner, n), margin, gap

        ex, margin, gap = certified(lower)
        method = "CROWN"
        # α-CROWN tightens the margin and the intervals (so the gap) by tens of percent, not by orders of magnitude:
        # hopeless when, for some disjunct, every row's gap term exceeds twice its ReLU margin bound (GELU, λ = 1)
        term = rows.C.abs() @ gap
        beyond = [True] * n
        for v, t, j in zip(lower.tolist(), term.tolist(), owner):
            beyond[j] = beyond[j] and t > 2 * abs(v)
        hopeless = any(beyond)
        if not all(ex) and not hopeless and not budget.expired():
            b.alpha_intermediate(self.steps, self.lr)  # tighter intervals shrink the gap too
            lower = torch.maximum(lower, b.alpha_spec(rows, owner, self.steps, self.lr))
            ex, margin, gap = certified(lower)
            method = "α-CROWN"
        best = [-np.inf] * n
        for v, j in zip(margin.tolist(), owner):
            best[j] = max(best[j], v)
        problem.info.update(margin_lb=float(min(best)), gap_max=float(gap.max()), relu_margin_lb=float(lower.max()),
                            unstable_tight=sum(b.result().unstable()))
        what = (f"ReLU version's margin by {method} minus the |smooth − ReLU| bound (largest {float(gap.max()):.3g}): "
                f"smallest {min(best):.4g}")
        return ("unsat" if all(ex) else "unknown"), None, what


# the most of the time left that the intermediate layers' α-CROWN may take before branch and bound starts: on the 2-block
# ResNet stand-in it took 15 s of a 30 s limit where branch and bound then needed 0.4 s (benchmarks/VERIFICATION.md)
INTERMEDIATE_SHARE = 0.25


@register_verifier("bab")
class BabVerifier(Verifier):
    """Branch and bound on unstable ReLUs with β-CROWN bounds (`bab.bab`), one search over every disjunct the bounds
    left open, from the tightest bounds available (computed here when no bound link ran before: CROWN, then α-CROWN
    for the ReLU layers). Complete for ReLU networks."""

    def __init__(self, batch: int = 0, bab_steps: int = 10, lr: float = 0.05, steps: int = 20, candidates: int | None = None,
                 intermediate_share: float = INTERMEDIATE_SHARE, rebound: int | None = None, refine: bool | None = None,
                 sharers: int = 1) -> None:
        from .bab import Settings

        self.settings = Settings(batch=int(batch), steps=int(bab_steps), lr_alpha=float(lr), lr_beta=float(lr),
                                 sharers=int(sharers))
        if rebound is not None:  # else the search's own default (bab.Settings)
            self.settings.rebound = int(rebound)
        # MILP refinement of a deep net's early sites beside the search (`refine`); None: only when the search runs on
        # a GPU and the machine has a core for each worker's refinement beside its search (on 2 cores at 30 s it did
        # not pay, benchmarks/VERIFICATION.md)
        self.refine = refine
        self.sharers = int(sharers)
        if candidates is not None:  # else the search's own default (bab.Settings)
            self.settings.candidates = int(candidates)
        self.steps = int(steps)
        if not 0 < float(intermediate_share) <= 1:
            raise ValueError(f"intermediate_share must be in (0, 1], got {intermediate_share}")
        self.intermediate_share = float(intermediate_share)

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
        if refiner is not None:
            problem.info["refine"] = dict(refiner.stats)
            r = refiner.stats
            msg += f"; MILP refinement of the early sites: {r['units']} units, {r['tightened']} tightened"
        return status, x, f"{len(opn)} open disjuncts: {msg}"
