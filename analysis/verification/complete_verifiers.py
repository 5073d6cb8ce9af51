"""The complete links: ``milp`` (big-M MILP; big-M constants and the stable/unstable split from the tight bounds),
``bab`` (branch and bound on unstable ReLUs, β-CROWN-style bounds, LP leaves; on smooth activations' input intervals
for a network without ReLUs), both complete for ReLU networks, and ``marabou`` (maraboupy in a child process). The
first two start from the bound links' shared state (`verifiers.bound_state`) and tighten it first."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from . import bounds, input_bab, marabou, milp, smooth_bab
from .problem import BOX_TOL, Budget, Problem
from .refine import Refiner
from .registry import Answer, Verifier, confirmed, register_verifier
from .verifiers import BoundsState, bound_state


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

    def bound_pass(self, problem: Problem, k: int) -> BoundsState | None:
        return bound_state(problem, k) if self.tighten else None

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        st = bound_state(problem, k, budget)
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


# the most of the time left that the intermediate layers' α-CROWN may take before branch and bound starts: unbounded, it
# can take half a limit the search then needs little of (docs/EXPERIMENTS.md, "Branch-and-bound settings")
INTERMEDIATE_SHARE = 0.25
# on a network of few inputs (`input_bab.MAX_INPUTS`): the search over ReLU splits first takes at most this share of the
# time left, then the input search (`input_bab`) at most INPUT_SHARE of what is left, then the ReLU search goes on.
# Which one decides depends on the net: ACAS Xu's prop_1 falls to the input search in 0.4 s and not to 30 s of ReLU
# splits; a 2-input TLL net the other way round, 0.4 s against 15 s. A net the first ReLU turn leaves open is most
# often one for the box's splits: 10 of 11 ACAS Xu rows at 0.8, 9 at 0.5 (benchmarks/peers/vnncomp23-sample-30s/)
RELU_FIRST_SHARE = 0.2
INPUT_SHARE = 0.8


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

    def bound_pass(self, problem: Problem, k: int) -> BoundsState:
        return bound_state(problem, k)

    def refuses(self, problem: Problem) -> str | None:
        if problem.network is not None and problem.network.smooth:
            return ("branch and bound splits ReLUs and this network has smooth gates, which keep their relaxations; "
                    "to search further, verify its ReLU version (pipeline.to_relu)")
        return None

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        from . import bab

        st = bound_state(problem, k, budget)
        st.crown()
        if st.open:
            st.alpha_intermediate(self.steps, Budget(self.intermediate_share * budget.left(), budget.clock).expired)
        if not st.open:
            return st.answer("bounds", problem)
        problem.info["unstable_tight"] = sum(st.bounder.result().unstable())
        opn = st.open
        b, spec = st.bounder, problem.specs[k]
        if problem.network.num_relus == 0 and smooth_bab.sites(b):  # a network of smooth activations: split their intervals
            # the rows' α-CROWN again on the intervals α-CROWN tightened (a fraction of a second, often decisive)
            st.update(b.alpha_spec(st.spec, st.owner))
            if not st.open:
                return st.answer("α-CROWN (intermediate)", problem)
            opn = st.open
            prior = torch.cat([st.lower[[i for i, o in enumerate(st.owner) if o == d]] for d in opn])
            status, x, msg, stats = smooth_bab.search(b, spec, opn, budget.expired,
                                                      lambda x: problem.confirm(k, x, budget.expired)[0], prior=prior)
            problem.info["bab_domains"] = stats["domains"]
            return status, x, f"{len(opn)} open disjuncts: {msg}"
        refiner = None
        auto = b.device.type == "cuda" and (os.cpu_count() or 1) >= 2 * self.sharers
        if (self.refine if self.refine is not None else auto) and Refiner.worth_it(b):
            rows, _ = bounds.Spec.from_disjuncts([spec.disjuncts[d] for d in opn], b.device)
            refiner = Refiner(b, rows.C, budget.left).start()
        confirm = lambda x: problem.confirm(k, x, budget.expired)[0]  # noqa: E731
        # a stage budget's next turn on this problem goes on from the domains this one leaves open, and so does the
        # turn after the input search here
        cache = problem.cache.setdefault(("bab", k), {})
        try:
            status = "timeout"  # no search has run yet
            if problem.network.num_inputs <= input_bab.MAX_INPUTS:  # a few inputs: the box's splits may be the way
                turn = Budget(RELU_FIRST_SHARE * budget.left(), budget.clock)
                status, x, msg, stats = bab.bab(b, spec, opn, turn.expired, turn.left, self.settings, confirm, refiner, cache)
                if status not in ("sat", "unsat"):
                    share = Budget(INPUT_SHARE * budget.left(), budget.clock)
                    found, x, msg, boxes = input_bab.search(problem.network, spec, opn, share.expired, confirm)
                    problem.info["input_boxes"] = boxes["boxes"]
                    if found in ("sat", "unsat"):
                        return found, x, f"{len(opn)} open disjuncts: {msg}"
            if status not in ("sat", "unsat"):
                status, x, msg, stats = bab.bab(b, spec, opn, budget.expired, budget.left, self.settings, confirm,
                                                refiner, cache)
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
