"""Marabou 2.0 (maraboupy) as a complete verifier, in a child process.

The child reads the ONNX file and the VNN-LIB property itself, so it answers for exactly what it was given;
it runs in a fresh interpreter so that a hard limit can kill it and its C++ output stays out of ours.
With `bounds` (a JSON file of tight pre-activation intervals per ReLU input tensor, from `bounds.Bounder`),
the child tightens Marabou's variable bounds before solving: the same head start the MILP gets.

What Marabou 2.0.0's ONNX reader takes (``maraboupy/parsers/ONNXParser.py``): Constant, Identity, Dropout,
Cast, Reshape, Flatten, Transpose, Unsqueeze, Squeeze, BatchNormalization, Concat, MaxPool, Conv, Gemm,
MatMul, Mul (by a constant that it uses as one scalar coefficient), Add, Relu, Sigmoid, Split, Resize, Tanh,
LeakyRelu, Softmax, Sub. Anything else raises ``NotImplementedError("Operation <Op> not implemented")``: the
smooth λ-GELU layer exports as Mul, Gelu, Div (opset 20) or with Erf (opset ≤ 19), neither of which it reads.

Limits: ``timeout_s`` is wall-clock time for the child (its start and ONNX parsing included), with
``grace_s`` more before it is killed; with ``clock="cpu"`` it is CPU seconds (RLIMIT_CPU on the child) and
the wall clock only stops a starved or hung child, after ``wall_factor·timeout_s + grace_s``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# Runs in a fresh interpreter: argv = onnx, vnnlib, timeout (int s, 0 = none), result json,
# CPU limit (int s for the whole process, 0 = none; SIGXCPU ends it, no core file), bounds json ("" = none).
WORKER = r"""
import json, os, sys, time, traceback
onnx_path, vnnlib_path, timeout_s, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
cpu_limit = int(sys.argv[5]) if len(sys.argv) > 5 else 0
bounds_path = sys.argv[6] if len(sys.argv) > 6 else ""
if cpu_limit > 0:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_limit, cpu_limit + 2))
res = {"exit": "exception", "x": None, "message": "", "solver_seconds": None, "tightened": 0}
try:
    import warnings
    warnings.simplefilter("ignore")
    import numpy as np
    from maraboupy import Marabou, MarabouCore
    from maraboupy.parsers import ONNXParser as _parser
    parsers = []  # the parser keeps the tensor name -> variables map; the network it builds does not
    _init = _parser.ONNXParser.__init__
    def _keep(self, *a, **k):
        _init(self, *a, **k)
        parsers.append(self)
    _parser.ONNXParser.__init__ = _keep
    net = Marabou.read_onnx(onnx_path)
    var_map = parsers[-1].varMap if parsers else {}
    if bounds_path:
        for name, (lo, hi) in json.load(open(bounds_path)).items():
            if name not in var_map:
                continue
            for v, l, u in zip(np.asarray(var_map[name]).reshape(-1), lo, hi):
                net.setLowerBound(int(v), float(l))
                net.setUpperBound(int(v), float(u))
                res["tightened"] += 1
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


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("maraboupy") is not None


def run(onnx_path: Path, vnnlib_path: Path, timeout_s: float, *, clock: str = "wall", grace_s: float = 20.0,
        wall_factor: float = 20.0, python: str | None = None, log_path: Path | None = None,
        bounds: dict[str, tuple[list[float], list[float]]] | None = None) -> tuple[str, np.ndarray | None, str]:
    """("unsat" | "sat" | "timeout" | "unknown" | "error", counterexample or None, message)."""
    if not available():
        return "error", None, "maraboupy is not installed (pip install maraboupy; CPython 3.11 wheels)"
    # Marabou takes whole seconds, 0 meaning none: never pass 0 for a short budget.
    marabou_timeout = max(1, int(math.ceil(timeout_s)))
    cpu_limit, wall = 0, timeout_s + grace_s
    if clock == "cpu":
        cpu_limit, marabou_timeout = marabou_timeout, 0  # the CPU limit stops the search
        wall = wall_factor * timeout_s + grace_s
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="marabou_") as tmp:
        out_json = Path(tmp) / "result.json"
        bounds_arg = ""
        if bounds:
            bounds_arg = str(Path(tmp) / "bounds.json")
            Path(bounds_arg).write_text(json.dumps(bounds))
        log = open(log_path, "w") if log_path is not None else open(os.devnull, "w")
        with log:
            proc = subprocess.Popen(
                [python or sys.executable, "-c", WORKER, str(onnx_path), str(vnnlib_path), str(marabou_timeout),
                 str(out_json), str(cpu_limit), bounds_arg],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
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
    if res.get("tightened"):
        solver += f" ({res['tightened']} variable bounds from the tight bounds)"
    if exit_code == "sat":
        return "sat", np.asarray(res["x"], dtype=np.float64), solver
    if exit_code == "unsat":
        return "unsat", None, solver
    if exit_code == "TIMEOUT" or res.get("timed_out"):
        return "timeout", None, solver
    if exit_code == "exception":
        return "error", None, res["message"]
    return ("unknown" if exit_code == "UNKNOWN" else "error"), None, solver or exit_code


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
