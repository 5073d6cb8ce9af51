"""The int8 QDQ graph as the verifier reads it: which execution a certificate covers, and how far that execution may
stray from exact arithmetic on the dequantized values.

The statement covers onnxruntime's CPU execution of the QDQ graph the int8 stage writes (`quantize.int8`): inputs
quantized by QuantizeLinear, each Gemm/Conv run either fused (QGemm/QLinearConv: int8 × int8 products summed in
int32, the float bias rounded to int32 at the step s_x·s_w, the sum requantized by one float32 multiply, rounded to
the nearest integer, shifted by the zero point and saturated) or unfused (DequantizeLinear, a float32 Gemm/Conv,
QuantizeLinear). One bound covers both, so a certificate does not depend on which kernels the optimizer picks.

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
clamp as two ReLUs (lo + ReLU(w − lo) − ReLU(w − hi)), which branch and bound splits like any ReLU. A ReLU absorbed
into the QuantizeLinear (z = q_min, so lo = 0) is that clamp's lower end.

The graph input's own QuantizeLinear is exact: `ops.QuantizedInput` maps the box to the grid points it reaches.

Not covered (the reader refuses them, one line naming the node): float ops between DequantizeLinear and
QuantizeLinear other than an affine op or a ReLU (a λ-GELU gate left in float: its float32 error is not bounded
here), an affine op whose input is not dequantized, integer sums that could overflow int32.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pipeline.numerics import U, dot_error

REQUANT_EXTRA = 8  # the requantized sum's roundings beyond its n terms: the module docstring's γ_{n+8}
NO_SLACK = 1.0  # γ_{n+8} has room for the bound's own float64 evaluation: no GAMMA_SLACK
INT_RANGES = {3: (-128, 127), 2: (0, 255)}  # ONNX TensorProto.INT8 = 3, TensorProto.UINT8 = 2
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


def requant_error(op, in_range: tuple[torch.Tensor, torch.Tensor], scale: np.ndarray, zero: np.ndarray,
                  terms: int, bias_step: np.ndarray | None) -> np.ndarray:
    """E per output unit of the affine `op` (the module docstring's bound): `in_range` the (lo, hi) its dequantized
    input can take, `scale`/`zero` the output's quantization (per unit), `terms` the products per sum, `bias_step`
    s_x·s_w per unit when the runtime rounds a float bias to int32 (None: no such rounding)."""
    S, c = magnitude(op, in_range)
    e_b = np.zeros_like(S) if bias_step is None else np.asarray(bias_step, dtype=np.float64) / 2 + 3 * U * c
    s = np.asarray(scale, dtype=np.float64)
    E = s / 2 + e_b + dot_error(terms + REQUANT_EXTRA, S + e_b, NO_SLACK) + 2 * U * s * (np.abs(np.asarray(zero, dtype=np.float64)) + 1)
    return np.broadcast_to(E, S.shape).copy()


def exact_error(in_range: tuple[torch.Tensor, torch.Tensor], scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """E for a value computed exactly in float32 (a ReLU or a layout op on dequantized inputs) then quantized: the
    grid's half step, the division's rounding and the zero point's add."""
    lo, hi = in_range
    m = torch.maximum(lo.abs(), hi.abs()).numpy()
    s = np.asarray(scale, dtype=np.float64)
    return np.broadcast_to(s / 2 + 2 * U * (m + s * (np.abs(np.asarray(zero, dtype=np.float64)) + 1)), m.shape).copy()


def int32_safe(op, in_range: tuple[torch.Tensor, torch.Tensor], in_scale: np.ndarray, w_scale: np.ndarray | None) -> bool:
    """True when the fused kernel's int32 accumulator cannot overflow: |acc| ≤ Σ |q_w|·|q_x − z_x| + |bias/(s_x s_w)|,
    bounded through the dequantized ranges by S / (s_x·s_w) with the smallest input scale."""
    if w_scale is None:
        return True
    S, _ = magnitude(op, in_range)
    step = np.asarray(in_scale, dtype=np.float64).min() * np.asarray(w_scale, dtype=np.float64)
    return bool(np.all(S / np.maximum(step, 1e-300) < INT32_MAX / 2)) if math.isfinite(float(S.max())) else False
