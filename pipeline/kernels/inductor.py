"""`torch.compile`d forward/backward bodies (Triton on CUDA, C++ on CPU), dynamic shapes. A failure to
compile is recorded, warned about once, and answered with None so the caller falls back to eager."""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from .common import INV_SQRT_2PI, PDF_CLAMP, Phi
from .status import Status

status = Status()
_compiled: dict[str, Any] = {}


def _forward(x, lam):
    return x * Phi(x * lam)


def _backward(grad, x, lam, need_lam: bool):
    z = x * lam
    zc = z.clamp(-PDF_CLAMP, PDF_CLAMP)
    zpdf = zc * torch.exp(-0.5 * zc * zc) * INV_SQRT_2PI
    gx = grad * (Phi(z) + zpdf)
    if not need_lam:
        return gx, None
    acc = torch.float64 if x.dtype in (torch.float32, torch.float64) else torch.float32
    gl = (grad * x * zpdf).to(acc).sum_to_size(lam.shape) / lam.to(acc)
    return gx, gl.to(x.dtype)


def _call(name: str, fn, *args):
    """Run the compiled body; on the first failure record it, warn once, and return None."""
    if status.ready is False:
        return None
    try:
        if name not in _compiled:
            _compiled[name] = torch.compile(fn, dynamic=True)
        t0 = time.perf_counter()
        out = _compiled[name](*args)
        if status.ready is None:
            status.ready, status.seconds = True, round(time.perf_counter() - t0, 3)
        return out
    except Exception as exc:  # no compiler / Triton / unsupported backend: eager from now on
        status.ready, status.error = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        warnings.warn(f"λ-GELU: torch.compile of the kernel failed, falling back to eager ops ({status.error})",
                      RuntimeWarning, stacklevel=3)
        return None


def forward(x, lam):
    return _call("forward", _forward, x, lam)


def backward(grad, x, lam, need_lam: bool):
    return _call("backward_lam" if need_lam else "backward_x", _backward, grad, x, lam, need_lam)


_probe: dict[str, str | None] = {}


def unavailable(device: torch.device | str = "cpu") -> str | None:
    """None when torch.compile works on `device` (probed once per process with a tiny function), else why not."""
    dev = torch.device(device).type
    if dev not in _probe:
        try:
            f = torch.compile(lambda t: torch.erf(t) * 2.0 + 1.0, dynamic=False)
            f(torch.ones(8, device=dev))
            _probe[dev] = None
        except Exception as exc:
            _probe[dev] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return _probe[dev]
