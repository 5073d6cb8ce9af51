"""The fused Triton λ-gate kernels: tests/triton_gate_cases.py run in child processes, so that no process of the
suite ever imports Triton in interpreter mode (Triton fixes the mode process-wide at import: a
TRITON_INTERPRET=1 set by one test module would run every other test of that process through the interpreter,
CUDA pipeline runs included).

- on the CPU, under the Triton interpreter (TRITON_INTERPRET=1 in the child only);
- on CUDA with compiled kernels (`cuda` marker; TRITON_GATE_TEST_COMPILED=1 in the child).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

CASES = Path(__file__).with_name("triton_gate_cases.py")
ROOT = Path(__file__).resolve().parents[1]
MIN_CASES = 60  # the child must have run at least this many tests: a child that collected nothing fails here


def _interpreter_broken() -> str | None:
    """Triton < 3.7's interpreter fails under numpy ≥ 2.4 (`only 0-dimensional arrays can be converted to Python
    scalars`; fixed by triton-lang/triton#9171 in 3.7)."""
    try:
        import triton
    except ImportError:
        return "triton is not installed"
    tv = tuple(int(v) for v in re.findall(r"\d+", triton.__version__)[:2])
    nv = tuple(int(v) for v in re.findall(r"\d+", np.__version__)[:2])
    if tv < (3, 7) and nv >= (2, 4):
        return (f"Triton {triton.__version__}'s interpreter fails under numpy {np.__version__} (fixed in Triton 3.7, "
                "triton-lang/triton#9171); the compiled kernels are tested on CUDA")
    return None


def _run_cases(env: dict[str, str], workers: int = 0) -> None:
    """The cases in a child process; `workers` > 0 spreads them over that many xdist processes (compiling the kernel
    variants is most of the compiled run's time, and each process compiles its own)."""
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
    dist = ["-n", str(workers)] if workers > 0 else ["-p", "no:xdist"]
    res = subprocess.run([sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider", *dist],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = res.stdout[-6000:] + res.stderr[-3000:]
    assert res.returncode == 0, tail
    passed = re.search(r"(\d+) passed", res.stdout)
    assert passed and int(passed.group(1)) >= MIN_CASES, tail


def test_interpreted_kernels():
    """Every case on the CPU through the Triton interpreter, in a child process."""
    why = _interpreter_broken()
    if why:
        pytest.skip(why)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_GATE_TEST_COMPILED"}
    _run_cases({**env, "TRITON_INTERPRET": "1"})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_kernels_on_cuda():
    """Every case on CUDA with compiled (not interpreted) kernels, in a child process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    try:
        import xdist  # noqa: F401

        workers = min(8, max(0, (os.cpu_count() or 1) // 2))
    except ImportError:
        workers = 0
    _run_cases({**env, "TRITON_GATE_TEST_COMPILED": "1"}, workers)


def test_imports_without_triton(monkeypatch):
    """The module imports and says why when Triton is missing; callers then fall back."""
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    path = ROOT / "pipeline" / "kernels" / "triton_gate.py"
    spec = importlib.util.spec_from_file_location("_triton_gate_without_triton", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert not mod.available() and "triton" in mod.unavailable_reason()
    assert not mod.supports(torch.zeros(2, 3), torch.zeros(3))
    assert mod.try_gate_s(torch.zeros(2, 3), torch.zeros(3), 1.0, 0, 1) is None
    with pytest.raises(ValueError, match="triton"):
        mod.gate_s(torch.zeros(2, 3), torch.zeros(3), 1.0)


def test_no_test_module_sets_the_interpreter():
    """The leak this layout prevents: no module the suite collects sets TRITON_INTERPRET."""
    offenders = [p.name for p in Path(__file__).parent.glob("test_*.py")
                 if re.search(r"environ\[\s*[\"']TRITON_INTERPRET[\"']\s*\]\s*=", p.read_text())]
    assert offenders == []


def test_the_phi_tail_polynomial_is_what_its_fit_claims():
    """The kernels' R(a) = t·Q(t) (`triton_gate.PHI_TAIL`) against scipy's erfcx in float32 arithmetic on [0, 40]; and a
    refit from `phi_fit` lands at the same p with an error as small (the coefficients have a recipe)."""
    from pipeline.kernels import phi_fit, triton_gate

    p, coeffs = triton_gate.PHI_TAIL
    assert phi_fit.float32_error(p, coeffs) <= PHI_TAIL_F32_RTOL
    p2, coeffs2, err2 = phi_fit.best()
    assert p2 == p and err2 <= PHI_TAIL_F32_RTOL
    assert max(abs(a - b) for a, b in zip(coeffs, coeffs2)) <= 1e-6


PHI_TAIL_F32_RTOL = 5e-7  # measured 4.2e-7: t's rounding and Horner's in float32 over the 8.9e-8 of the fit itself
