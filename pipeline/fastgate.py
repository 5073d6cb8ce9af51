"""Fast λ-GELU kernels: x·Φ(λx) forward and backward, each in one pass over memory, saving only x and λ.

`pipeline.activations.lambda_gelu` (training) calls `fused` here, which runs the cpp kernel as one op whose
autograd is registered in C++, or else `_LambdaGELUFunction`, which calls `forward` / `backward` here.
`lambda_gelu_s` / `fused_s` do the same with λ = 1 + softplus(s/t) computed inside the op. Which kernel
runs is one process-wide choice (`use_kernel` sets it for a block and restores it; `LAMBDA_GELU_KERNEL`
sets the default):

  cpp       our fused CPU kernel (float32, float64). Built once per machine with the system C++ compiler
            against torch's own headers (20–50 s) and cached under ~/.cache/lambda_gelu_pipeline
            (LAMBDA_GELU_CACHE moves it); later processes only load it. float32 uses the erf approximation
            of ATen's vectorized `erf` (A&S 7.1.26, |error| ≤ 1.5e-7) with one exponential shared between
            Φ and φ; float64 uses SLEEF's erfc and exp (≈ 1 ulp).
  inductor  `torch.compile`d forward/backward bodies (Triton on CUDA, C++ on CPU), dynamic shapes.
  eager     native ATen ops: the fused `gelu_backward` for ∂/∂x and in-place passes for ∂/∂λ.
  auto      cpp on CPU, inductor on CUDA, eager for everything else (default).

A kernel that cannot be built or compiled is recorded with its reason (`status()`), warned about once,
and the call falls back to eager: training never fails for want of a compiler.

Gradients (z = λx): ∂f/∂x = Φ(z) + z·φ(z), ∂f/∂λ = x²·φ(z) = x·(z·φ(z))/λ. The last form never multiplies
an overflowing x² by an underflowing φ; z is clamped to ±40 where it multiplies φ, which is exactly 0
there in float32, so z = ±inf gives 0 instead of inf·0.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

KERNELS = ("auto", "cpp", "inductor", "eager")
ENV_KERNEL = "LAMBDA_GELU_KERNEL"
ENV_CACHE = "LAMBDA_GELU_CACHE"

INV_SQRT2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
PDF_CLAMP = 40.0  # |z| beyond which the float32 normal pdf is exactly 0

_CPP_DTYPES = (torch.float32, torch.float64)


def _env_kernel() -> str:
    name = os.environ.get(ENV_KERNEL, "auto").strip().lower() or "auto"
    if name not in KERNELS:
        warnings.warn(f"{ENV_KERNEL}={name!r} is not one of {', '.join(KERNELS)}; using auto", stacklevel=2)
        return "auto"
    return name


_kernel = _env_kernel()


def get_kernel() -> str:
    return _kernel


def set_kernel(name: str) -> None:
    """Process-wide kernel choice; prefer `use_kernel`, which restores the previous one."""
    global _kernel
    if name not in KERNELS:
        raise ValueError(f"λ-GELU kernel {name!r} is unknown; choose one of {', '.join(KERNELS)}")
    _kernel = name


@contextlib.contextmanager
def use_kernel(name: str) -> Iterator[None]:
    previous = _kernel
    set_kernel(name)
    try:
        yield
    finally:
        set_kernel(previous)


# ---------------------------------------------------------------------------------------------
# Layout: the kernels take x as [outer, C, inner] with one λ per C (C = 1: one λ for the layer).


def layout(x: torch.Tensor, lam: torch.Tensor) -> tuple[int, int] | None:
    """(C, inner) when λ is a scalar or varies along exactly one dim of x; None otherwise (eager handles it)."""
    if x.numel() == 0 or lam.dim() > x.dim():
        return None
    if lam.numel() == 1:
        return 1, x.numel()
    shape = (1,) * (x.dim() - lam.dim()) + tuple(lam.shape)
    dims = [d for d, n in enumerate(shape) if n != 1]
    if len(dims) != 1 or shape[dims[0]] != x.shape[dims[0]]:
        return None
    d = dims[0]
    return x.shape[d], math.prod(x.shape[d + 1:])


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce a broadcast gradient back to `shape` (the λ tensor's shape)."""
    if t.shape == shape:
        return t
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead > 0 else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


# ---------------------------------------------------------------------------------------------
# eager: native ATen kernels, in-place wherever a temporary is ours.


def eager_forward(x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    y = torch.mul(x, lam)
    torch._C._nn.gelu_(y)  # GELU(λx)/λ reuses the native (oneDNN) GELU
    return y.div_(lam)


def eager_backward(grad: torch.Tensor, x: torch.Tensor, lam: torch.Tensor, need_x: bool, need_lam: bool):
    # Clamping z to ±40 changes neither GELU'(z) nor z·φ(z) (both saturate there, in float32 and float64) but
    # keeps z = ±inf finite.
    zc = torch.mul(x, lam).clamp_(-PDF_CLAMP, PDF_CLAMP)
    # d/dx[GELU(λx)/λ] = GELU'(λx): one native kernel.
    gx = torch.ops.aten.gelu_backward(grad, zc) if need_x else None
    if gx is not None and gx.shape != x.shape:  # λ broadcast x to a larger shape
        gx = _sum_to(gx, x.shape)
    glam = None
    if need_lam:
        t = torch.square(zc).mul_(-0.5).exp_().mul_(zc)  # z·e^{−z²/2}
        t.mul_(x).mul_(grad)
        glam = _sum_to(t, lam.shape).mul(INV_SQRT_2PI).div_(lam)
    return gx, glam


# ---------------------------------------------------------------------------------------------
# cpp: our fused CPU kernel.

_CPP_SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>
#include <algorithm>
#include <cmath>
#include <vector>

using at::vec::Vectorized;

namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kClamp = 40.0;  // z·φ(z) is exactly 0 beyond; the clamp only turns z = ±inf into 0
constexpr int64_t kGrain = 16384;  // half ATen's: a 128×256 activation runs on 2 threads, as oneDNN's GELU does
                                   // (the MLP epoch ratio drops ~5% on 2 idle cores vs 32768)

// Φ(z) and e = exp(−z²/2) from one exponential.
template <typename T>
struct Gauss;

template <>
struct Gauss<float> {
  using V = Vectorized<float>;
  // A&S 7.1.26 (ATen's vectorized float erf): erfc(|w|) ≈ t·r(t)·exp(−w²), t = 1/(1 + p|w|), |error| ≤ 1.5e-7.
  static inline V cdf(const V& z, V& e) {
    const V w = z * V(float(kInvSqrt2));
    const V t = V(1.f) / at::vec::fmadd(V(0.3275911f), w.abs(), V(1.f));
    V r = at::vec::fmadd(V(1.061405429f), t, V(-1.453152027f));
    r = at::vec::fmadd(r, t, V(1.421413741f));
    r = at::vec::fmadd(r, t, V(-0.284496736f));
    r = at::vec::fmadd(r, t, V(0.254829592f));
    e = (w * w).neg().exp_u20();
    const V tail = V(0.5f) * r * t * e;  // Φ(−|z|)
    return V::blendv(tail, V(1.f) - tail, z >= V(0.f));
  }
};

template <>
struct Gauss<double> {
  using V = Vectorized<double>;
  static inline V cdf(const V& z, V& e) {
    const V w = z * V(kInvSqrt2);
    e = (w * w).neg().exp();
    return V(0.5) * w.neg().erfc();
  }
};

template <typename T>
inline T cdf_scalar(T z, T& e) {
  const T w = z * T(kInvSqrt2);
  e = std::exp(-w * w);
  return T(0.5) * std::erfc(-w);
}

// Calls f(offset, length, c, step) for the runs of [b, e) over which λ is one value λ[c] (step 0:
// inner > 1 or a single λ) or runs along the elements, λ[c + j] (step 1: inner == 1).
template <typename F>
inline void for_segments(int64_t b, int64_t e, int64_t C, int64_t inner, const F& f) {
  int64_t i = b;
  while (i < e) {
    if (inner > 1 || C == 1) {
      const int64_t row = i / inner;
      const int64_t stop = std::min(e, (row + 1) * inner);
      f(i, stop - i, row % C, 0);
      i = stop;
    } else {
      const int64_t c = i % C;
      const int64_t stop = std::min(e, i - c + C);
      f(i, stop - i, c, 1);
      i = stop;
    }
  }
}

template <typename T>
void forward_impl(const T* x, const T* lam, T* y, int64_t n, int64_t C, int64_t inner) {
  using V = Vectorized<T>;
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for_segments(b, e, C, inner, [&](int64_t off, int64_t len, int64_t c, int step) {
      const T* xs = x + off;
      T* ys = y + off;
      const T* ls = lam + c;
      const V l0 = V(ls[0]);
      V ex;
      int64_t j = 0;
      for (; j + V::size() <= len; j += V::size()) {
        const V xv = V::loadu(xs + j);
        const V lv = step ? V::loadu(ls + j) : l0;
        (xv * Gauss<T>::cdf(xv * lv, ex)).store(ys + j);
      }
      for (; j < len; ++j) {
        T es;
        ys[j] = xs[j] * cdf_scalar(xs[j] * ls[step * j], es);
      }
    });
  });
}

// acc: [chunks, C] doubles, chunk k sums its own elements (deterministic for any thread count).
template <typename T, bool kLamGrad>
void backward_impl(const T* g, const T* x, const T* lam, T* gx, double* acc, int64_t n, int64_t C, int64_t inner,
                   int64_t chunks) {
  using V = Vectorized<T>;
  const V beta = V(T(kInvSqrt2Pi)), lo = V(T(-kClamp)), hi = V(T(kClamp));
  const int64_t chunk = (n + chunks - 1) / chunks;
  at::parallel_for(0, chunks, 1, [&](int64_t kb, int64_t ke) {
    for (int64_t k = kb; k < ke; ++k) {
      double* mine = kLamGrad ? acc + k * C : nullptr;
      for_segments(k * chunk, std::min(n, (k + 1) * chunk), C, inner, [&](int64_t off, int64_t len, int64_t c, int step) {
        const T* gs = g + off;
        const T* xs = x + off;
        T* os = gx + off;
        const T* ls = lam + c;
        const V l0 = V(ls[0]);
        T tmp[V::size()];
        V block = V(T(0));
        int pending = 0;
        int64_t j = 0;
        for (; j + V::size() <= len; j += V::size()) {
          const V xv = V::loadu(xs + j);
          const V gv = V::loadu(gs + j);
          const V z = xv * (step ? V::loadu(ls + j) : l0);
          V ex;
          const V cdf = Gauss<T>::cdf(z, ex);
          const V zpdf = at::vec::clamp(z, lo, hi) * ex * beta;  // z·φ(z)
          (gv * (cdf + zpdf)).store(os + j);
          if constexpr (kLamGrad) {
            const V term = gv * xv * zpdf;  // λ·∂L/∂λ per element
            if (step) {
              term.store(tmp);
              for (int q = 0; q < V::size(); ++q) mine[c + j + q] += double(tmp[q]);
            } else {
              block = block + term;
              if (++pending == 64) {  // float partial sums move to double every 64 vectors
                block.store(tmp);
                for (int q = 0; q < V::size(); ++q) mine[c] += double(tmp[q]);
                block = V(T(0));
                pending = 0;
              }
            }
          }
        }
        if constexpr (kLamGrad) {
          if (!step) {
            block.store(tmp);
            for (int q = 0; q < V::size(); ++q) mine[c] += double(tmp[q]);
          }
        }
        for (; j < len; ++j) {
          const T z = xs[j] * ls[step * j];
          T es;
          const T cdf = cdf_scalar(z, es);
          const T zpdf = std::min(std::max(z, T(-kClamp)), T(kClamp)) * es * T(kInvSqrt2Pi);
          os[j] = gs[j] * (cdf + zpdf);
          if constexpr (kLamGrad) mine[c + step * j] += double(gs[j] * xs[j] * zpdf);
        }
      });
    }
  });
}

void check(const at::Tensor& x, const at::Tensor& lam, int64_t C, int64_t inner) {
  TORCH_CHECK(x.device().is_cpu() && lam.device().is_cpu(), "lambda_gelu_fast: CPU tensors only");
  TORCH_CHECK(x.is_contiguous() && lam.is_contiguous(), "lambda_gelu_fast: contiguous tensors only");
  TORCH_CHECK(x.scalar_type() == lam.scalar_type(), "lambda_gelu_fast: x and lam dtypes differ");
  TORCH_CHECK(C >= 1 && inner >= 1 && lam.numel() == C && x.numel() % (C * inner) == 0,
              "lambda_gelu_fast: lam must hold C values and x be [outer, C, inner]");
}

at::Tensor fast_forward(const at::Tensor& x, const at::Tensor& lam, int64_t C, int64_t inner) {
  check(x, lam, C, inner);
  at::Tensor y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lambda_gelu_fast_forward", [&] {
    forward_impl<scalar_t>(x.const_data_ptr<scalar_t>(), lam.const_data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                           x.numel(), C, inner);
  });
  return y;
}

// (grad_x, grad_lam [C]); grad_lam is empty when lam_grad is false.
std::tuple<at::Tensor, at::Tensor> fast_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& lam,
                                                 int64_t C, int64_t inner, bool lam_grad) {
  check(x, lam, C, inner);
  TORCH_CHECK(grad.is_contiguous() && grad.sizes() == x.sizes() && grad.scalar_type() == x.scalar_type(),
              "lambda_gelu_fast: grad must be contiguous and shaped like x");
  const int64_t n = x.numel();
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(256, (int64_t(1) << 18) / C));
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(cap, (n + kGrain - 1) / kGrain));
  at::Tensor gx = at::empty_like(x);
  at::Tensor glam = at::empty({lam_grad ? C : 0}, x.options());
  std::vector<double> acc(lam_grad ? chunks * C : 0, 0.0);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lambda_gelu_fast_backward", [&] {
    const scalar_t* gp = grad.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* lp = lam.const_data_ptr<scalar_t>();
    scalar_t* op = gx.data_ptr<scalar_t>();
    if (lam_grad) {
      backward_impl<scalar_t, true>(gp, xp, lp, op, acc.data(), n, C, inner, chunks);
      scalar_t* out = glam.data_ptr<scalar_t>();
      for (int64_t c = 0; c < C; ++c) {
        double s = 0.0;
        for (int64_t k = 0; k < chunks; ++k) s += acc[k * C + c];
        out[c] = scalar_t(s / double(lp[c]));  // ∂L/∂λ = Σ g·x·z·φ(z)/λ = Σ g·x²·φ(λx)
      }
    } else {
      backward_impl<scalar_t, false>(gp, xp, lp, op, nullptr, n, C, inner, chunks);
    }
  });
  return {gx, glam};
}

// The same kernels with autograd in C++: one dispatcher call per forward and per backward, no Python.
struct LambdaGeluFunction : public torch::autograd::Function<LambdaGeluFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& lam,
                            int64_t C, int64_t inner) {
    ctx->save_for_backward({x, lam});  // exactly what GELU saves, plus λ
    ctx->saved_data["C"] = C;
    ctx->saved_data["inner"] = inner;
    return fast_forward(x.contiguous(), lam.reshape({-1}).contiguous(), C, inner);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& lam = saved[1];
    const bool need_x = ctx->needs_input_grad(0), need_lam = ctx->needs_input_grad(1);
    if (!grads[0].defined() || !(need_x || need_lam)) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    auto out = fast_backward(grads[0].contiguous(), x.contiguous(), lam.reshape({-1}).contiguous(),
                          ctx->saved_data["C"].toInt(), ctx->saved_data["inner"].toInt(), need_lam);
    return {need_x ? std::get<0>(out) : at::Tensor(), need_lam ? std::get<1>(out).view(lam.sizes()) : at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

at::Tensor lambda_gelu(const at::Tensor& x, const at::Tensor& lam, int64_t C, int64_t inner) {
  return LambdaGeluFunction::apply(x, lam, C, inner);
}

// λ = 1 + softplus(s/t) and dλ/ds, exactly as F.softplus (threshold 20: the identity above).
inline double lambda_of(double u) { return 1.0 + (u > 20.0 ? u : std::log1p(std::exp(u))); }
inline double dlambda_ds(double u, double t) { return (u > 20.0 ? 1.0 : 1.0 / (1.0 + std::exp(-u))) / t; }

at::Tensor lambdas_from_s(const at::Tensor& s, double t) {  // s: C contiguous values
  at::Tensor lam = at::empty({s.numel()}, s.options());
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "lambda_gelu_fast_lambda", [&] {
    const scalar_t* sp = s.const_data_ptr<scalar_t>();
    scalar_t* lp = lam.data_ptr<scalar_t>();
    for (int64_t c = 0; c < s.numel(); ++c) lp[c] = scalar_t(lambda_of(double(scalar_t(sp[c] / scalar_t(t)))));
  });
  return lam;
}

// λ-GELU with λ computed from the hardness parameter s inside the op: no softplus, add, or reshape nodes
// per layer and step. Saves x and s.
struct LambdaGeluSFunction : public torch::autograd::Function<LambdaGeluSFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& s,
                            double t, int64_t C, int64_t inner) {
    ctx->save_for_backward({x, s});
    ctx->saved_data["t"] = t;
    ctx->saved_data["C"] = C;
    ctx->saved_data["inner"] = inner;
    return fast_forward(x.contiguous(), lambdas_from_s(s.reshape({-1}).contiguous(), t), C, inner);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor s = saved[1].reshape({-1}).contiguous();
    const double t = ctx->saved_data["t"].toDouble();
    const bool need_x = ctx->needs_input_grad(0), need_s = ctx->needs_input_grad(1);
    if (!grads[0].defined() || !(need_x || need_s)) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    auto out = fast_backward(grads[0].contiguous(), x.contiguous(), lambdas_from_s(s, t),
                             ctx->saved_data["C"].toInt(), ctx->saved_data["inner"].toInt(), need_s);
    at::Tensor gs;
    if (need_s) {
      gs = std::get<1>(out);  // ∂L/∂λ, [C]
      AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "lambda_gelu_fast_grad_s", [&] {
        const scalar_t* sp = s.const_data_ptr<scalar_t>();
        scalar_t* gp = gs.data_ptr<scalar_t>();
        for (int64_t c = 0; c < s.numel(); ++c) gp[c] = scalar_t(double(gp[c]) * dlambda_ds(double(scalar_t(sp[c] / scalar_t(t))), t));
      });
      gs = gs.view(saved[1].sizes());
    }
    return {need_x ? std::get<0>(out) : at::Tensor(), gs, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor lambda_gelu_s(const at::Tensor& x, const at::Tensor& s, double t, int64_t C, int64_t inner) {
  return LambdaGeluSFunction::apply(x, s, t, C, inner);
}

}  // namespace

TORCH_LIBRARY(lambda_gelu_fast, m) {
  m.def("forward(Tensor x, Tensor lam, int C, int inner) -> Tensor", &fast_forward);
  m.def("backward(Tensor grad, Tensor x, Tensor lam, int C, int inner, bool lam_grad) -> (Tensor, Tensor)", &fast_backward);
  m.def("lambda_gelu(Tensor x, Tensor lam, int C, int inner) -> Tensor", &lambda_gelu);
  m.def("lambda_gelu_s(Tensor x, Tensor s, float t, int C, int inner) -> Tensor", &lambda_gelu_s);
}
"""

# Vector ISA flags for the CPU torch itself dispatches to (at::vec picks its implementation from them).
_ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mfma", "-mf16c",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}


class _Status:
    """What happened to one backend in this process (for logs, manifests and benchmarks)."""

    def __init__(self) -> None:
        self.ready: bool | None = None  # None: not tried yet
        self.error: str | None = None
        self.seconds: float | None = None
        self.detail: dict[str, Any] = {}

    def as_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "error": self.error, "seconds": self.seconds, **self.detail}


_cpp = _Status()
_cpp_ops: dict[str, Any] = {}  # the loaded ops' default overloads
_inductor = _Status()
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


def build_cpp() -> bool:
    """Build (once per machine) and load (once per process) the fused CPU kernel; False if impossible."""
    if _cpp.ready is not None:
        return _cpp.ready
    with _lock:
        if _cpp.ready is not None:
            return _cpp.ready
        t0 = time.perf_counter()
        try:
            cxx = _compiler()
            if cxx is None:
                raise RuntimeError("no C++ compiler found (set CXX, or install g++ / clang++)")
            probe = _build_command(cxx, Path("kernel.cpp"), Path("kernel.so"))
            key = hashlib.sha256("\0".join([_CPP_SOURCE, torch.__version__, sys.version, *probe]).encode()).hexdigest()[:16]
            d = cache_dir() / f"lambda_gelu_fast-{key}"
            lib = d / "lambda_gelu_fast.so"
            built = False
            if not lib.is_file():
                d.mkdir(parents=True, exist_ok=True)
                src = d / "kernel.cpp"
                src.write_text(_CPP_SOURCE)
                tmp = d / f"lambda_gelu_fast.{os.getpid()}.so"
                res = subprocess.run(_build_command(cxx, src, tmp), capture_output=True, text=True, timeout=900)
                if res.returncode != 0:
                    tail = "\n".join(res.stderr.strip().splitlines()[-15:])
                    raise RuntimeError(f"compiling {src} failed ({cxx}, exit {res.returncode}):\n{tail}")
                os.replace(tmp, lib)  # atomic: concurrent builders all end with one complete library
                built = True
            torch.ops.load_library(str(lib))
            _cpp_ops["forward"] = torch.ops.lambda_gelu_fast.forward.default
            _cpp_ops["backward"] = torch.ops.lambda_gelu_fast.backward.default
            _cpp_ops["autograd"] = torch.ops.lambda_gelu_fast.lambda_gelu.default
            _cpp_ops["autograd_s"] = torch.ops.lambda_gelu_fast.lambda_gelu_s.default
            _cpp.ready, _cpp.detail = True, {"library": str(lib), "built_now": built, "compiler": cxx,
                                            "isa": torch.backends.cpu.get_cpu_capability()}
        except Exception as exc:  # any failure (no compiler, headers, linker, loader) means: use another kernel
            _cpp.ready, _cpp.error = False, f"{type(exc).__name__}: {exc}"
            warnings.warn(f"λ-GELU: the fused CPU kernel is unavailable, falling back to eager ops ({_cpp.error})",
                          RuntimeWarning, stacklevel=3)
        _cpp.seconds = round(time.perf_counter() - t0, 3)
        return _cpp.ready


def fused(x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor | None:
    """λ-GELU with autograd, through our CPU kernel whose backward is registered in C++ (no Python runs
    per call: at an MLP's 128×256 activations that overhead is as large as the arithmetic); None when
    the current kernel choice does not resolve to it for these tensors."""
    name, lay = backend_for(x, lam)
    if name != "cpp":
        return None
    return _cpp_ops["autograd"](x, lam, *lay)


def fused_s(x: torch.Tensor, s: torch.Tensor, t: float) -> torch.Tensor | None:
    """`fused` with λ = 1 + softplus(s/t) computed inside the op (s shaped to broadcast like λ); the
    gradient flows to s directly, so a layer adds one autograd node per step instead of four."""
    name, lay = backend_for(x, s)
    if name != "cpp":
        return None
    return _cpp_ops["autograd_s"](x, s, float(t), *lay)


def cpp_forward(x: torch.Tensor, lam: torch.Tensor, lay: tuple[int, int]) -> torch.Tensor:
    return _cpp_ops["forward"](x.contiguous(), lam.reshape(-1).contiguous(), *lay)


def cpp_backward(grad, x, lam, lay, need_x: bool, need_lam: bool):
    gx, gl = _cpp_ops["backward"](grad.contiguous(), x.contiguous(), lam.reshape(-1).contiguous(), *lay, need_lam)
    return (gx if need_x else None), (gl.reshape(lam.shape) if need_lam else None)


# ---------------------------------------------------------------------------------------------
# inductor: torch.compile'd bodies.


def _ind_forward(x, lam):
    return x * (0.5 + 0.5 * torch.erf(x * lam * INV_SQRT2))


def _ind_backward(grad, x, lam, need_lam: bool):
    z = x * lam
    zc = z.clamp(-PDF_CLAMP, PDF_CLAMP)
    zpdf = zc * torch.exp(-0.5 * zc * zc) * INV_SQRT_2PI
    gx = grad * (0.5 + 0.5 * torch.erf(z * INV_SQRT2) + zpdf)
    if not need_lam:
        return gx, None
    acc = torch.float64 if x.dtype in (torch.float32, torch.float64) else torch.float32
    gl = (grad * x * zpdf).to(acc).sum_to_size(lam.shape) / lam.to(acc)
    return gx, gl.to(x.dtype)


_compiled: dict[str, Any] = {}


def _inductor_call(name: str, fn, *args):
    """Run the compiled body; on the first failure record it, warn once, and return None."""
    if _inductor.ready is False:
        return None
    try:
        if name not in _compiled:
            _compiled[name] = torch.compile(fn, dynamic=True)
        t0 = time.perf_counter()
        out = _compiled[name](*args)
        if _inductor.ready is None:
            _inductor.ready, _inductor.seconds = True, round(time.perf_counter() - t0, 3)
        return out
    except Exception as exc:  # no compiler / Triton / unsupported backend: eager from now on
        _inductor.ready, _inductor.error = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        warnings.warn(f"λ-GELU: torch.compile of the kernel failed, falling back to eager ops ({_inductor.error})",
                      RuntimeWarning, stacklevel=3)
        return None


# ---------------------------------------------------------------------------------------------
# Dispatch


def backend_for(x: torch.Tensor, lam: torch.Tensor) -> tuple[str, tuple[int, int] | None]:
    """The kernel that will run for these tensors now, and its layout."""
    mode = _kernel
    if mode == "eager":
        return "eager", None
    lay = layout(x, lam)
    if lay is None:
        return "eager", None
    cpp_ok = x.device.type == "cpu" and x.dtype in _CPP_DTYPES and lam.device.type == "cpu" and lam.dtype == x.dtype
    if mode == "cpp" or (mode == "auto" and cpp_ok):
        if cpp_ok and build_cpp():
            return "cpp", lay
        return "eager", None
    if mode == "inductor" or (mode == "auto" and x.device.type == "cuda"):
        return ("inductor", lay) if _inductor.ready is not False else ("eager", None)
    return "eager", None


def forward(x: torch.Tensor, lam: torch.Tensor, backend: tuple[str, Any]) -> torch.Tensor:
    name, lay = backend
    if name == "cpp":
        return cpp_forward(x, lam, lay)
    if name == "inductor":
        out = _inductor_call("forward", _ind_forward, x, lam)
        if out is not None:
            return out
    return eager_forward(x, lam)


def backward(grad, x, lam, backend: tuple[str, Any], need_x: bool, need_lam: bool):
    name, lay = backend
    if name == "cpp":
        return cpp_backward(grad, x, lam, lay, need_x, need_lam)
    if name == "inductor":
        out = _inductor_call("backward_lam" if need_lam else "backward_x", _ind_backward, grad, x, lam, need_lam)
        if out is not None:
            return (out[0] if need_x else None), out[1]
    return eager_backward(grad, x, lam, need_x, need_lam)


def status() -> dict[str, Any]:
    """The kernel choice and what each backend did in this process (record it next to timings)."""
    return {"kernel": _kernel, "cpp": _cpp.as_dict(), "inductor": _inductor.as_dict(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


# ---------------------------------------------------------------------------------------------
# Whole-model torch.compile, for a `train.compile` switch.

_probe: dict[str, str | None] = {}


def compiler_unavailable(device: torch.device | str = "cpu") -> str | None:
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


def maybe_compile(model: nn.Module, enabled: bool, device: torch.device | str = "cpu") -> nn.Module:
    """`model.compile(dynamic=True)` in place (state_dict keys unchanged) when enabled and a compiler works;
    otherwise the model as it is, with a warning that says why. Inside a compiled graph λ-GELU is the plain
    expression (see `pipeline.activations.lambda_gelu`), which inductor fuses and differentiates itself."""
    if not enabled:
        return model
    reason = compiler_unavailable(device)
    if reason is not None:
        warnings.warn(f"train.compile: torch.compile does not work here, training eagerly ({reason})", RuntimeWarning,
                      stacklevel=2)
        return model
    model.compile(dynamic=True)
    return model
