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

Float32 values between a DequantizeLinear and the next QuantizeLinear (a residual Add, a BatchNorm, an average, a
ReLU, a Softmax, a LayerNorm, a product of two dequantized tensors). The reader follows, per unit, a bound err on
|runtime − exact| and the exact value's range [lo, hi] over every input (`readers.Float`, `follow`): a DequantizeLinear
output is within u·|y| of its grid point; data movement and ReLU pass err on; an affine op adds |M|·err plus its own
rounding (γ_{n+8} as above when its weights are dequantized, else γ_{n+2}·(|M|·m + |c|), m = max(|lo|, |hi|) + err);
an elementwise op of k float32 operations 2·γ_k of its magnitudes; a sum of two values u·(m_a + m_b); a BatchNorm,
(x − μ)/√(σ² + ε)·γ + β however the kernel groups it, γ_8 of |a|·(m + |μ|) + |β| (`batchnorm_float`); a MatMul of
two dequantized tensors Σ (|A|·e_B + e_A·|B| + e_A·e_B) + γ_{k+8}·|A|·|B| (an int32 QLinearMatMul or a float32
one); a Softmax, which is ½-Lipschitz in the max norm (its Jacobian diag(p) − p·pᵀ has row sums 2p_i(1 − p_i) ≤ ½),
½·max_j err_j plus its own rounding `SOFTMAX_K`·u·(T + W + 4) (W the row's spread), a bound measured on MLAS's
kernel (tests/test_verify_int8.py re-measures it: the largest K over 1.1M rows of widths 2-197 and scales 0.01-80 was
0.92 on this machine's onnxruntime 1.32); a LayerNorm, whose one-pass float32 kernel (E[x²] − E[x]², as onnxruntime's
CPU kernel computes it) is ill-conditioned where the variance is small, gets a node of its own whose bound depends on
the box (`LayerNormRounding`: the variance's lower bound over the box enters it). A QuantizeLinear of such a value is
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
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.numerics import U, dot_error, gamma

from .nonlinear import _Bilinear

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


def int32_safe(op, in_range: tuple[torch.Tensor, torch.Tensor], in_scale: np.ndarray, w_scale: np.ndarray | None) -> bool:
    """True when the fused kernel's int32 accumulator cannot overflow: |acc| ≤ Σ |q_w|·|q_x − z_x| + |bias/(s_x s_w)|,
    bounded through the dequantized ranges by S / (s_x·s_w) with the smallest input scale."""
    if w_scale is None:
        return True
    S, _ = magnitude(op, in_range)
    step = np.asarray(in_scale, dtype=np.float64).min() * np.asarray(w_scale, dtype=np.float64)
    return bool(np.all(S / np.maximum(step, 1e-300) < INT32_MAX / 2)) if math.isfinite(float(S.max())) else False


# ---------------------------------------------------------------------------------------------
# float32 values between a DequantizeLinear and a QuantizeLinear (the module docstring's second part)

SAFETY = 2.0  # every elementwise op's own rounding term, doubled (a kernel may group its operations differently)
SOFTMAX_K = 8.0  # the softmax kernel's relative error is at most SOFTMAX_K·u·(T + W + 4); measured K ≤ 0.92 (margin 8)


def float_error(fl, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """E of a QuantizeLinear (scale, zero point per unit) of a float32 value known as `fl` (`readers.Float`)."""
    s = np.asarray(scale, dtype=np.float64)
    m = fl.mag + fl.err
    return s / 2 + fl.err + 2 * U * (m + s * (np.abs(np.asarray(zero, dtype=np.float64)) + 1))


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.float64))[None]


def _ranges(op, fls) -> tuple[np.ndarray, np.ndarray]:
    """The op's output range from its inputs' (interval arithmetic; NaN from ∞·0 is unknown: ±∞)."""
    from .ops import Activation

    with torch.no_grad():
        if isinstance(op, Activation):
            lo, hi = op.interval(_t(fls[0].lo)[0], _t(fls[0].hi)[0])
            lo, hi = lo[None], hi[None]
        else:
            lo, hi = op.ibp(*((_t(f.lo), _t(f.hi)) for f in fls))
    lo, hi = lo[0].numpy(), hi[0].numpy()
    return np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi)


def follow(op, fls, flops: int | None, info: dict | None):
    """The `readers.Float` of `op`'s output from its inputs' (None: not followed, e.g. exp or a product, whose handler
    gives its own or leaves the value unbounded). `flops`: float32 operations per unit of an elementwise op; `info`: an
    affine node's weight scales and bias (`readers._record_affine`)."""
    from .ops import Concat, Conv, Linear, Permute, Pool, ReLU, Scale, Select, Sum, TokenLinear
    from .readers import Float

    if not isinstance(op, (Concat, Conv, Linear, Permute, Pool, ReLU, Scale, Select, Sum, TokenLinear)):
        return None
    if isinstance(op, ReLU):
        return Float(fls[0].err.copy(), np.maximum(fls[0].lo, 0), np.maximum(fls[0].hi, 0))
    lo, hi = _ranges(op, fls)
    with torch.no_grad():
        moved = op.abs_forward(*(_t(f.err) for f in fls))[0].numpy()  # the inputs' errors carried through |M|
        if isinstance(op, (Concat, Permute, Select)):  # data movement: exact
            return Float(moved, lo, hi)
        mags = [_t(np.maximum(np.abs(f.lo), np.abs(f.hi)) + f.err) for f in fls]
        if isinstance(op, Scale):
            k = 1 if flops is None else flops
            own = SAFETY * gamma(k) * (op.abs_forward(mags[0])[0].numpy() + np.abs(op.shift.numpy())) if k else 0.0
            chain = fls[0].chain
            if chain is not None:
                a, b, ops = chain
                chain = (a * op.scale.numpy(), b * op.scale.numpy() + op.shift.numpy(), ops + k)
            return Float(moved + own, lo, hi, chain)
        if isinstance(op, Sum):
            own = SAFETY * gamma(op.arity - 1) * op.abs_forward(*mags)[0].numpy() if flops is None or flops else 0.0
            return Float(moved + own, lo, hi)
        # a dot product (Linear, Conv, TokenLinear, Pool): dequantized weights with the fused kernels' bound, else γ_{n+2}
        if info is not None:
            in_range = (torch.as_tensor(fls[0].lo - fls[0].err), torch.as_tensor(fls[0].hi + fls[0].err))
            own = affine_error(op, in_range, info["terms"], info.get("bias_step"))
        else:
            terms = flops if flops is not None else _terms(op)
            c = np.abs(op.forward(torch.zeros(1, op.in_sizes()[0], dtype=torch.float64))[0].numpy())
            own = gamma(terms + 2) * (op.abs_forward(mags[0])[0].numpy() + c)
        return Float(moved + own, lo, hi)


def _terms(op) -> int:
    from .ops import Conv, Linear, Pool, TokenLinear

    if isinstance(op, (Linear, TokenLinear)):
        return int(op.W.shape[1])
    if isinstance(op, Conv):
        return int(np.prod(op.weight.shape[1:]))
    if isinstance(op, Pool):
        return int(torch.bincount(op.group).max())
    return 1


def batchnorm_float(fl, a: np.ndarray, mean: np.ndarray, bias: np.ndarray):
    """A BatchNormalization y = a·(x − μ) + β in float32, however the kernel groups it (module docstring)."""
    from .readers import Float

    if fl is None:
        return None
    m = fl.mag + fl.err
    lo = np.where(a >= 0, a * (fl.lo - mean) + bias, a * (fl.hi - mean) + bias)
    hi = np.where(a >= 0, a * (fl.hi - mean) + bias, a * (fl.lo - mean) + bias)
    err = np.abs(a) * fl.err + gamma(8) * (np.abs(a) * (m + np.abs(mean)) + np.abs(bias))
    return Float(err, np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi))


def matmul_float(fa, fb, nb: int, m: int, k: int, n: int):
    """A @ B of two float32 values (a QLinearMatMul on int8 operands or a float32 MatMul on dequantized ones)."""
    from .readers import Float

    A = lambda v: torch.as_tensor(v).reshape(nb, m, k)  # noqa: E731
    B = lambda v: torch.as_tensor(v).reshape(nb, k, n)  # noqa: E731
    ma, mb = A(fa.mag), B(fb.mag)
    ea, eb = A(fa.err), B(fb.err)
    err = ma @ eb + ea @ mb + ea @ eb + gamma(k + 8) * ((ma + ea) @ (mb + eb))
    tot = (ma @ mb).reshape(-1).numpy()
    return Float(err.reshape(-1).numpy(), -tot, tot)


def softmax_float(fl, rows: int, T: int, last: bool):
    """A Softmax over T values per row (module docstring): outputs in [0, 1], err ½·max err_in + SOFTMAX_K·u·(T + W + 4)."""
    from .readers import Float

    if fl is None or not last or not (np.all(np.isfinite(fl.lo)) and np.all(np.isfinite(fl.hi))):
        return None
    e = fl.err.reshape(rows, T)
    W = (fl.hi.reshape(rows, T) + e).max(1) - (fl.lo.reshape(rows, T) - e).min(1)
    err = 0.5 * e.max(1) + SOFTMAX_K * U * (T + W + 4)
    n = rows * T
    return Float(np.repeat(err, T), np.zeros(n), np.ones(n))


# -- LayerNorm in float32: a bound that depends on the box ---------------------------------------

# a LayerNorm's float32 error bound may reach this share of its output's magnitude bound |γ|·√N + |β| (what the values
# after it are followed with); beyond, the box is refused (`LayerNormRounding.bound`)
LN_CAP = 0.25


def layer_norm_rounding(A: torch.Tensor, vlow: torch.Tensor, e: torch.Tensor, gamma_: torch.Tensor, beta: torch.Tensor,
                        N: int, eps: float) -> torch.Tensor:
    """|onnxruntime's float32 LayerNorm of x̃ − the exact LayerNorm of x| per unit, for rows with max|x̃| ≤ A [R], the
    exact variance + ε ≥ vlow [R] over the box, |x̃ − x| ≤ e [R] (max over the row), scale γ and shift β [N]. The
    kernel (onnxruntime's CPU LayerNorm): m = Σx/N, s = √(Σx²/N − m² + ε), y = (x − m)/s·γ + β, each operation rounded
    once (u = 2⁻²⁴); derivation in the `LayerNormRounding` docstring. Returns [R, N] (+∞ where the bound fails)."""
    u = U
    g = lambda k: k * u / (1 - k * u)  # noqa: E731
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


@dataclass(eq=False)
class LayerNormRounding(_Bilinear):
    """y + e, |e| ≤ E: onnxruntime's float32 LayerNormalization of an int8 graph, on the exact one y. Its input is
    the concatenation (y [R·N], x [R·N], v [R]) of the LayerNorm's exact output, its input and its variance + ε
    (graph nodes), so E can use their intervals over the box.

    Derivation (`layer_norm_rounding`; x̃ the runtime's input, |x̃ − x| ≤ e, |x̃| ≤ A, v + ε ≥ V over the box):
    |ỹ − y(x)| ≤ |ỹ − LN(x̃)| + |LN(x̃) − LN(x)|. The second term: LN's Jacobian γ·r·(P − z·zᵀ/N) has row sums
    ≤ |γ|·r·(2 + √N) (Σz² ≤ N), r ≤ 1/√V along the segment. The first: the one-pass sums m̃ and E[x²]~ are within
    γ_{N+2}·A and γ_{N+2}·A² of m and E[x²], so the variance within Δv = γ_{N+2}A² + Δm(2A + Δm) + u(A + Δm)² +
    2.1uA², √(fl(v + ε)) within a relative ρ = τ + u + τu of √(v + ε) (τ = (Δv + u(V + Δv))/V, |√(1 + t) − 1| ≤ |t|),
    x − m̃ within Δc = Δm + u(2A + Δm), the quotient within Δz = Δc·r/(1 − ρ) + √N·ρ/(1 − ρ), and the scale and
    shift add 2.1u·(|γ|(√N + Δq) + |β|). Where ρ ≥ ½ or E exceeds `LN_CAP` of the output's bound, E is ∞ (unknown)."""

    R: int
    N: int
    eps: float
    e_in: torch.Tensor  # [R]: max |x̃ − x| per row (the LayerNorm input's followed error)
    gamma_: torch.Tensor  # [N]
    beta: torch.Tensor  # [N]
    source: str = ""

    def __post_init__(self):
        from .ops import as_tensor

        self.e_in, self.gamma_, self.beta = (as_tensor(t).reshape(-1) for t in (self.e_in, self.gamma_, self.beta))

    def in_sizes(self):
        return (2 * self.R * self.N + self.R,)

    @property
    def out_size(self):
        return self.R * self.N

    def cap(self) -> torch.Tensor:
        return LN_CAP * (self.gamma_.abs() * math.sqrt(self.N) + self.beta.abs()) + 1e-30

    def split(self, v):
        n = self.R * self.N
        return v[..., :n], v[..., n:2 * n], v[..., 2 * n:]

    def bound(self, l, u):
        """E per unit on the box the intervals (l, u) of (y, x, v) describe; ∞ beyond `cap` (no bound, or a larger one
        than the reading's magnitudes allow): those units are unknown, which costs nothing where nothing reads them (a
        LayerNorm over every token of which the head reads one)."""
        _, xl, vl = self.split(l)
        _, xu, _ = self.split(u)
        mag = torch.maximum(xl.abs(), xu.abs()).reshape(self.R, self.N) + self.e_in.to(l.dtype)[:, None]
        A = (mag.mean(1), (mag * mag).mean(1), mag.max(1).values)
        E = layer_norm_rounding(A, vl, self.e_in.to(l.dtype), self.gamma_.to(l.dtype), self.beta.to(l.dtype),
                                self.N, self.eps)
        beyond = ~(E <= self.cap().to(l.dtype)[None])
        return torch.where(beyond, torch.full_like(E, math.inf), E).reshape(-1)

    def forward(self, h):
        return self.split(h)[0]

    def interval(self, l, u):
        E = self.bound(l, u)
        return self.split(l)[0] - E, self.split(u)[0] + E

    def relax(self, l, u):
        return (self.bound(l, u),)

    def back(self, A, relax):
        (E,) = relax
        rest = A.new_zeros(A.shape[0], self.R * self.N + self.R)
        # an unbounded unit costs −∞ only to the rows that read it (0·∞ is 0 here, not NaN)
        cost = torch.where(A != 0, A.abs() * E, torch.zeros_like(A))
        return torch.cat([A, rest], dim=-1), -cost.sum(-1)

    def milp_rows(self, l, u):
        from scipy import sparse

        E = self.bound(l, u).numpy()
        n = self.R * self.N
        M = sparse.hstack([sparse.identity(n), sparse.csr_matrix((n, n + self.R))], format="csr")
        return [(M, -E, E)]

    def gap(self, l, u, d):
        return self.split(d)[0]


def layer_norm_float(r, x, var, out, gamma_: np.ndarray, beta: np.ndarray, N: int, rows: int, eps: float):
    """The Value of a LayerNormalization in an int8 graph: its exact output `out` with onnxruntime's float32 error as a
    `LayerNormRounding` node (refused where the input's float32 value is not followed)."""
    from .ops import Concat
    from .readers import Float, Value

    if x.fl is None or not (np.all(np.isfinite(x.fl.err)) and np.all(np.isfinite(x.fl.mag))):
        out.fl = None
        return out
    n = rows * N
    cat = r.add(Concat(((n,), (n,), (rows,)), 0), [Value(out.node, (n,)), Value(x.node, (n,)), var], (2 * n + rows,))
    e_row = x.fl.err.reshape(rows, N).max(1)
    op = LayerNormRounding(rows, N, eps, e_row, gamma_, beta, source=r.node.name)
    node = r.add(op, [cat], out.shape)
    bound = np.tile(np.abs(gamma_) * math.sqrt(N) + np.abs(beta), rows) + np.tile(op.cap().numpy(), rows)
    node.fl = Float(np.zeros(n), -bound, bound)
    return node
