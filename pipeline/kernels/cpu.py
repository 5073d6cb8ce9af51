"""The fused CPU kernel (`lambda_gelu.cpp` beside this file): built once per machine with the system C++
compiler against torch's own headers and cached under ~/.cache/lambda_gelu_pipeline (LAMBDA_GELU_CACHE
moves it); later processes only load it. The build takes about a minute on 2 cores (benchmarks/RESULTS.md,
section "Fused CPU kernel"), so `.ci/setup` does it at install time (`python -m pipeline.kernels.cpu`), and a
build that has to happen during a run says so on stderr when it starts.

float32 uses the erf approximation of ATen's vectorized `erf` (A&S 7.1.26, |error| ≤ 1.5e-7) with one
exponential shared between Φ and φ; float64 uses SLEEF's erfc and exp (≈ 1 ulp).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from .common import ENV_KERNEL
from .status import Status

ENV_CACHE = "LAMBDA_GELU_CACHE"
SOURCE = Path(__file__).with_name("lambda_gelu.cpp")
DTYPES = (torch.float32, torch.float64)

# Vector ISA flags for the CPU torch itself dispatches to (at::vec picks its implementation from them).
_ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mfma", "-mf16c",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}

status = Status()
_ops: dict[str, Any] = {}  # the loaded ops' default overloads
_lock = threading.Lock()


def cache_dir() -> Path:
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "lambda_gelu_pipeline"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build_command(cxx: str, src: Path, out: Path) -> list[str]:
    from torch.utils import cpp_extension

    libs = cpp_extension.library_paths()
    isa = _ISA_FLAGS.get(torch.backends.cpu.get_cpu_capability(), [])
    return [cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", *isa,
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *[a for p in cpp_extension.include_paths() for a in ("-isystem", p)],
            str(src), "-o", str(out),
            *[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs], "-lc10", "-ltorch_cpu"]


def build() -> bool:
    """Build (once per machine) and load (once per process) the fused CPU kernel; False if impossible."""
    if status.ready is not None:
        return status.ready
    with _lock:
        if status.ready is not None:
            return status.ready
        t0 = time.perf_counter()
        try:
            cxx = _compiler()
            if cxx is None:
                raise RuntimeError("no C++ compiler found (set CXX, or install g++ / clang++)")
            source = SOURCE.read_text()
            probe = _build_command(cxx, Path("kernel.cpp"), Path("kernel.so"))
            key = hashlib.sha256("\0".join([source, torch.__version__, sys.version, *probe]).encode()).hexdigest()[:16]
            d = cache_dir() / f"lambda_gelu_fast-{key}"
            lib = d / "lambda_gelu_fast.so"
            built = False
            if not lib.is_file():
                print(f"λ-GELU: building the fused CPU kernel for this machine, once (about a minute on 2 cores; cached "
                      f"in {d}); `python -m pipeline.kernels.cpu` builds it ahead, {ENV_KERNEL}=eager runs without it",
                      file=sys.stderr, flush=True)
                d.mkdir(parents=True, exist_ok=True)
                src = d / "kernel.cpp"
                src.write_text(source)
                tmp = d / f"lambda_gelu_fast.{os.getpid()}.so"
                res = subprocess.run(_build_command(cxx, src, tmp), capture_output=True, text=True, timeout=900)
                if res.returncode != 0:
                    tail = "\n".join(res.stderr.strip().splitlines()[-15:])
                    raise RuntimeError(f"compiling {src} failed ({cxx}, exit {res.returncode}):\n{tail}")
                os.replace(tmp, lib)  # atomic: concurrent builders all end with one complete library
                built = True
            torch.ops.load_library(str(lib))
            ns = torch.ops.lambda_gelu_fast
            _ops.update(forward=ns.forward.default, backward=ns.backward.default, autograd=ns.lambda_gelu.default,
                        autograd_s=ns.lambda_gelu_s.default)
            status.ready, status.detail = True, {"library": str(lib), "built_now": built, "compiler": cxx,
                                                 "isa": torch.backends.cpu.get_cpu_capability()}
        except Exception as exc:  # any failure (no compiler, headers, linker, loader) means: use another kernel
            status.ready, status.error = False, f"{type(exc).__name__}: {exc}"
            warnings.warn(f"λ-GELU: the fused CPU kernel is unavailable, falling back to eager ops ({status.error})",
                          RuntimeWarning, stacklevel=3)
        status.seconds = round(time.perf_counter() - t0, 3)
        return status.ready


def supports(x: torch.Tensor, lam: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in DTYPES and lam.device.type == "cpu" and lam.dtype == x.dtype


def fused(x: torch.Tensor, lam: torch.Tensor, lay: tuple[int, int]) -> torch.Tensor:
    """λ-GELU with autograd registered in C++ (no Python runs per call: at an MLP's 128×256 activations
    that overhead is as large as the arithmetic)."""
    return _ops["autograd"](x, lam, *lay)


def fused_s(x: torch.Tensor, s: torch.Tensor, t: float, lay: tuple[int, int]) -> torch.Tensor:
    """`fused` with λ = 1 + softplus(s/t) computed inside the op: a layer adds one autograd node per step, not four."""
    return _ops["autograd_s"](x, s, float(t), *lay)


def forward(x: torch.Tensor, lam: torch.Tensor, lay: tuple[int, int]) -> torch.Tensor:
    return _ops["forward"](x.contiguous(), lam.reshape(-1).contiguous(), *lay)


def backward(grad, x, lam, lay, need_x: bool, need_lam: bool):
    gx, gl = _ops["backward"](grad.contiguous(), x.contiguous(), lam.reshape(-1).contiguous(), *lay, need_lam)
    return (gx if need_x else None), (gl.reshape(lam.shape) if need_lam else None)


def main() -> int:
    """Build (or find) the kernel now, so that no run pays for it (`.ci/setup`); 0 when it is ready."""
    t0 = time.perf_counter()
    ok = build()
    print(f"λ-GELU fused CPU kernel: {'ready' if ok else 'unavailable'} ({status.detail.get('library') or status.error}; "
          f"{time.perf_counter() - t0:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
