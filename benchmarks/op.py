"""The activation op alone: λ-GELU forward+backward (gradients for x and λ) against F.gelu forward+backward,
and the bytes each implementation saves for backward.

Candidates:
  gelu                     F.gelu, the baseline (saves x)
  relu                     F.relu, for scale
  reference_erf_autograd   x·0.5·(1 + erf(λx/√2)) differentiated by autograd
  expression_autograd      GELU(λx)/λ differentiated by autograd
  compiled_expression      torch.compile of GELU(λx)/λ (what a whole-model compile would run)
  lambda_gelu[K]           pipeline.activations.lambda_gelu with kernel K (eager, cpp, inductor);
                           the kernel training uses by default ("auto") is named in `training_path`
  lambda_gelu[K,frozen]    the same without ∂/∂λ (the annealing phase: λ is a buffer)
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from pipeline import kernels
from pipeline.activations import lambda_gelu, lambda_gelu_reference
from pipeline.kernels import cpu as cpu_kernel
from pipeline.kernels import inductor

from .common import interleaved, paired_ratio, summary


def _expression(x, lam):
    return F.gelu(x * lam) / lam


def saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of the distinct tensors autograd saves for backward while fn() runs its forward."""
    seen: dict[tuple, int] = {}

    def pack(t: torch.Tensor):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        seen[key] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def _candidates(device: torch.device, compile_ok: bool) -> dict[str, tuple[Callable, str | None, bool]]:
    """name -> (f(x, lam) or f(x), kernel or None, uses λ)."""
    c: dict[str, tuple[Callable, str | None, bool]] = {
        "gelu": (lambda x, lam: F.gelu(x), None, False),
        "relu": (lambda x, lam: F.relu(x), None, False),
        "reference_erf_autograd": (lambda_gelu_reference, None, True),
        "expression_autograd": (_expression, None, True),
    }
    if compile_ok:
        c["compiled_expression"] = (torch.compile(_expression, dynamic=False), None, True)
    names = ["eager"]
    if device.type == "cpu" and cpu_kernel.build():
        names.append("cpp")
    if compile_ok:
        names.append("inductor")
    for k in names:
        c[f"lambda_gelu[{k}]"] = (lambda_gelu, k, True)
    path = kernels.backend_for(torch.ones(8, device=device), torch.tensor(1.5, device=device))[0]
    c[f"lambda_gelu[{path},frozen]"] = (lambda_gelu, path, False)
    return c


def bench_op(shape: tuple[int, ...], reps: int, device: torch.device | str = "cpu", inner: int = 1,
             dtype: torch.dtype = torch.float32, compile_ok: bool | None = None) -> dict[str, Any]:
    device = torch.device(device)
    if compile_ok is None:
        compile_ok = inductor.unavailable(device) is None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen, dtype=dtype).to(device).requires_grad_()
    g = torch.randn(shape, generator=gen, dtype=dtype).to(device)
    lam = torch.tensor(1.3, dtype=dtype, device=device, requires_grad=True)
    lam_frozen = torch.tensor(1.3, dtype=dtype, device=device)
    cands = _candidates(device, compile_ok)

    def runner(f, kernel, uses_lam, frozen):
        lam_used = lam_frozen if frozen else lam

        def call():
            if kernel is None:
                y = f(x, lam_used)
                y.backward(g)
            else:
                with kernels.use_kernel(kernel):
                    y = f(x, lam_used)
                    y.backward(g)
            x.grad = None
            lam.grad = None
        return call

    fns = {name: runner(f, k, u, "frozen" in name) for name, (f, k, u) in cands.items()}
    first_call: dict[str, float] = {}
    for name, fn in fns.items():  # first calls compile (torch.compile) or load (cpp): timed apart
        t0 = time.perf_counter()
        fn()
        first_call[name] = round(time.perf_counter() - t0, 3)
    times = interleaved(fns, reps, inner=inner, warmup=1, device=device)

    saved = {}
    for name, (f, k, u) in cands.items():
        lam_used = lam_frozen if "frozen" in name else lam
        with kernels.use_kernel(k or kernels.get_kernel()):
            saved[name] = saved_bytes(lambda: f(x, lam_used))
    peak: dict[str, int] = {}
    if device.type == "cuda":  # peak memory of one forward+backward above what was allocated before it
        for name, fn in fns.items():
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            peak[name] = torch.cuda.max_memory_allocated() - base
    path = kernels.backend_for(x, lam)[0]
    return {
        "shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "device": str(device), "reps": reps, "inner": inner,
        "training_path": f"lambda_gelu[{path}]",
        "times_ms": {n: summary(t, 1e3) for n, t in times.items()},
        "ratio_vs_gelu": {n: paired_ratio(t, times["gelu"]) for n, t in times.items()},
        "saved_bytes": saved,
        "extra_saved_bytes_vs_gelu": {n: b - saved["gelu"] for n, b in saved.items()},
        "first_call_s": first_call,
        **({"cuda_peak_extra_bytes": peak} if peak else {}),
        "kernel_status": kernels.status(),
    }
