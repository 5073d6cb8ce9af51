"""One verification problem and what answering it means: the result kinds, the one clock (`Budget`), the
property with its network (`Problem`), and the rule a counterexample must pass (`Problem.confirm`).

Results are VNN-COMP's words: ``unsat`` (proved: no counterexample in the box), ``sat`` (a counterexample,
confirmed on the model the certificate is about), ``timeout``, ``unknown`` (an incomplete method could not
decide), ``error``. A certificate is about the network given: the float ONNX graph (its float32 weights, evaluated
in float64 by the bounds) unless a verifier says otherwise.

A counterexample is reported only when it is one as VNN-COMP checks it (output tolerance 0): the point written
to the witness, rounded to float32 inside the box, run through the model itself (`recheck`: onnxruntime for an
ONNX file), strictly violates the property. A point that is unsafe in float64 but not after that rounding (solvers
return points on the boundary A y = b) is first pushed deeper into the unsafe set by a short attack from it
(`attack.pgd` started there, with growing margins) and checked again; if no such point is found the candidate is
not a counterexample, and the search goes on.
"""

from __future__ import annotations

import contextlib
import math
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import attack
from .graph import Graph
from .ops.base import UnsupportedModel
from .readers import read
from .vnnlib import VnnlibSpec, read_vnnlib_all

RESULTS: tuple[str, ...] = ("sat", "unsat", "timeout", "unknown", "error")
DECISIVE = ("sat", "unsat")
CLOCKS = ("wall", "cpu")
# A point from an external solver (Marabou) may sit this far outside the box before it is rounded into it
BOX_TOL = 1e-6
# Margins (relative to max(1, |y|∞)) a candidate is pushed to when float32 rounding undoes its violation
DEEPEN_MARGINS = (1e-6, 1e-4, 1e-2)
# Why a property is open (`open_reason`): "budget" no bound pass finished in the time it was given; "timeout" the search
# after its bounds ran out of time; "unknown" an incomplete method ended undecided inside its limit; "error"
REASONS: tuple[str, ...] = ("budget", "timeout", "unknown", "error")
# A wall-clock limit is also enforced from outside the work (`hard_limit`): this long after it, the work is interrupted
HARD_GRACE_S = 0.5


@dataclass(frozen=True, eq=False)
class Result:
    status: str
    seconds: float = 0.0  # wall
    counterexample: np.ndarray | None = None  # flat input x, float32 values
    output: np.ndarray | None = None  # the model's output at x as re-checked (the witness's Y values)
    message: str = ""
    stage: str = ""  # the link of a chain that answered
    cpu_seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in RESULTS:
            raise ValueError(f"status {self.status!r} is not one of {RESULTS}")


class Budget:
    """Seconds left on one clock: "wall" (time.perf_counter) or "cpu" (this process and its waited-for children).
    The one clock of the verification package: every time limit and every reported duration reads it."""

    def __init__(self, seconds: float, clock: str = "wall"):
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
        self.seconds, self.clock = float(seconds), clock
        self.start = self.now()

    @staticmethod
    def read(clock: str) -> float:
        if clock == "wall":
            return time.perf_counter()
        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + ch.ru_utime + ch.ru_stime

    def now(self) -> float:
        return self.read(self.clock)

    def used(self) -> float:
        return self.now() - self.start

    def left(self) -> float:
        return self.seconds - self.used()

    def expired(self) -> bool:
        return self.left() <= 0

    def part(self, share: float) -> "Budget":
        """A budget of `share` of this one's whole limit, ending no later than this one (a probe's own time)."""
        return Budget(min(self.left(), share * self.seconds), self.clock)


class Overrun(BaseException):
    """A wall-clock limit reached from outside the work (`hard_limit`). Not an Exception, so that no verifier's
    `except Exception` turns it into an answer: it ends the property's turn as a timeout."""


@contextlib.contextmanager
def hard_limit(seconds: float, clock: str = "wall") -> Iterator[None]:
    """Raise `Overrun` in the work inside once `seconds` + HARD_GRACE_S of wall time have passed: the limit holds even
    where the work cannot look at its budget (one long back-substitution, a first use of a library). The work looks at
    its `Budget` first and ends by itself; this is the backstop. A SIGALRM timer, so only on the wall clock, in the
    main thread, on a system that has it, and when no other timer is set (then the budget checks alone limit it).
    What an interruption can leave half-done is safe: bound passes only ever narrow an interval to a sound one, and
    branch and bound keeps its open domains for a later call only when it stops by itself (`bab.bab`)."""
    usable = (clock == "wall" and math.isfinite(seconds) and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread()
              and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))
    if not usable:
        yield
        return

    def interrupt(signum, frame):
        raise Overrun(f"stopped from outside {HARD_GRACE_S:g} s after its limit of {seconds:.3g} s")

    grad = torch.is_grad_enabled()  # an interruption inside `torch.no_grad()`'s exit could leave it off
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.0) + HARD_GRACE_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)
        torch.set_grad_enabled(grad)


def open_reason(result: "Result") -> str:
    """Why a property is open ("" when decided): "budget" when no bound pass finished in the time it was given (its
    margin bound is interval arithmetic's, or there is none), "timeout" when the search after the bounds ran out,
    "unknown" when an incomplete method ended undecided, "tie" when the model gives a tie at a point of the box (no
    certificate exists, and no strict counterexample was found), "error". A verifier that computes bounds records the
    best pass that finished in ``info["bound"]`` ("ibp", "crown", "alpha-crown"); a property never begun says "not
    run"."""
    if result.status in DECISIVE:
        return ""
    if result.info.get("tie"):
        return "tie"
    if result.status != "timeout":
        return result.status
    bound = result.info.get("bound")
    if bound == "ibp" or (bound is None and result.message.startswith("not run")):
        return "budget"
    return "timeout"


def best_margin(info: dict) -> tuple[float | None, str]:
    """The best lower bound found on a property's margin (> 0 proves it) and what found it: branch and bound's global
    lower bound over the domains it left open (``info["bab_lower"]``), once it has one and it is the higher, else the
    last bound pass that finished (``info["margin_lb"]``, ``info["bound"]``). One reading for details.csv, the report
    and `api.verify`: the root pass alone would hide what a search of many domains gained."""
    m, lo = info.get("margin_lb"), info.get("bab_lower")
    if lo is not None and (m is None or float(lo) > float(m)):
        return float(lo), "bab"
    return (None if m is None else float(m)), info.get("bound", "")


def float32_in_box(x: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """x rounded to float32, each value moved to the nearest float32 inside [lb, ub] where rounding left the box
    (as float64 values: the witness prints them exactly)."""
    x32 = np.clip(np.asarray(x, dtype=np.float64), lb, ub).astype(np.float32)
    lo32, hi32 = lb.astype(np.float32), ub.astype(np.float32)
    lo32 = np.where(lo32.astype(np.float64) < lb, np.nextafter(lo32, np.float32(np.inf)), lo32)
    hi32 = np.where(hi32.astype(np.float64) > ub, np.nextafter(hi32, np.float32(-np.inf)), hi32)
    return np.minimum(np.maximum(x32, lo32), hi32).astype(np.float64)


class Problem:
    """One property: the network (read lazily from `onnx`), its specs (one per input box), and a cache the links
    of a chain share. `recheck(x) -> y` evaluates a candidate on the model the certificate is about (onnxruntime
    for an ONNX file; the float64 graph otherwise). `device`: where the verifiers compute (the network is moved
    there; None: where it is)."""

    def __init__(self, specs: Sequence[VnnlibSpec], network: Graph | None = None, onnx: Any = None,
                 vnnlib_path: Path | None = None, recheck: Callable[[np.ndarray], np.ndarray] | None = None,
                 device: Any = None):
        self.specs = list(specs)
        self._network = network
        self.device = device
        self.onnx = onnx
        self.vnnlib_path = vnnlib_path
        self._recheck = recheck
        self.cache: dict[Any, Any] = {}
        self.info: dict[str, Any] = {}

    @property
    def network(self) -> Graph:
        if self._network is None:
            if self.onnx is None:
                raise UnsupportedModel("no network given")
            self._network = read(self.onnx)
        self.info.setdefault("relus", self._network.num_relus)
        return self._network if self.device is None else self._network.to(self.device)

    def _session(self):
        """The onnxruntime session of the ONNX file, started on first use."""
        from pipeline import onnx_io  # onnxruntime, imported on first use

        if "session" not in self.cache:
            self.cache["session"] = onnx_io.session(self.onnx)
        return self.cache["session"]

    def recheck(self, x: np.ndarray) -> np.ndarray:
        if self._recheck is not None:
            return np.asarray(self._recheck(x), dtype=np.float64).reshape(-1)
        if isinstance(self.onnx, (str, Path)):
            from pipeline import onnx_io

            return onnx_io.forward_flat(self._session(), x)
        return self.network.forward(x).cpu().numpy()

    def recheck_many(self, xs: np.ndarray) -> np.ndarray:
        """`recheck` of each row of xs ([B, inputs]) as [B, outputs], batched where the model allows."""
        xs = np.asarray(xs, dtype=np.float64)
        many = getattr(self._recheck, "many", None)
        if many is not None:
            return np.asarray(many(xs), dtype=np.float64).reshape(len(xs), -1)
        if self._recheck is None and isinstance(self.onnx, (str, Path)):
            from pipeline import onnx_io

            return onnx_io.forward_many(self._session(), xs)
        return np.stack([self.recheck(x) for x in xs])

    def check_shapes(self, k: int) -> None:
        """UnsupportedModel (one line naming both files) unless spec k has the network's input and output counts."""
        net, spec = self.network, self.specs[k]
        if net.num_inputs != spec.num_inputs or net.num_outputs != spec.num_outputs:
            onnx = f" {Path(self.onnx).name}" if isinstance(self.onnx, (str, Path)) else ""
            prop = f" {self.vnnlib_path.name}" if self.vnnlib_path is not None else ""
            raise UnsupportedModel(f"the network{onnx} takes {net.num_inputs} inputs and gives {net.num_outputs} outputs, "
                                   f"but the property{prop} has {spec.num_inputs} inputs (X_i) and {spec.num_outputs} "
                                   f"outputs (Y_j)")

    def confirm(self, k: int, x: np.ndarray, expired: Callable[[], bool] | None = None
                ) -> tuple[np.ndarray | None, np.ndarray | None, str]:
        """(x32, y, why) when x, or a point a short attack from x finds, is a counterexample of spec k as VNN-COMP
        checks it (float32 input inside the box, the model's output strictly in the unsafe set); (None, None, why)
        otherwise."""
        spec = self.specs[k]
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if x.size != spec.num_inputs:
            return None, None, f"the point has {x.size} inputs, the property {spec.num_inputs}"
        outside = float(np.max(np.maximum(spec.lb - x, 0.0) + np.maximum(x - spec.ub, 0.0)))
        if outside > BOX_TOL:
            return None, None, f"the point lies {outside:.3g} outside the input box"
        tried = []
        candidates = iter([(x, 0.0)])
        while True:
            try:
                point, margin = next(candidates)
            except StopIteration:
                break
            x32 = float32_in_box(point, spec.lb, spec.ub)
            y = self.recheck(x32)
            if y.size != spec.num_outputs:
                return None, None, f"the model has {y.size} outputs, the property {spec.num_outputs}"
            v = spec.violation(y)
            if v < 0:
                how = "" if margin == 0 else f" after a short attack to margin {margin:.2g}"
                return x32, y, f"re-checked in float32: unsafe by {-v:.3g}{how}"
            tried.append(v)
            if margin == 0:
                candidates = self._deepened(k, x, max(1.0, float(np.max(np.abs(y)))), expired)
        return None, None, f"not a counterexample in float32 (re-checked margins {', '.join(f'{v:.3g}' for v in tried)})"

    def _deepened(self, k: int, x: np.ndarray, scale: float, expired: Callable[[], bool] | None):
        for margin in DEEPEN_MARGINS:
            if expired is not None and expired():
                return
            point, v = attack.pgd(self.network, self.specs[k], steps=20, restarts=0, margin=margin * scale,
                                  expired=expired, start=x, step_scale=0.01)
            if point is not None:
                yield point, margin * scale

    @classmethod
    def from_files(cls, onnx_path: Any, vnnlib_path: Path) -> "Problem":
        return cls(read_vnnlib_all(vnnlib_path), onnx=onnx_path, vnnlib_path=Path(vnnlib_path))
