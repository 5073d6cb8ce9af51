"""Results, time budgets, the Verifier base class, the registry, and the staged chain.

Every verifier answers one property (a network and a VNN-LIB file, or a network and parsed specs) with a
`Result` in VNN-COMP's words: ``unsat`` (proved: no counterexample in the box), ``sat`` (a counterexample,
re-checked before it is reported), ``timeout``, ``unknown`` (an incomplete method could not decide),
``error``. A certificate is about the network given: the float ONNX graph (evaluated in float64 with its
float32 weights), not an int8 model.

Registered verifiers (`VERIFIERS`): ``pgd`` (attack: sat or unknown), ``ibp``, ``crown``, ``alpha-crown``
(bounds: unsat or unknown), ``bab`` (branch and bound on unstable ReLUs, β-CROWN-style bounds, LP leaves) and
``milp`` (big-M MILP; big-M constants and stable/unstable split from the tight bounds), both complete for ReLU
networks, ``marabou`` (complete, maraboupy), ``via-relu`` (a smooth network through its ReLU version).
A chain ``a+b+…`` runs them in order on one shared `Problem` until one answers sat or unsat, under one
budget; later links reuse what earlier ones computed (the bounds, the disjuncts still open). ``auto`` is
the staged chain `STAGED`: the attack, then CROWN, then α-CROWN, then branch and bound on the disjuncts the
bounds left open (the disjunction split, one search per open disjunct). Branch and bound replaced the MILP
there by measurement: on the default model's hardest ε = 0.005 properties (300+ unstable ReLUs) it decided in
1.6 s and 14 s what the MILP did in 32 s and not within 60 s; on digits MLPs it was 1.2–3x faster.

Limits are named for what they are: a `Budget` counts wall-clock seconds (VNN-COMP's rule; default) or
CPU seconds of this process and its waited-for children (``clock="cpu"``). HiGHS takes its limit as wall
time, so under the CPU clock it gets the CPU seconds left as wall seconds (it stops early, never late).
"""

from __future__ import annotations

import importlib.util
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from . import attack, bounds, marabou, milp
from .network import Linear, Network, ReLU, UnsupportedModel, read
from .vnnlib import VnnlibSpec, read_vnnlib_all

RESULTS: tuple[str, ...] = ("sat", "unsat", "timeout", "unknown", "error")
DECISIVE = ("sat", "unsat")
CLOCKS = ("wall", "cpu")
STAGED = "pgd+crown+alpha-crown+bab"

# A counterexample may sit this far outside the box (solvers work in double, ONNX in float32) ...
BOX_TOL = 1e-6
# ... and this far on the safe side of the unsafe set, relative to max(1, |y|_inf): solvers return points on
# the boundary A y = b, which float32 inference can round either way.
OUTPUT_TOL = 1e-5


@dataclass(frozen=True, eq=False)
class Result:
    status: str
    seconds: float = 0.0  # wall
    counterexample: np.ndarray | None = None  # flat input x
    output: np.ndarray | None = None  # the re-checked model's output at x (the witness's Y values)
    message: str = ""
    stage: str = ""  # the link of a chain that answered
    cpu_seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in RESULTS:
            raise ValueError(f"status {self.status!r} is not one of {RESULTS}")


class Budget:
    """Seconds left on one clock: "wall" (time.perf_counter) or "cpu" (this process and its waited-for children)."""

    def __init__(self, seconds: float, clock: str = "wall"):
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
        self.seconds, self.clock = float(seconds), clock
        self.start = self.now()

    def now(self) -> float:
        if self.clock == "wall":
            return time.perf_counter()
        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + ch.ru_utime + ch.ru_stime

    def used(self) -> float:
        return self.now() - self.start

    def left(self) -> float:
        return self.seconds - self.used()

    def expired(self) -> bool:
        return self.left() <= 0


def cpu_now() -> float:
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


class Problem:
    """One property: the network (read lazily from `onnx`), its specs (one per input box), and a cache the
    links of a chain share. `recheck(x) -> y` evaluates a candidate counterexample on the model the
    certificate is about (onnxruntime for an ONNX file; the float64 network otherwise)."""

    def __init__(self, specs: Sequence[VnnlibSpec], network: Network | None = None, onnx: Any = None,
                 vnnlib_path: Path | None = None, recheck: Callable[[np.ndarray], np.ndarray] | None = None):
        self.specs = list(specs)
        self._network = network
        self.onnx = onnx
        self.vnnlib_path = vnnlib_path
        self._recheck = recheck
        self.cache: dict[Any, Any] = {}
        self.info: dict[str, Any] = {}

    @property
    def network(self) -> Network:
        if self._network is None:
            if self.onnx is None:
                raise UnsupportedModel("no network given")
            self._network = read(self.onnx)
            self.info.setdefault("relus", self._network.num_relus)
        return self._network

    def recheck(self, x: np.ndarray) -> np.ndarray:
        if self._recheck is not None:
            return np.asarray(self._recheck(x), dtype=np.float64).reshape(-1)
        if isinstance(self.onnx, (str, Path)):
            from quantize import ort as ort_util

            if "session" not in self.cache:
                self.cache["session"] = ort_util.session(self.onnx)
            return ort_util.forward_flat(self.cache["session"], x)
        return self.network.forward(x).numpy()

    @classmethod
    def from_files(cls, onnx_path: Any, vnnlib_path: Path) -> "Problem":
        return cls(read_vnnlib_all(vnnlib_path), onnx=onnx_path, vnnlib_path=Path(vnnlib_path))


def check_counterexample(problem: Problem, spec: VnnlibSpec, x: np.ndarray, box_tol: float = BOX_TOL,
                         output_tol: float = OUTPUT_TOL) -> tuple[bool, str, np.ndarray | None]:
    """Is x in the box (within box_tol) and mapped by the model (`problem.recheck`) into the unsafe set
    (within output_tol·max(1, |y|∞))? (ok, explanation, y)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.size != spec.num_inputs:
        return False, f"counterexample has {x.size} inputs, the property {spec.num_inputs}", None
    outside = float(np.max(np.maximum(spec.lb - x, 0.0) + np.maximum(x - spec.ub, 0.0)))
    if outside > box_tol:
        return False, f"counterexample lies {outside:.3g} outside the input box (tolerance {box_tol:g})", None
    y = problem.recheck(x)
    if y.size != spec.num_outputs:
        return False, f"model has {y.size} outputs, the property {spec.num_outputs}", None
    viol = spec.violation(y)
    tol = output_tol * max(1.0, float(np.max(np.abs(y))))
    if viol > tol:
        return False, (f"re-checked output is not unsafe: margin {viol:.3g} > tolerance {tol:.3g} "
                       f"(y = {np.array2string(y, precision=6)})"), y
    return True, f"re-check confirms: unsafe margin {viol:.3g}, box excess {outside:.3g}", y


# ---------------------------------------------------------------------------------------------
# the base class


class Verifier:
    """Subclasses implement `solve(problem, k, budget)` for spec k of a problem (or `check` for the whole
    problem). `verify`/`run` time it, turn exceptions into ``error``, re-check every counterexample."""

    name: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()  # importable modules this verifier needs

    @classmethod
    def available(cls) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in cls.requires)

    def verify(self, onnx_path: Any, vnnlib_path: str | Path, timeout_s: float, clock: str = "wall") -> Result:
        """One property from files (onnx: a path, bytes or a ModelProto)."""
        start, cpu0 = time.perf_counter(), cpu_now()
        try:
            problem = Problem.from_files(onnx_path, Path(vnnlib_path))
        except Exception as e:
            return Result("error", time.perf_counter() - start, message=_one_line(e), cpu_seconds=cpu_now() - cpu0)
        return self.run(problem, Budget(timeout_s, clock))

    def run(self, problem: Problem, budget: Budget) -> Result:
        start, cpu0 = time.perf_counter(), cpu_now()
        try:
            status, cex, message, stage = self.check(problem, budget)
        except UnsupportedModel as e:
            status, cex, message, stage = "error", None, _one_line(e), self.name
        except Exception as e:  # a verifier failing on one instance must not stop a benchmark
            status, cex, message, stage = "error", None, _one_line(e), self.name
        y = None
        if status == "sat":
            spec = problem.specs[problem.cache.get("sat_spec", 0)]
            if cex is None:
                status, message = "error", f"{stage} reported a counterexample but gave no input. {message}"
            else:
                ok, why, y = check_counterexample(problem, spec, cex)
                if ok:
                    message = f"{message}; {why}" if message else why
                else:
                    status, message, cex, y = "error", f"counterexample failed the re-check: {why}", None, None
        elif cex is not None:
            cex = None
        return Result(status, time.perf_counter() - start, cex, y, message, stage, cpu_now() - cpu0, dict(problem.info))

    def check(self, problem: Problem, budget: Budget) -> tuple[str, np.ndarray | None, str, str]:
        """Every spec (input box) of the problem: sat if one is, unsat if all are."""
        messages, worst = [], "unsat"
        rank = {"unsat": 0, "unknown": 1, "timeout": 2, "error": 3}
        for k in range(len(problem.specs)):
            if budget.expired():
                return "timeout", None, f"{self.name}: no time left", self.name
            status, x, msg = self.solve(problem, k, budget)
            if status == "sat":
                problem.cache["sat_spec"] = k
                return "sat", x, msg, self.name
            if rank[status] > rank[worst]:
                worst = status
            messages.append(msg)
        prefix = f"{len(problem.specs)} input boxes: " if len(problem.specs) > 1 else ""
        return worst, None, prefix + "; ".join(m for m in messages if m), self.name

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        raise NotImplementedError


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
    import inspect

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

    def check(self, problem: Problem, budget: Budget) -> tuple[str, np.ndarray | None, str, str]:
        messages: list[str] = []
        status, cex, stage = "timeout", None, self.name
        for link in self.links:
            if budget.expired():
                messages.append(f"{link.name}: not run, no time left")
                status = "timeout"
                break
            t0 = time.perf_counter()
            try:
                status, cex, msg, _ = link.check(problem, budget)
            except UnsupportedModel as e:
                status, cex, msg = "error", None, _one_line(e)
            problem.info.setdefault("stage_seconds", {})[link.name] = round(time.perf_counter() - t0, 4)
            messages.append(f"{link.name}: {status}" + (f" ({msg})" if msg else ""))
            stage = link.name
            if status in DECISIVE or status == "error":
                break
        if status not in DECISIVE and budget.expired():
            status = "timeout"
        return status, cex, "; ".join(messages), stage


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


# ---------------------------------------------------------------------------------------------
# the verifiers


@register_verifier("pgd")
class PgdVerifier(Verifier):
    """Attack only (`attack.pgd`): sat with a counterexample, else unknown (never unsat)."""

    def __init__(self, steps: int = 40, restarts: int = 2, margin: float = 1e-4, seed: int = 0) -> None:
        self.steps, self.restarts, self.margin, self.seed = int(steps), int(restarts), float(margin), seed

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        spec = problem.specs[k]
        _check_shapes(problem.network, spec)
        x, v = attack.pgd(problem.network, spec, self.steps, self.restarts, self.margin, self.seed, budget.expired)
        if x is not None:
            return "sat", x, "PGD counterexample"
        return "unknown", None, f"PGD ({self.steps} steps, {self.restarts + 1} starts per disjunct): best margin {v:.4g}"


def _check_shapes(net: Network, spec: VnnlibSpec) -> None:
    if net.num_inputs != spec.num_inputs or net.num_outputs != spec.num_outputs:
        raise UnsupportedModel(f"the network is {net.num_inputs} -> {net.num_outputs}, the property "
                               f"{spec.num_inputs} -> {spec.num_outputs}")


class _BoundsState:
    """What the bound links leave for the next: the Bounder, the rows' best lower bounds, the open disjuncts."""

    def __init__(self, problem: Problem, k: int, budget: Budget):
        spec = problem.specs[k]
        _check_shapes(problem.network, spec)
        self.bounder = bounds.Bounder(problem.network, spec.lb, spec.ub, budget.expired)
        self.spec, self.owner = bounds.Spec.from_disjuncts(spec.disjuncts)
        self.n = len(spec.disjuncts)
        self.lower = self._ibp_rows()
        self.level = "ibp"
        problem.info["unstable_ibp"] = sum(self.bounder.result().unstable("ibp"))
        problem.info["relus"] = problem.network.num_relus

    def _ibp_rows(self) -> torch.Tensor:
        """Interval bounds of the rows C y + d, C folded into a last Linear after a ReLU (tighter than
        bounding y first)."""
        b, C, d = self.bounder, self.spec.C, self.spec.d
        layers = b.net.layers
        if len(layers) >= 2 and isinstance(layers[-1], Linear) and isinstance(layers[-2], ReLU):
            l, u = b.ibp_pre[-1]
            W, c = C @ layers[-1].W, C @ layers[-1].b
            return W.clamp(min=0) @ l.clamp(min=0) + W.clamp(max=0) @ u.clamp(min=0) + c + d
        lo, hi = b.ibp_out
        return C.clamp(min=0) @ lo + C.clamp(max=0) @ hi + d

    def update(self, lower: torch.Tensor) -> None:
        self.lower = torch.maximum(self.lower, lower)

    def crown(self) -> None:
        """CROWN bounds for every layer and the rows, once per property (later links start from them)."""
        if self.level == "ibp":
            self.bounder.crown()
            self.update(self.bounder.spec_bounds(self.spec))
            self.level = "crown"

    def alpha_intermediate(self, steps: int) -> None:
        """α-CROWN-optimized bounds of the ReLU layers (what a MILP's big-M and a branch need), once."""
        if self.level != "alpha-milp":
            self.bounder.alpha_intermediate(steps)
            self.update(self.bounder.spec_bounds(self.spec))
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

    def check(self, problem: Problem, budget: Budget) -> tuple[str, np.ndarray | None, str, str]:
        if not isinstance(problem.onnx, (str, Path)) or problem.vnnlib_path is None:
            return "error", None, "marabou needs the ONNX and VNN-LIB files", self.name
        tight = None
        st = problem.cache.get(("bounds", 0))
        if self.tight_bounds and st is not None and len(problem.specs) == 1:
            tight = {}
            for s, k in enumerate(st.bounder.sites):
                src = getattr(st.bounder.net.layers[k], "source", "")
                if src:
                    l, u = st.bounder.pre[s]
                    tight[src] = (l.tolist(), u.tolist())
        log = self.log_dir / f"{problem.vnnlib_path.stem}.marabou.log" if self.log_dir is not None else None
        status, x, msg = marabou.run(Path(problem.onnx), problem.vnnlib_path, max(budget.left(), 0.0), clock=budget.clock,
                                     grace_s=self.grace_s, wall_factor=self.wall_factor, python=self.python,
                                     log_path=log, bounds=tight)
        if status == "sat" and x is not None:
            problem.cache["sat_spec"] = next((k for k, s in enumerate(problem.specs) if s.in_box(x, BOX_TOL)), 0)
        return status, x, msg, self.name


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
        _check_shapes(smooth, spec)
        b = bounds.Bounder(smooth.relu_version(), spec.lb, spec.ub, budget.expired)
        rows, owner = bounds.Spec.from_disjuncts(spec.disjuncts)
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


@register_verifier("bab")
class BabVerifier(Verifier):
    """Branch and bound on unstable ReLUs with β-CROWN-style bounds (`bab.bab`), on the disjuncts the bounds left
    open (the most promising for a counterexample first), from the tightest bounds available (computed here
    when no bound link ran before: CROWN, then α-CROWN for the ReLU layers). Complete for ReLU networks."""

    def __init__(self, batch: int = 32, bab_steps: int = 15, lr: float = 0.1, steps: int = 20) -> None:
        self.batch, self.bab_steps, self.lr, self.steps = int(batch), int(bab_steps), float(lr), int(steps)

    def solve(self, problem: Problem, k: int, budget: Budget) -> tuple[str, np.ndarray | None, str]:
        from . import bab

        st = _state(problem, k, budget)
        st.crown()
        if st.open:
            st.alpha_intermediate(self.steps)
        if not st.open:
            return st.answer("bounds", problem)
        problem.info["unstable_tight"] = sum(st.bounder.result().unstable())
        opn = sorted(st.open, key=lambda d: max(float(st.lower[i]) for i, j in enumerate(st.owner) if j == d))
        messages, domains = [], 0
        for d in opn:
            status, x, msg, stats = bab.bab(st.bounder, problem.specs[k], d, budget.expired, budget.left, self.batch,
                                            self.bab_steps, self.lr)
            domains += stats["domains"]
            problem.info["bab_domains"] = domains
            if status == "sat":
                return "sat", x, msg
            if status != "unsat":
                return status, None, f"disjunct {d}: {msg}"
            messages.append(msg)
        return "unsat", None, f"{len(opn)} open disjuncts closed; " + "; ".join(messages)
