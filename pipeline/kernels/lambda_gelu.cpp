// Fused λ-GELU CPU kernel: y = x·Φ(λx), ∂x and ∂λ in one pass each, saving only x and λ (or s).
// Built once per machine by pipeline/kernels/cpu.py against torch's own headers; ops in the
// `lambda_gelu_fast` namespace, with autograd registered in C++ (one dispatcher call per direction).

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
#include <type_traits>
#include <vector>
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <xmmintrin.h>
#endif

using at::vec::Vectorized;

namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kClamp = 40.0;  // z·φ(z) is exactly 0 beyond; the clamp only turns z = ±inf into 0
constexpr int64_t kGrain = 16384;  // half ATen's: a 128×256 activation runs on 2 threads, as oneDNN's GELU does
                                   // (the MLP epoch ratio drops ~5% on 2 idle cores vs 32768)

// Φ(z) (forward) and Φ(z) with e = exp(−z²/2) (backward). The left tail keeps float32 relative accuracy:
// Φ(−|z|) = erfc(w)/2 is computed directly, never as 1 − something.
template <typename T>
struct Gauss;

template <>
struct Gauss<float> {
  using V = Vectorized<float>;
  // erfc(w) = t·exp(−w² + P(t)), t = 1/(1 + w/2), w ≥ 0 (Numerical Recipes' erfcc, Chebyshev fit): relative
  // error ≤ 1.2e-7 for every w, so Φ(z) keeps float32 relative accuracy down to z ≈ −13, where it leaves the
  // normal range. Returns P(t) and t.
  static inline V tail_poly(const V& w, V& t) {
    t = V(1.f) / at::vec::fmadd(V(0.5f), w, V(1.f));
    V p = at::vec::fmadd(V(0.17087277f), t, V(-0.82215223f));
    p = at::vec::fmadd(p, t, V(1.48851587f));
    p = at::vec::fmadd(p, t, V(-1.13520398f));
    p = at::vec::fmadd(p, t, V(0.27886807f));
    p = at::vec::fmadd(p, t, V(-0.18628806f));
    p = at::vec::fmadd(p, t, V(0.09678418f));
    p = at::vec::fmadd(p, t, V(0.37409196f));
    p = at::vec::fmadd(p, t, V(1.00002368f));
    return at::vec::fmadd(p, t, V(-1.26551223f));
  }
  static inline V cdf(const V& z) {
    const V w = z.abs() * V(float(kInvSqrt2));
    V t;
    const V p = tail_poly(w, t);
    const V tail = V(0.5f) * t * (p - w * w).exp_u20();  // Φ(−|z|)
    return V::blendv(tail, V(1.f) - tail, z >= V(0.f));
  }
  static inline V cdf(const V& z, V& e) {
    const V w = z.abs() * V(float(kInvSqrt2));
    V t;
    const V p = tail_poly(w, t);
    e = (w * w).neg().exp_u20();
    const V tail = V(0.5f) * t * e * p.exp_u20();
    return V::blendv(tail, V(1.f) - tail, z >= V(0.f));
  }
};

template <>
struct Gauss<double> {
  using V = Vectorized<double>;
  static inline V cdf(const V& z) { return V(0.5) * (z * V(-kInvSqrt2)).erfc(); }
  static inline V cdf(const V& z, V& e) {
    const V w = z * V(kInvSqrt2);
    e = (w * w).neg().exp();
    return V(0.5) * w.neg().erfc();
  }
};

// float32 kernels run with subnormals flushed to zero (x86's FTZ and DAZ bits, this thread, for the kernel's chunk):
// a hardened gate's x·Φ(λx) is subnormal where λx < −12.9, and on Intel CPUs every op that reads or writes a
// subnormal takes a microcode assist, in this kernel and in the next layer's matmuls (the frozen-λ epoch of the
// default MLP ran 2.3x GELU's). A flushed value is off by less than 2^-126: the certificate's gate model is
// K_GATE·u·|x| + UNDERFLOW. float64 (reference runs) keeps gradual underflow; other CPUs (ARM cores take no such
// penalty) keep their mode.
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
struct FlushSubnormals {
  unsigned int saved;
  FlushSubnormals() : saved(_mm_getcsr()) { _mm_setcsr(saved | 0x8040u); }  // FTZ (bit 15) | DAZ (bit 6)
  ~FlushSubnormals() { _mm_setcsr(saved); }
};
#else
struct FlushSubnormals {};
#endif
struct KeepSubnormals {};
template <typename T>
using SubnormalMode = std::conditional_t<std::is_same_v<T, float>, FlushSubnormals, KeepSubnormals>;

// Every element goes through the vector code: a partial vector (zero-padded load, partial store) takes the
// last len % V::size() elements, so a value does not depend on where it sits in the tensor.
template <typename V>
inline V load(const typename V::value_type* p, int64_t count) {
  return count >= V::size() ? V::loadu(p) : V::loadu(p, count);
}

template <typename V>
inline void store(const V& v, typename V::value_type* p, int64_t count) {
  if (count >= V::size()) v.store(p); else v.store(p, count);
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
  const V lo = V(T(-kClamp));
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    const SubnormalMode<T> mode;
    for_segments(b, e, C, inner, [&](int64_t off, int64_t len, int64_t c, int step) {
      const T* xs = x + off;
      T* ys = y + off;
      const T* ls = lam + c;
      const V l0 = V(ls[0]);
      for (int64_t j = 0; j < len; j += V::size()) {
        const int64_t m = len - j;
        const V xv = load<V>(xs + j, m);
        const V z = xv * (step ? load<V>(ls + j, m) : l0);
        // x·Φ(z) is 0 below z = −40 (even for x = −inf: no inf·0), x·1 = x above +40
        const V xz = V::blendv(xv, V(T(0)), z < lo);
        store(xz * Gauss<T>::cdf(z), ys + j, m);
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
    const SubnormalMode<T> mode;
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
        for (int64_t j = 0; j < len; j += V::size()) {
          const int64_t m = len - j;  // the padded lanes of a partial vector load x = g = 0: they add 0
          const V xv = load<V>(xs + j, m);
          const V gv = load<V>(gs + j, m);
          const V z = xv * (step ? load<V>(ls + j, m) : l0);
          V ex;
          const V cdf = Gauss<T>::cdf(z, ex);
          const V zpdf = at::vec::clamp(z, lo, hi) * ex * beta;  // z·φ(z), 0 for |z| > 40 (and z = ±inf)
          store(gv * (cdf + zpdf), os + j, m);
          if constexpr (kLamGrad) {
            // λ·∂L/∂λ per element; x is zeroed where |z| > 40 (zpdf is 0 there) so x = ±inf adds 0, not inf·0
            const V xin = V::blendv(xv, V(T(0)), (z < lo) | (z > hi));
            const V term = gv * xin * zpdf;
            if (step) {
              term.store(tmp);
              for (int q = 0; q < std::min<int64_t>(m, V::size()); ++q) mine[c + j + q] += double(tmp[q]);
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
