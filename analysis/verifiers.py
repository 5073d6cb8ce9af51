"""Verifier registry: one ``verify(onnx_path, vnnlib_path, timeout_s) -> Result`` per tool.

- ``"marabou"``: maraboupy 2.0 (complete), run in a child process so that a hard timeout can
  kill it and its C++ output stays out of ours (it goes to ``<vnnlib>.marabou.log`` when
  ``log_dir`` is given, else nowhere).
- ``"milp"``: exact for small ReLU MLPs with ``scipy.optimize.milp`` (HiGHS): big-M encoding with
  IBP bounds; the LP relaxation first, then one feasibility MILP per unsafe disjunct.
- ``"ibp"``: interval bounds only; sound, incomplete (``verified`` or ``unknown``).
- ``"pgd"``: attack only (``falsified`` or ``unknown``): the MILP verifier's PGD step on its own,
  a cheap first link before a complete verifier (Marabou is slow to find counterexamples).

Statuses: ``verified`` (unsat: no counterexample in the box), ``falsified`` (a counterexample
that onnxruntime confirms), ``timeout``, ``error``, ``unknown``. Every counterexample is run
through the ONNX model in onnxruntime before ``falsified`` is reported; one that is outside the
box (beyond ``BOX_TOL``) or not unsafe (beyond ``OUTPUT_TOL`` relative to the logits) turns the
result into ``error``. A certificate is for the float ONNX model given, not for an int8 one.

What Marabou 2.0.0's ONNX reader takes (``maraboupy/parsers/ONNXParser.py``): Constant, Identity,
Dropout, Cast, Reshape, Flatten, Transpose, Unsqueeze, Squeeze, BatchNormalization, Concat,
MaxPool, Conv, Gemm, MatMul, Mul (by a constant that it uses as one scalar coefficient), Add,
Relu, Sigmoid, Split, Resize, Tanh, LeakyRelu, Softmax, Sub. Anything else raises
``NotImplementedError("Operation <Op> not implemented")`` from ``Marabou.read_onnx``. For the smooth
λ-GELU layer ``F.gelu(x * lam) / lam`` exported with ``dynamo=False``:

- opset 17 (Erf expansion: Mul, Div, Erf, Add, Mul, Mul, Div):
  ``NotImplementedError: Operation Div not implemented``;
- opset 20 (Mul, Gelu, Div): ``NotImplementedError: Operation Gelu not implemented``.

So only the swapped ReLU network goes to Marabou; ``to_verifier_onnx`` exports it with the input
normalization folded into the first Linear layer (Marabou's Mul takes only a scalar constant).

Measured here (2 shared CPU cores): on a random-weight 784-64-64-10 MLP at random inputs in
[0, 1], eps = 0.01 leaves 84-88 unstable ReLUs and all three properties tried were false; Marabou
answered two (0.9 s and 13.8 s wall) and timed out at 60 s on the third, which the MILP
verifier's PGD step falsified in 0.6-1.2 s (the MILP alone timed out on all three). At eps = 0.001
(15-18 unstable) both decide in 0.3-1.7 s.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from analysis.intervals import (Affine, ReLU, Layer, canonical_layers, forward, interval_bounds,
                                layers_from_onnx, layers_from_torch)
from analysis.vnnlib import VnnlibSpec, read_vnnlib

__all__ = [
    "Status",
    "Result",
    "Verifier",
    "VERIFIERS",
    "register_verifier",
    "get_verifier",
    "available_verifiers",
    "check_counterexample",
    "onnx_forward",
    "to_verifier_onnx",
    "MarabouVerifier",
    "MilpVerifier",
    "IbpVerifier",
    "PgdVerifier",
    "BOX_TOL",
    "OUTPUT_TOL",
]

Status = Literal["verified", "falsified", "timeout", "error", "unknown"]
STATUSES: tuple[str, ...] = ("verified", "falsified", "timeout", "error", "unknown")

# A counterexample may sit this far outside the box (solvers work in double, ONNX in float32).
BOX_TOL = 1e-6
# ... and this far on the safe side of the unsafe set, relative to max(1, |logits|_inf): solvers
# return points on the boundary Y_j = Y_c, which float32 inference can round either way.
OUTPUT_TOL = 1e-5
# Folded export vs the original torch model, on random inputs in [0, 1).
EXPORT_ATOL = 1e-5


@dataclass(frozen=True, eq=False)
class Result:
    status: Status
    seconds: float
    counterexample: np.ndarray | None = None
    message: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    def to_json(self) -> dict[str, Any]:
        cex = None if self.counterexample is None else [float(v) for v in self.counterexample]
        return {"status": self.status, "seconds": self.seconds, "counterexample": cex,
                "message": self.message}


# ---------------------------------------------------------------------------------------------
# onnxruntime re-check
# ---------------------------------------------------------------------------------------------


def onnx_forward(onnx_path: str | Path, x: np.ndarray) -> np.ndarray:
    """Run the ONNX model on one flat input (reshaped to the model's input, batch 1); flat output."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
    dtype = np.float64 if inp.type == "tensor(double)" else np.float32
    feed = np.asarray(x, dtype=np.float64).reshape(shape).astype(dtype)
    return np.asarray(sess.run(None, {inp.name: feed})[0], dtype=np.float64).reshape(-1)


def check_counterexample(onnx_path: str | Path, spec: VnnlibSpec, x: np.ndarray,
                         box_tol: float = BOX_TOL, output_tol: float = OUTPUT_TOL) -> tuple[bool, str]:
    """Is ``x`` in the box (within ``box_tol``) and mapped by the ONNX model (onnxruntime) into
    the unsafe set (within ``output_tol * max(1, |y|_inf)``)? Returns (ok, explanation)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.size != spec.num_inputs:
        return False, f"counterexample has {x.size} inputs, the property {spec.num_inputs}"
    outside = float(np.max(np.maximum(spec.lb - x, 0.0) + np.maximum(x - spec.ub, 0.0)))
    if outside > box_tol:
        return False, f"counterexample lies {outside:.3g} outside the input box (tolerance {box_tol:g})"
    y = onnx_forward(onnx_path, x)
    if y.size != spec.num_outputs:
        return False, f"model has {y.size} outputs, the property {spec.num_outputs}"
    viol = spec.violation(y)
    tol = output_tol * max(1.0, float(np.max(np.abs(y))))
    if viol > tol:
        return False, (f"onnxruntime output is not unsafe: margin {viol:.3g} > tolerance {tol:.3g} "
                       f"(y = {np.array2string(y, precision=6)})")
    return True, f"onnxruntime confirms: unsafe margin {viol:.3g}, box excess {outside:.3g}"


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------


class Verifier:
    """Subclasses implement ``_solve``; ``verify`` times it, turns exceptions into ``error``
    and re-checks counterexamples in onnxruntime."""

    name: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()  # importable modules this verifier needs

    @classmethod
    def available(cls) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in cls.requires)

    def verify(self, onnx_path: str | Path, vnnlib_path: str | Path, timeout_s: float) -> Result:
        start = time.perf_counter()
        try:
            spec = read_vnnlib(vnnlib_path)
            status, cex, message = self._solve(Path(onnx_path), Path(vnnlib_path), spec, float(timeout_s))
        except Exception as e:  # a verifier failing on one instance must not stop a benchmark
            return Result("error", time.perf_counter() - start, None, f"{type(e).__name__}: {e}")
        if status == "falsified":
            if cex is None:
                status, message = "error", f"{self.name} reported a counterexample but gave no input. {message}"
            else:
                ok, why = check_counterexample(onnx_path, spec, cex)
                if ok:
                    message = f"{message}; {why}" if message else why
                else:
                    status, message, cex = "error", f"counterexample failed the onnxruntime re-check: {why}", None
        elif cex is not None:
            cex = None
        return Result(status, time.perf_counter() - start, cex, message)

    def _solve(self, onnx_path: Path, vnnlib_path: Path, spec: VnnlibSpec,
               timeout_s: float) -> tuple[Status, np.ndarray | None, str]:
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


def get_verifier(name: str, **options: Any) -> Verifier:
    """An instance of the verifier registered under ``name``; ``options`` go to its constructor."""
    if name not in VERIFIERS:
        raise KeyError(f"unknown verifier {name!r}; choose one of {sorted(VERIFIERS)}")
    return VERIFIERS[name](**options)


def available_verifiers() -> list[str]:
    """Registered verifiers whose dependencies are installed."""
    return sorted(n for n, cls in VERIFIERS.items() if cls.available())


# ---------------------------------------------------------------------------------------------
# Marabou
# ---------------------------------------------------------------------------------------------

# Runs in a fresh interpreter: argv = onnx, vnnlib, timeout (int s, 0 = none), result json,
# CPU limit (int s for the whole process, 0 = none; SIGXCPU ends it, no core file).
_MARABOU_WORKER = r"""
import json, os, sys, time, traceback
onnx_path, vnnlib_path, timeout_s, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
cpu_limit = int(sys.argv[5]) if len(sys.argv) > 5 else 0
if cpu_limit > 0:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 2))
res = {"exit": "exception", "x": None, "message": "", "solver_seconds": None}
try:
    import warnings
    warnings.simplefilter("ignore")
    from maraboupy import Marabou, MarabouCore
    net = Marabou.read_onnx(onnx_path)
    ipq = net.getInputQuery()
    MarabouCore.loadProperty(ipq, vnnlib_path)
    options = Marabou.createOptions(timeoutInSeconds=timeout_s, verbosity=0, numWorkers=1)
    exit_code, vals, stats = MarabouCore.solve(ipq, options, "")
    res["exit"] = exit_code
    res["timed_out"] = bool(stats.hasTimedOut())
    res["solver_seconds"] = stats.getTotalTimeInMicro() / 1e6
    if exit_code == "sat":
        res["x"] = [vals[ipq.inputVariableByIndex(i)] for i in range(ipq.getNumInputVariables())]
except BaseException as e:
    res["message"] = f"{type(e).__name__}: {e}"
    res["traceback"] = traceback.format_exc()
tmp = out_path + ".tmp"
with open(tmp, "w") as f:
    json.dump(res, f)
os.replace(tmp, out_path)
"""


@register_verifier("marabou")
class MarabouVerifier(Verifier):
    """maraboupy 2.0 in a child process.

    ``grace_s``: extra wall time over ``timeout_s`` for the child's start (imports, ONNX
    parsing) before it is killed; the whole call is bounded by ``timeout_s + grace_s``.
    ``log_dir``: where Marabou's own stdout/stderr go (``<vnnlib stem>.marabou.log``).
    ``cpu_time``: ``timeout_s`` counts the child's CPU seconds (``RLIMIT_CPU``; its start and the
    ONNX parsing included) instead of wall time, so that a loaded machine does not turn proofs
    into timeouts; the wall clock then only stops a starved or hung child, after
    ``wall_factor * timeout_s + grace_s``.
    """

    requires = ("maraboupy", "onnx", "onnxruntime")

    def __init__(self, grace_s: float = 20.0, log_dir: str | Path | None = None,
                 python: str | None = None, cpu_time: bool = False, wall_factor: float = 20.0) -> None:
        self.grace_s = float(grace_s)
        self.cpu_time = bool(cpu_time)
        self.wall_factor = float(wall_factor)
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.python = python or sys.executable

    def _solve(self, onnx_path: Path, vnnlib_path: Path, spec: VnnlibSpec,
               timeout_s: float) -> tuple[Status, np.ndarray | None, str]:
        if not self.available():
            return "error", None, "maraboupy is not installed (pip install maraboupy; CPython 3.11 wheels)"
        # Marabou takes whole seconds, 0 meaning none: never pass 0 for a short budget.
        marabou_timeout = max(1, int(math.ceil(timeout_s)))
        cpu_limit, wall = 0, timeout_s + self.grace_s
        if self.cpu_time:
            cpu_limit, marabou_timeout = marabou_timeout, 0  # the CPU limit stops the search
            wall = self.wall_factor * timeout_s + self.grace_s
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        with tempfile.TemporaryDirectory(prefix="marabou_") as tmp:
            out_json = Path(tmp) / "result.json"
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log = open(self.log_dir / f"{vnnlib_path.stem}.marabou.log", "w")
            else:
                log = open(os.devnull, "w")
            with log:
                proc = subprocess.Popen(
                    [self.python, "-c", _MARABOU_WORKER, str(onnx_path), str(vnnlib_path),
                     str(marabou_timeout), str(out_json), str(cpu_limit)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                    start_new_session=True)
                try:
                    proc.wait(timeout=wall)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    return "timeout", None, f"killed after {wall:.0f} s wall time"
                except BaseException:  # interrupted: the child must not outlive us
                    _kill_group(proc)
                    raise
            if not out_json.exists() and cpu_limit and proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
                return "timeout", None, f"CPU limit of {cpu_limit} s reached"
            if not out_json.exists():
                return "error", None, f"Marabou child exited with code {proc.returncode} and no result"
            res = json.loads(out_json.read_text())
        exit_code = res["exit"]
        solver = f"marabou {exit_code} in {res['solver_seconds']:.3f} s" if res.get("solver_seconds") is not None else ""
        if exit_code == "sat":
            return "falsified", np.asarray(res["x"], dtype=np.float64), solver
        if exit_code == "unsat":
            return "verified", None, solver
        if exit_code == "TIMEOUT" or res.get("timed_out"):
            return "timeout", None, solver
        if exit_code == "exception":
            return "error", None, res["message"]
        return ("unknown" if exit_code == "UNKNOWN" else "error"), None, solver or exit_code


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ---------------------------------------------------------------------------------------------
# MILP (scipy / HiGHS)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Encoding:
    """Big-M MILP of a canonical ReLU network over a box: ``row_lo <= matrix @ v <= row_hi``,
    ``var_lb <= v <= var_ub``; ``x`` and ``y`` are the index ranges of the input and output."""

    matrix: Any  # scipy.sparse.csr_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    var_lb: np.ndarray
    var_ub: np.ndarray
    integrality: np.ndarray
    x: slice
    y: slice
    num_unstable: int

    @property
    def num_vars(self) -> int:
        return self.var_lb.size


def _encode(layers: list[Layer], lb: np.ndarray, ub: np.ndarray) -> _Encoding:
    """Variables: x | per hidden layer z (pre-activation), a (post), d (binary, unstable ReLUs
    only) | y. Bounds on z and y from IBP; stable ReLUs are encoded exactly without a binary."""
    from scipy import sparse

    bounds = interval_bounds(layers, lb, ub)
    affines = [layer for layer in layers if isinstance(layer, Affine)]
    var_lb, var_ub, integ = [lb], [ub], [np.zeros(lb.size)]
    rr: list[np.ndarray] = []  # row, column, value triplets
    cc: list[np.ndarray] = []
    vv: list[np.ndarray] = []
    row_lo: list[np.ndarray] = []
    row_hi: list[np.ndarray] = []
    num_vars = lb.size
    num_rows = 0

    def new_vars(l: np.ndarray, u: np.ndarray, integer: bool) -> slice:
        nonlocal num_vars
        s = slice(num_vars, num_vars + l.size)
        num_vars += l.size
        var_lb.append(l)
        var_ub.append(u)
        integ.append(np.full(l.size, 1.0 if integer else 0.0))
        return s

    def add_rows(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        nonlocal num_rows
        rr.append(rows + num_rows)
        cc.append(cols)
        vv.append(vals)
        row_lo.append(lo)
        row_hi.append(hi)
        num_rows += lo.size

    def affine(layer: Affine, src: slice, dst: slice) -> None:
        # W src - dst = -b
        m, k = layer.W.shape
        r, c = np.nonzero(layer.W)
        rows = np.concatenate([r, np.arange(m)])
        cols = np.concatenate([src.start + c, dst.start + np.arange(m)])
        vals = np.concatenate([layer.W[r, c], -np.ones(m)])
        add_rows(rows, cols, vals, -layer.b, -layer.b)

    prev = slice(0, lb.size)
    num_unstable = 0
    for k, layer in enumerate(affines[:-1]):
        l, u = bounds.pre_activation[k]
        z = new_vars(l, u, False)
        affine(layer, prev, z)
        a = new_vars(np.maximum(l, 0.0), np.maximum(u, 0.0), False)  # inactive: a fixed to 0
        act = np.flatnonzero(l >= 0)  # active: a - z = 0
        n = act.size
        add_rows(np.repeat(np.arange(n), 2), np.ravel(np.column_stack([a.start + act, z.start + act])),
                 np.tile([1.0, -1.0], n), np.zeros(n), np.zeros(n))
        idx = np.flatnonzero((l < 0) & (u > 0))
        n = idx.size
        num_unstable += n
        d = new_vars(np.zeros(n), np.ones(n), True)
        zi, ai, di = z.start + idx, a.start + idx, d.start + np.arange(n)
        li, ui = l[idx], u[idx]
        ones, inf = np.ones(n), np.full(n, -np.inf)
        r = np.arange(n)
        add_rows(np.repeat(r, 2), np.ravel(np.column_stack([zi, ai])), np.tile([1.0, -1.0], n),
                 inf, np.zeros(n))  # z - a <= 0
        add_rows(np.repeat(r, 3), np.ravel(np.column_stack([ai, zi, di])),
                 np.ravel(np.column_stack([ones, -ones, -li])), inf, -li)  # a <= z - l (1 - d)
        add_rows(np.repeat(r, 2), np.ravel(np.column_stack([ai, di])),
                 np.ravel(np.column_stack([ones, -ui])), inf, np.zeros(n))  # a <= u d
        prev = a
    y = new_vars(bounds.output[0], bounds.output[1], False)
    affine(affines[-1], prev, y)
    matrix = sparse.csr_matrix((np.concatenate(vv), (np.concatenate(rr), np.concatenate(cc))),
                               shape=(num_rows, num_vars))
    return _Encoding(matrix=matrix, row_lo=np.concatenate(row_lo), row_hi=np.concatenate(row_hi),
                     var_lb=np.concatenate(var_lb), var_ub=np.concatenate(var_ub),
                     integrality=np.concatenate(integ), x=slice(0, lb.size), y=y, num_unstable=num_unstable)


def _pgd_attack(net: list[Layer], spec: VnnlibSpec, steps: int, restarts: int, target: float,
                seed: int = 0) -> np.ndarray | None:
    """Projected sign-gradient descent on ``max_r (A y - b)_r`` for every disjunct at once
    (float64, numpy), from the box centre and ``restarts`` random points; stops once a point is
    unsafe by ``target`` (room for float32 re-evaluation). Returns the most violating point if it
    is unsafe at all, else None."""
    rng = np.random.default_rng(seed)
    lb, ub = spec.lb, spec.ub
    width = ub - lb
    starts = [(lb + ub) / 2] + [rng.uniform(lb, ub) for _ in range(restarts)]
    jobs = [(d, x0) for d in range(len(spec.disjuncts)) for x0 in starts]
    x = np.stack([x0 for _, x0 in jobs])
    best_x, best_v = None, np.inf
    for step in range(steps + 1):
        # forward, keeping the ReLU masks for the backward pass
        h, masks = x, []
        for layer in net:
            if isinstance(layer, Affine):
                h = h @ layer.W.T + layer.b
            else:
                masks.append(h > 0)
                h = np.maximum(h, 0.0)
        g_out = np.zeros_like(h)
        for k, (d, _) in enumerate(jobs):
            A, b = spec.disjuncts[d]
            r = A @ h[k] - b
            v = float(np.max(r))
            if v < best_v:
                best_v, best_x = v, x[k].copy()
            g_out[k] = A[int(np.argmax(r))]
        if best_v <= -target or step == steps:
            break
        g, mi = g_out, len(masks)
        for layer in reversed(net):
            if isinstance(layer, Affine):
                g = g @ layer.W
            else:
                mi -= 1
                g = g * masks[mi]
        alpha = width * (2.0 / steps) * (1.0 - step / steps) + width * 1e-3
        x = np.clip(x - alpha * np.sign(g), lb, ub)
    return best_x if best_v <= 0 else None


@register_verifier("milp")
class MilpVerifier(Verifier):
    """Exact for small ReLU MLPs (Gemm / MatMul / Add / Relu / Flatten ONNX).

    (0) a cheap PGD attack (``attack_steps`` x ``attack_restarts``) may find a counterexample.
    Then per unsafe disjunct ``{A y <= b}``: (1) the LP relaxation of the big-M encoding (IBP
    bounds) minimizing ``sum(A y)``; infeasible proves the disjunct empty, and its optimum, run
    through the network, may be a counterexample. (2) the open disjuncts, most violated LP first,
    each get a feasibility MILP for ``A y <= b`` with an equal share of the remaining time:
    infeasible proves the disjunct empty; a solution is checked in float64 (big-M with the
    integrality tolerance can place it slightly off the network), and if it is not a real
    counterexample a second MILP asks for ``A y <= b - margin``, a point with room to spare.
    "Infeasible" means so within HiGHS's feasibility tolerance (1e-7).
    """

    requires = ("scipy", "onnx")

    def __init__(self, margin: float = 1e-4, lp_first: bool = True, attack_steps: int = 50,
                 attack_restarts: int = 4, seed: int = 0) -> None:
        self.margin = float(margin)
        self.lp_first = lp_first
        self.attack_steps = int(attack_steps)
        self.attack_restarts = int(attack_restarts)
        self.seed = seed

    def _solve(self, onnx_path: Path, vnnlib_path: Path, spec: VnnlibSpec,
               timeout_s: float) -> tuple[Status, np.ndarray | None, str]:
        return self.solve_layers(layers_from_onnx(onnx_path), spec, timeout_s)

    def solve_layers(self, layers: Sequence[Layer], spec: VnnlibSpec,
                     timeout_s: float) -> tuple[Status, np.ndarray | None, str]:
        """The same decision directly on layers (no ONNX, no re-check)."""
        from scipy import sparse
        from scipy.optimize import Bounds, LinearConstraint, milp

        deadline = time.perf_counter() + timeout_s
        net = canonical_layers(layers)
        first, last = next(l for l in net if isinstance(l, Affine)), net[-1]
        if first.in_features != spec.num_inputs or last.out_features != spec.num_outputs:
            return "error", None, (f"network is {first.in_features} -> {last.out_features}, property "
                                   f"{spec.num_inputs} -> {spec.num_outputs}")
        if timeout_s <= 0:
            return "timeout", None, "no time given"

        def real(x: np.ndarray) -> bool:
            return spec.violation(forward(net, x)) <= 0

        if self.attack_steps > 0:
            x = _pgd_attack(net, spec, self.attack_steps, self.attack_restarts, self.margin, self.seed)
            if x is not None and real(x):
                return "falsified", x, "PGD attack counterexample"
        enc = _encode(net, spec.lb, spec.ub)
        n = enc.num_vars
        summary = f"{enc.num_unstable} unstable ReLUs"

        def run(A: np.ndarray, b: np.ndarray, shift: float, integral: bool, time_limit: float):
            """None on timeout, else (feasible, x or None, objective, HiGHS message)."""
            if time_limit <= 0:
                return None
            out_rows = sparse.hstack([sparse.csr_matrix((A.shape[0], enc.y.start)), sparse.csr_matrix(A),
                                      sparse.csr_matrix((A.shape[0], n - enc.y.stop))])
            cons = LinearConstraint(sparse.vstack([enc.matrix, out_rows], format="csr"),
                                    np.concatenate([enc.row_lo, np.full(A.shape[0], -np.inf)]),
                                    np.concatenate([enc.row_hi, b - shift]))
            c = np.zeros(n)
            if not integral:  # the LP also ranks disjuncts: how far it can push A y down
                c[enc.y] = A.sum(axis=0)
            res = milp(c, constraints=cons, integrality=enc.integrality if integral else np.zeros(n),
                       bounds=Bounds(enc.var_lb, enc.var_ub), options={"time_limit": time_limit, "disp": False})
            if res.status == 2:
                return False, None, np.inf, res.message
            if res.x is None:
                return None if res.status == 1 else (True, None, 0.0, res.message)
            return True, np.clip(res.x[enc.x], spec.lb, spec.ub), float(res.fun), res.message

        open_: list[tuple[float, int]] = []
        for d, (A, b) in enumerate(spec.disjuncts):
            if not self.lp_first:
                open_.append((0.0, d))
                continue
            out = run(A, b, 0.0, False, deadline - time.perf_counter())
            if out is None:
                return "timeout", None, f"during the LP relaxation; {summary}"
            feasible, x, value, _ = out
            if not feasible:
                continue
            if x is not None and real(x):
                return "falsified", x, f"LP relaxation point is a counterexample; {summary}"
            open_.append((value, d))
        lp_closed = len(spec.disjuncts) - len(open_)
        open_.sort()
        undecided = unclear = milp_runs = 0
        for k, (_, d) in enumerate(open_):
            A, b = spec.disjuncts[d]
            for shift in (0.0, self.margin):
                share = (deadline - time.perf_counter()) / (len(open_) - k)
                out = run(A, b, shift, True, share)
                milp_runs += 1
                if out is None:
                    undecided += 1
                    break
                feasible, x, _, msg = out
                if not feasible:
                    unclear += shift > 0  # a margin-0 point that was no real counterexample
                    break
                if x is None:
                    return "error", None, f"HiGHS: {msg}"
                if real(x):
                    return "falsified", x, f"MILP counterexample (margin {shift:g}); {summary}"
            else:
                unclear += 1
        detail = (f"{lp_closed}/{len(spec.disjuncts)} disjuncts closed by the LP relaxation, {milp_runs} MILPs; "
                  f"{summary}")
        if undecided:
            return "timeout", None, f"{undecided} disjuncts undecided; {detail}"
        if unclear:
            return "unknown", None, (f"{unclear} disjuncts have MILP points that are no float64 counterexample "
                                     f"and none at margin {self.margin:g}; {detail}")
        return "verified", None, detail


# ---------------------------------------------------------------------------------------------
# IBP
@register_verifier("pgd")
class PgdVerifier(Verifier):
    """Attack only: projected sign-gradient descent (``_pgd_attack``, float64) from the box centre
    and ``restarts`` random points; ``falsified`` with a counterexample, else ``unknown`` (never
    ``verified``). On a 784-256x4-10 MLP it takes about a second; Marabou needed over 30 s to
    falsify a property this attack broke (Fashion-MNIST, eps = 0.005)."""

    requires = ("onnx",)

    def __init__(self, steps: int = 50, restarts: int = 4, margin: float = 1e-4, seed: int = 0) -> None:
        self.steps, self.restarts, self.margin, self.seed = int(steps), int(restarts), float(margin), seed

    def _solve(self, onnx_path: Path, vnnlib_path: Path, spec: VnnlibSpec,
               timeout_s: float) -> tuple[Status, np.ndarray | None, str]:
        net = canonical_layers(layers_from_onnx(onnx_path))
        x = _pgd_attack(net, spec, self.steps, self.restarts, self.margin, self.seed)
        if x is not None and spec.violation(forward(net, x)) <= 0:
            return "falsified", x, "PGD attack counterexample"
        return "unknown", None, f"PGD ({self.steps} steps, {self.restarts + 1} starts per disjunct) found no counterexample"


# ---------------------------------------------------------------------------------------------


@register_verifier("ibp")
class IbpVerifier(Verifier):
    """Interval bounds; each row of ``A y`` is bounded through the last layer folded into ``A``
    (tighter than bounding ``y`` first). Verified when every disjunct has a row whose lower
    bound exceeds its right-hand side; otherwise unknown."""

    requires = ("onnx",)

    def _solve(self, onnx_path: Path, vnnlib_path: Path, spec: VnnlibSpec,
               timeout_s: float) -> tuple[Status, np.ndarray | None, str]:
        return self.solve_layers(layers_from_onnx(onnx_path), spec)

    @staticmethod
    def solve_layers(layers: Sequence[Layer], spec: VnnlibSpec) -> tuple[Status, np.ndarray | None, str]:
        net = canonical_layers(layers)
        last = net[-1]
        body = interval_bounds(net[:-1], spec.lb, spec.ub) if len(net) > 1 else None
        lo, hi = body.output if body is not None else (spec.lb, spec.ub)
        worst = -np.inf  # the best certified gap of the hardest disjunct
        for A, b in spec.disjuncts:
            W, c = A @ last.W, A @ last.b
            row_lb = np.maximum(W, 0.0) @ lo + np.minimum(W, 0.0) @ hi + c
            gap = float(np.max(row_lb - b))
            worst = gap if worst == -np.inf else min(worst, gap)
            if gap <= 0:
                return "unknown", None, f"IBP cannot exclude a disjunct (best row gap {gap:.4g})"
        return "verified", None, f"IBP certified, smallest gap {worst:.4g}"


# ---------------------------------------------------------------------------------------------
# export for verifiers
# ---------------------------------------------------------------------------------------------


def to_verifier_onnx(torch_model: Any, input_shape: Sequence[int], path: str | Path, *,
                     atol: float = EXPORT_ATOL, n_check: int = 8, seed: int = 0) -> Path:
    """Export a ReLU ``nn.Sequential`` (input normalization with ``scale``/``shift``, Flatten,
    Linear, ReLU) to an ONNX graph that Marabou 2.0 reads: Flatten (if the input is not flat),
    Gemm, Relu only.

    The normalization is folded into the first Linear layer in float64 and cast to float32
    (``W' = W * scale``, ``b' = W @ shift + b``); every run of affine maps is composed the same
    way. Exported with the TorchScript exporter (``dynamo=False``), opset 17, fixed batch 1, input
    shape ``(1, *input_shape)`` (the VNN-LIB ``X_i`` are its C-order flattening). The file is
    checked with ``onnx.checker`` (full check) and against the original model in onnxruntime on
    ``n_check`` random inputs in [0, 1) within ``atol``; a mismatch raises ``AssertionError``.
    """
    import onnx
    import torch
    import torch.nn as nn

    input_shape = tuple(int(d) for d in input_shape)
    net = canonical_layers(layers_from_torch(torch_model, input_shape))
    modules: list[nn.Module] = [nn.Flatten()] if len(input_shape) > 1 else []
    for layer in net:
        if isinstance(layer, ReLU):
            modules.append(nn.ReLU())
        else:
            lin = nn.Linear(layer.in_features, layer.out_features)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(layer.W).float())
                lin.bias.copy_(torch.from_numpy(layer.b).float())
            modules.append(lin)
    folded = nn.Sequential(*modules).eval()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    dummy = torch.zeros((1, *input_shape))
    with warnings.catch_warnings():
        # the TorchScript exporter is chosen on purpose: its Gemm/Relu graph is what Marabou reads
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(folded, (dummy,), str(tmp), dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["output"], do_constant_folding=True)
    onnx.checker.check_model(onnx.load(str(tmp)), full_check=True)

    gen = torch.Generator().manual_seed(seed)
    was_training = torch_model.training
    torch_model.eval()
    try:
        worst = 0.0
        for _ in range(n_check):
            x = torch.rand((1, *input_shape), generator=gen)
            with torch.no_grad():
                ref = torch_model(x).double().numpy().reshape(-1)
            got = onnx_forward(tmp, x.numpy())
            worst = max(worst, float(np.max(np.abs(got - ref))))
    finally:
        torch_model.train(was_training)
    if worst > atol:
        tmp.unlink(missing_ok=True)
        raise AssertionError(f"folded ONNX differs from the torch model by {worst:.3g} > {atol:g}")
    os.replace(tmp, path)
    return path
