"""The int8 QDQ graph as the verifier reads it: which execution a certificate covers, and how far that execution may
stray from exact arithmetic on the dequantized values.

The statement covers onnxruntime's CPU execution of the QDQ graph the int8 stage writes (`quantize.int8`): inputs
quantized by QuantizeLinear, each Gemm/Conv run either fused (QGemm/QLinearConv: int8 × int8 products summed in
int32, the float bias rounded to int32 at the step s_x·s_w, the sum requantized by one float32 multiply, rounded to
the nearest integer, shifted by the zero point and saturated) or unfused (DequantizeLinear, a float32 Gemm/Conv,
QuantizeLinear). One bound covers both, so a certificate does not depend on which kernels the optimizer picks. With
16-bit activations (`quantize.activation_type` "int16") only the second exists: no integer kernel takes a 16-bit
input (`fusable`); the bound is the same, its int32 terms then spare.

For an affine op v = Σ_j W_j x_j + b on dequantized inputs x (every |x_j| ≤ m_j, the range of the grid it came from)
whose output is quantized with scale s, zero point z and range [q_min, q_max], the value the runtime passes on is

    y = clamp(v + e, lo, hi),   lo = s·(q_min − z),  hi = s·(q_max − z),  |e| ≤ E,

    E = s/2 + e_b + γ_{n+8}·(S + e_b) + d + 2u·s·(|z| + 1),   S = Σ_j |W_j|·m_j + |b|,   e_b = s_x·s_w/2 + 3u·|b|,

u = 2⁻²⁴, γ_k = k·u/(1 − k·u), n the terms of the sum: s/2 is the rounding to the grid; e_b the bias's rounding to
int32 (0 when the bias is already an int32 tensor or the weights are float); γ_{n+8}·(S + e_b) + d is the float32
dot product's bound of `pipeline.numerics.dot_error` over n + 8 terms (d its underflow term, (2n + 15)·2⁻¹²⁶,
which E ≥ s/2 absorbs in float64): it covers a float32 sum of n products of float32-dequantized factors (γ_{n+3}),
or the int32 sum's conversion and the requantization multiply by fl(fl(s_x·s_w)/s) (γ_5), with room enough for
the bound's own float64 evaluation (no `GAMMA_SLACK`); the last term is the zero point's float32 add. Every
term but s/2 acts before the rounding: y = clamp(s·k, lo, hi) with k = round(t/s), |t − v| ≤ E − s/2. The graph gets
an `ops.Rounding` node (s·k within v ± E, which knows its grid: exact where v's interval fits in one cell) and the
clamp as two nested ReLUs (hi − ReLU(hi − lo − ReLU(w − lo)), `readers.activations.clamp`), which branch and bound
splits like any ReLU. A ReLU absorbed into the QuantizeLinear (z = q_min, so lo = 0) is that clamp's lower end.

The graph input's own QuantizeLinear is exact: `ops.QuantizedInput` maps the box to the grid points it reaches.

Float32 values between a DequantizeLinear and the next QuantizeLinear (a residual Add, a BatchNorm, an average, a
ReLU, a Softmax, a LayerNorm, a product of two dequantized tensors). The reader follows, per unit, a bound err on
|runtime − exact| and the exact value's range [lo, hi] over every input (`floats.Float`, `floats.follow`): a DequantizeLinear
output is within u·|y| of its grid point; data movement and ReLU pass err on; an affine op adds |M|·err plus its own
rounding (γ_{n+8} as above when its weights are dequantized, else γ_{n+2}·(|M|·m + |c|), m = max(|lo|, |hi|) + err);
an elementwise op of k float32 operations 2·γ_k of its magnitudes; a sum of two values u·(m_a + m_b); a BatchNorm,
(x − μ)/√(σ² + ε)·γ + β however the kernel groups it, γ_8 of |a|·(m + |μ|) + |β| (`floats.batchnorm_float`); a MatMul of
two dequantized tensors Σ (|A|·e_B + e_A·|B| + e_A·e_B) + γ_{k+8}·|A|·|B| (an int32 QLinearMatMul or a float32
one); a Softmax, which is ½-Lipschitz in the max norm (its Jacobian diag(p) − p·pᵀ has row sums 2p_i(1 − p_i) ≤ ½),
½·max_j err_j plus its own rounding `SOFTMAX_K`·u·(T + W + 4) (W the row's spread), a bound checked on MLAS's
kernel (tests/test_verify_int8.py: the largest K over 1.1M rows of widths 2-197 and scales 0.01-80 was
0.92 on this machine's onnxruntime 1.32); a LayerNorm, whose one-pass float32 kernel (E[x²] − E[x]², as onnxruntime's
CPU kernel computes it) is ill-conditioned where the variance is small, gets a node of its own whose bound depends on
the box (`ops.norm.LayerNormRounding`: the variance's lower bound over the box enters it). A QuantizeLinear of such a value is
a Rounding with E = s/2 + err + 2u·(m + err + s·(|z| + 1)) (`float_error`).

The graph input's normalization (x·a + b by constants, a CNN's Mul/Add before its first QuantizeLinear): the
quantized value is a monotone function of each input unit, so `ops.QuantizedInput` keeps its exact range, with the
float32 ops of the normalization within 2·γ_{ops+1}·(|a·x| + |b|) of a·x + b.

Not covered (the reader refuses them, one line naming the node): a float op between DequantizeLinear and
QuantizeLinear that reads the raw input beyond its normalization (no range is known), exp, sqrt, a division or a
λ-GELU gate left in float32 before a QuantizeLinear (their float32 error is not derived here), integer sums that could
overflow int32.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pipeline.numerics import U, dot_error, gamma


REQUANT_EXTRA = 8  # the requantized sum's roundings beyond its n terms: the module docstring's γ_{n+8}
NO_SLACK = 1.0  # γ_{n+8} has room for the bound's own float64 evaluation: no GAMMA_SLACK
# ONNX TensorProto.INT8 = 3, UINT8 = 2; INT16 = 5 (activations of `quantize.activation_type` "int16")
INT_RANGES = {3: (-128, 127), 2: (0, 255), 5: (-32768, 32767)}
INT32_MAX = 2 ** 31 - 1


def grid_index(x, scale, zero, qmin: int, qmax: int, side: str = "nearest"):
    """QuantizeLinear of float64 points x as the runtime computes it (float32 x/s, rounded to nearest even, plus the
    zero point, saturated), as integer-valued float64. onnxruntime's kernels divide; a kernel that multiplies by
    1/s may round one way further at a tie: side="low"/"high" gives the smaller/larger of the two (sound for a
    range), "nearest" the division's. Torch tensors in (on any device): a tensor on x's device out; numpy in: numpy
    out (the same IEEE float32 operations either way)."""
    if not isinstance(x, torch.Tensor):
        t = lambda a: torch.from_numpy(np.array(a, dtype=np.float64))  # noqa: E731
        return grid_index(t(x), t(scale), t(zero), qmin, qmax, side).numpy()
    x32 = x.to(torch.float64).to(torch.float32)
    s32 = torch.as_tensor(scale, device=x.device).to(torch.float32)
    div = torch.round(x32 / s32).to(torch.float64)  # torch.round: half to even, as np.rint
    if side == "nearest":
        q = div
    else:
        mul = torch.round(x32 * (1 / s32)).to(torch.float64)
        q = torch.minimum(div, mul) if side == "low" else torch.maximum(div, mul)
    return (q + torch.as_tensor(zero, device=x.device).to(torch.float64)).clamp(qmin, qmax)


def magnitude(op, in_range: tuple[torch.Tensor, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """(S, |b|) per output unit of the affine `op`: S = Σ_j |W_j|·m_j + |b| bounds |v| when each dequantized input
    stays in its range (m_j = max(|lo_j|, |hi_j|))."""
    lo, hi = in_range
    m = torch.maximum(lo.abs(), hi.abs()).to(torch.float64)
    c = op.forward(torch.zeros(1, m.numel(), dtype=torch.float64))[0].abs()
    return (op.abs_forward(m[None])[0] + c).numpy(), c.numpy()


def affine_error(op, in_range: tuple[torch.Tensor, torch.Tensor], terms: int, bias_step: np.ndarray | None) -> np.ndarray:
    """|runtime − exact| per output unit of the affine `op` on dequantized inputs in `in_range`, before any quantization
    of its output: e_b + γ_{n+8}·(S + e_b) (the module docstring's bound without the output grid's terms)."""
    S, c = magnitude(op, in_range)
    e_b = np.zeros_like(S) if bias_step is None else np.asarray(bias_step, dtype=np.float64) / 2 + 3 * U * c
    return e_b + dot_error(terms + REQUANT_EXTRA, S + e_b, NO_SLACK)


def requant_error(op, in_range: tuple[torch.Tensor, torch.Tensor], scale: np.ndarray, zero: np.ndarray,
                  terms: int, bias_step: np.ndarray | None) -> np.ndarray:
    """E per output unit of the affine `op` (the module docstring's bound): `in_range` the (lo, hi) its dequantized
    input can take, `scale`/`zero` the output's quantization (per unit), `terms` the products per sum, `bias_step`
    s_x·s_w per unit when the runtime rounds a float bias to int32 (None: no such rounding)."""
    inner = affine_error(op, in_range, terms, bias_step)
    s = np.asarray(scale, dtype=np.float64)
    E = s / 2 + inner + 2 * U * s * (np.abs(np.asarray(zero, dtype=np.float64)) + 1)
    return np.broadcast_to(E, inner.shape).copy()


def exact_error(in_range: tuple[torch.Tensor, torch.Tensor], scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """E for a value computed exactly in float32 (a ReLU or a layout op on dequantized inputs) then quantized: the
    grid's half step, the division's rounding and the zero point's add."""
    lo, hi = in_range
    m = torch.maximum(lo.abs(), hi.abs()).numpy()
    s = np.asarray(scale, dtype=np.float64)
    return np.broadcast_to(s / 2 + 2 * U * (m + s * (np.abs(np.asarray(zero, dtype=np.float64)) + 1)), m.shape).copy()


def fusable(qmin: int, qmax: int) -> bool:
    """Whether a runtime may fuse a Gemm/Conv on this input grid into an integer kernel: ONNX's integer ops
    (QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger) and onnxruntime's QGemm take 8-bit inputs only, so a
    16-bit grid's op runs unfused, in float32."""
    return qmax - qmin <= 255


def int32_safe(op, in_range: tuple[torch.Tensor, torch.Tensor], in_scale: np.ndarray, w_scale: np.ndarray | None) -> bool:
    """True when the fused kernel's int32 accumulator cannot overflow: |acc| ≤ Σ |q_w|·|q_x − z_x| + |bias/(s_x s_w)|,
    bounded through the dequantized ranges by S / (s_x·s_w) with the smallest input scale. (Only asked of a grid a
    kernel may fuse: `fusable`.)"""
    if w_scale is None:
        return True
    S, _ = magnitude(op, in_range)
    step = np.asarray(in_scale, dtype=np.float64).min() * np.asarray(w_scale, dtype=np.float64)
    return bool(np.all(S / np.maximum(step, 1e-300) < INT32_MAX / 2)) if math.isfinite(float(S.max())) else False


# ---------------------------------------------------------------------------------------------
# float32 values between a DequantizeLinear and a QuantizeLinear (the module docstring's second part; `floats` follows
# them through the graph)

SOFTMAX_K = 8.0  # the softmax kernel's relative error is at most SOFTMAX_K·u·(T + W + 4); tests/test_verify_int8.py finds K ≤ 0.92


def float_error(fl, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """E of a QuantizeLinear (scale, zero point per unit) of a float32 value known as `fl` (`floats.Float`)."""
    s = np.asarray(scale, dtype=np.float64)
    m = fl.mag + fl.err
    return s / 2 + fl.err + 2 * U * (m + s * (np.abs(np.asarray(zero, dtype=np.float64)) + 1))


# -- LayerNorm in float32: a bound that depends on the box ---------------------------------------

# a LayerNorm's float32 error bound may reach this share of its output's magnitude bound |γ|·√N + |β| (what the values
# after it are followed with); beyond, the box is refused (`LayerNormRounding.bound`)
LN_CAP = 0.25


def layer_norm_rounding(A: torch.Tensor, vlow: torch.Tensor, e: torch.Tensor, gamma_: torch.Tensor, beta: torch.Tensor,
                        N: int, eps: float) -> torch.Tensor:
    """|onnxruntime's float32 LayerNorm of x̃ − the exact LayerNorm of x| per unit, for rows with max|x̃| ≤ A [R], the
    exact variance + ε ≥ vlow [R] over the box, |x̃ − x| ≤ e [R] (max over the row), scale γ and shift β [N]. The
    kernel (onnxruntime's CPU LayerNorm): m = Σx/N, s = √(Σx²/N − m² + ε), y = (x − m)/s·γ + β, each operation rounded
    once (u = 2⁻²⁴); derivation in `ops.norm.LayerNormRounding`'s docstring. Returns [R, N] (+∞ where the bound fails)."""
    u, g = U, gamma
    sqrtN = math.sqrt(N)
    # per row: bounds on mean |x̃|, mean x̃² and max |x̃| (a tensor A: max |x̃| for all three)
    A1, A2 = (A[0], A[1]) if isinstance(A, tuple) else (A, A * A)
    # the runtime input's spread: σ(x̃) ≥ σ(x) − max|x̃ − x| (σ is 1-Lipschitz in ‖·‖₂/√N)
    sd = (torch.sqrt((vlow - eps).clamp(min=0)) - e).clamp(min=0)
    V = sd * sd + eps
    R = torch.rsqrt(V) * (1 + 4 * u)
    dm = g(N + 2) * A1
    dv = g(N + 2) * A2 + dm * (2 * A1 + dm) + u * (A1 + dm) ** 2 + 2.1 * u * (A2 + (A1 + dm) ** 2)
    tau = (dv + u * (V + dv)) / V  # relative error of fl(v + ε) against the exact variance + ε of x̃ (≥ V)
    rho = tau + u + tau * u
    Amax = A[2] if isinstance(A, tuple) else A
    dc = dm + u * (Amax + A1 + dm)
    dz = dc * R / (1 - rho) + sqrtN * rho / (1 - rho)
    dq = dz + u * (sqrtN + dz)
    lip = R * (2 + sqrtN) * e  # |LN(x̃) − LN(x)| before γ
    ga, be = gamma_.abs()[None], beta.abs()[None]
    E = ga * (lip + dq)[:, None] + 2.1 * u * (ga * (sqrtN + dq[:, None]) + be)
    return torch.where((rho < 0.5)[:, None], E, torch.full_like(E, math.inf))
