"""Fused Triton kernels for the λ-gates f(x) = x·g(λx), g = Φ (λ-GELU) or σ (λ-Swish), for CUDA.

One layer is one autograd node: λ = 1 + softplus(s/t) and ∂λ/∂s = σ(s/t)/t are computed inside the kernels
from the hardness parameter s, and ∂L/∂s is reduced inside the backward kernel. Only x and s are saved.
A frozen-λ path (λ a given buffer, gradient to x only) serves the harden stage.

Layout: x is viewed as [outer, C, inner] (C = x.shape[channel_dim], one λ per channel; C = 1 for a
layer/global λ) and launched as a 2-D matrix tiled [BM, BN] on a 1-D grid:
  row mode (inner > 1, or one λ)  matrix [outer·C, inner], λ per row (row % C);
  col mode (inner == 1)           matrix [outer, C], λ per column (channels last, [B, T, C], [N, C]).
Tiles never straddle a channel boundary along the reduced axis, so λ is computed once per row/column
vector (not per element: softplus costs an exp and a log) and the λ-gradient is a plain tile sum.
A 1-D flat block would mix channels and need a segmented reduction or per-element atomics.

λ-gradient: deterministic partial sums, not atomics. Each backward program loops over `iters` tiles
along the reduced axis, accumulates in fp32 registers, scales by ∂λ/∂s / λ once, and writes its fp32
partials to part[chunk, channel-slot]; one torch .sum over chunks finishes it. Same inputs give the
same bits on every call (fp32 atomics would make the order, hence the bits, depend on the schedule).

Φ is evaluated with our own erfc (Numerical Recipes' erfcc Chebyshev form, relative error ≤ 1.1e-7 in
float64 for all w ≥ 0): the far negative tail keeps float32 relative accuracy, which 0.5·(1 + erf)
cannot (cancellation). libdevice's erfc is not used because the interpreter cannot run extern calls,
and tests must exercise the same code that runs on the GPU. exp(−z²/2) is computed from an exact
z² = hi + lo (fma) and a Cody–Waite exp (GPU `tl.exp` is ex2.approx(x·log2e), whose error grows with |x|),
and the rounding residual of z = λ·x is carried too, so relative error stays ~1e-6 wherever f is a
normal float.

Non-contiguous inputs are copied with .contiguous(); a 4-D NCHW tensor in channels_last memory format
with channel_dim=1 runs in col mode without a copy, and its outputs keep that memory format.
float64 is not supported (`supports` is False; the caller falls back to the CPU/eager kernels).
Kernels run on CPU tensors only under the Triton interpreter (TRITON_INTERPRET=1 set before import).
"""

from __future__ import annotations

import contextlib
import math

import torch

from pipeline.gates import INV_SQRT2, INV_SQRT_2PI  # Φ's constants have one home (absolute: the tests load this file by path)

# |z| beyond which z·φ(z) and Φ(z) ∈ {0, 1} are exact in float32: clamping z there only turns ±inf finite.
PHI_CLAMP = 40.0
# Same for σ: exp(−110) rounds to 0 in float32 (smallest subnormal 1.4e-45 = e^−103.3).
SIGMOID_CLAMP = 110.0
# Arguments of exp below −EXP_FLOOR give 0; the floor keeps the 2^k scale factors normal.
EXP_FLOOR = 110.0
SOFTPLUS_THRESHOLD = 20.0  # F.softplus: identity above s/t = 20
GATES = {"phi": 0, "sigmoid": 1}
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Tiling: TILE elements per program (8 KB fp32 per operand, 16 per thread at 4 warps); the backward keeps
# at least TARGET_PROGRAMS programs (~8 per SM on an H100) and loops at most MAX_ITERS tiles per program.
TILE = 2048
MAX_BN_ROW = 1024
MAX_BN_COL = 256
TARGET_PROGRAMS = 1024
MAX_ITERS = 64
# Launch options, pinned: the exact residuals use explicit fma, so contraction elsewhere only helps accuracy
# (Triton 3.9 warns that its default flips in 3.10). The interpreter ignores these.
LAUNCH = {"num_warps": 4, "enable_fp_fusion": True}

try:
    import triton
    import triton.language as tl

    _IMPORT_ERROR: str | None = None
except Exception as exc:  # noqa: BLE001 - missing or broken triton: the module still imports, `available()` says why
    triton = None
    tl = None
    _IMPORT_ERROR = f"triton cannot be imported ({type(exc).__name__}: {exc})"


def available() -> bool:
    return _IMPORT_ERROR is None


def unavailable_reason() -> str | None:
    return _IMPORT_ERROR


def interpreted() -> bool:
    """True when the kernels were built for the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    if not available():
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_gate_fwd, InterpretedFunction)


if _IMPORT_ERROR is None:
    _INV_SQRT2 = tl.constexpr(INV_SQRT2)
    _INV_SQRT_2PI = tl.constexpr(INV_SQRT_2PI)
    _HALF_INV_SQRT2 = tl.constexpr(0.5 * INV_SQRT2)
    _PHI_CLAMP = tl.constexpr(PHI_CLAMP)
    _SIGMOID_CLAMP = tl.constexpr(SIGMOID_CLAMP)
    _EXP_FLOOR = tl.constexpr(EXP_FLOOR)
    _SP_THRESHOLD = tl.constexpr(SOFTPLUS_THRESHOLD)
    _LOG2E = tl.constexpr(1.4426950408889634)
    # Cody–Waite split of ln 2: k·_LN2_HI is exact for |k| < 512 (LN2_HI has 15 significant bits).
    _LN2_HI = tl.constexpr(0.693145751953125)
    _LN2_LO = tl.constexpr(1.428606765330187e-06)
    # Numerical Recipes erfcc: erfc(w) = t·exp(−w² + P(t)), t = 1/(1 + w/2).
    _E0 = tl.constexpr(-1.26551223)
    _E1 = tl.constexpr(1.00002368)
    _E2 = tl.constexpr(0.37409196)
    _E3 = tl.constexpr(0.09678418)
    _E4 = tl.constexpr(-0.18628806)
    _E5 = tl.constexpr(0.27886807)
    _E6 = tl.constexpr(-1.13520398)
    _E7 = tl.constexpr(1.48851587)
    _E8 = tl.constexpr(-0.82215223)
    _E9 = tl.constexpr(0.17087277)

    @triton.jit
    def _exp_split(a, a_lo):
        """(m, s) with m·s = exp(a + a_lo) to a few ulp, for a ≤ 0 (a exact, |a_lo| ≲ 2): m ≥ 2^−81 is normal
        and s a power of two, so a caller can fold other factors into m and round into a subnormal once."""
        a = tl.maximum(a, -_EXP_FLOOR)
        k = tl.floor(a * _LOG2E + 0.5)
        r = tl.fma(k, -_LN2_HI, a)  # exact
        r = tl.fma(k, -_LN2_LO, r) + a_lo  # |r| ≲ 2: tl.exp is accurate here on every backend
        p = tl.exp(r)
        # 2^k as two normal powers of two (k ≥ −159): a subnormal result is rounded, not flushed.
        k1 = tl.floor(k * 0.5)
        k2 = k - k1
        s1 = ((k1.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
        s2 = ((k2.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
        return p * s1, s2

    @triton.jit
    def _phi_parts(z, z_lo):
        """(c, m, s) with exp(−z²/2) = m·s (see _exp_split) and Φ(−|z|) = c·m·s; z is clamped, z + z_lo
        the exact λ·x."""
        a = tl.abs(z)
        a_lo = tl.where(z < 0, -z_lo, z_lo)
        q = a * a
        q_lo = tl.fma(a, a, -q)  # a² = q + q_lo exactly
        # (a + a_lo)²/2 = q/2 + (q_lo/2 + a·a_lo) up to a_lo² (relative 1e-14)
        m, s = _exp_split(-0.5 * q, -0.5 * q_lo - a * a_lo)
        t = 1.0 / (1.0 + _HALF_INV_SQRT2 * a)
        p = _E9
        p = p * t + _E8
        p = p * t + _E7
        p = p * t + _E6
        p = p * t + _E5
        p = p * t + _E4
        p = p * t + _E3
        p = p * t + _E2
        p = p * t + _E1
        p = p * t + _E0
        c = 0.5 * t * tl.exp(p)
        return c, m, s

    @triton.jit
    def _sigmoid_parts(z, z_lo):
        """(m, s, r) with e = exp(−|z|) = m·s (see _exp_split), r = 1/(1 + e): σ(−|z|) = e·r, σ(|z|) = r,
        σ(z)σ(−z) = e·r²; no cancellation in either tail."""
        a_lo = tl.where(z < 0, -z_lo, z_lo)
        m, s = _exp_split(-tl.abs(z), -a_lo)
        return m, s, 1.0 / (1.0 + m * s)

    @triton.jit
    def _lambda(p_ptr, idx, mask, t, FROM_S: tl.constexpr):
        """λ (and ∂λ/∂s / λ when FROM_S) for a vector of channels, in fp32."""
        p = tl.load(p_ptr + idx, mask=mask, other=0.0).to(tl.float32)
        if FROM_S:
            u = p / t
            e = tl.exp(tl.where(u > _SP_THRESHOLD, _SP_THRESHOLD, u))  # NaN s stays NaN
            w = 1.0 + e
            # log1p(e) = log(w)·e/(w − 1) (Goldberg), e where w rounds to 1
            sp = tl.where(w == 1.0, e, tl.log(w) * e / tl.where(w == 1.0, 1.0, w - 1.0))
            lam = 1.0 + tl.where(u > _SP_THRESHOLD, u, sp)
            dlam = tl.where(u > _SP_THRESHOLD, 1.0, e / w) / t
            return lam, dlam / lam
        else:
            return p, p

    @triton.jit
    def _point(x, lam, CL: tl.constexpr):
        """z = λx, z clamped to ±CL (NaN kept), the exact residual of the product, |z| ≤ CL, z < −CL."""
        z = lam * x
        inside = tl.abs(z) <= CL
        z_lo = tl.where(inside, tl.fma(lam, x, -z), 0.0)  # λ·x = z + z_lo exactly (0 for ±inf)
        zc = tl.clamp(z, -CL, CL, propagate_nan=tl.PropagateNan.ALL)
        return z, zc, z_lo, inside, z < -CL

    @triton.jit
    def _tile(rows, cols, M, N):
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        return offs, mask

    @triton.jit
    def _gate_fwd(x_ptr, p_ptr, y_ptr, M, N, C, t, num_n,
                  COL: tl.constexpr, FROM_S: tl.constexpr, GATE: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr):
        pid = tl.program_id(0)
        rows = (pid // num_n) * BM + tl.arange(0, BM)
        cols = (pid % num_n) * BN + tl.arange(0, BN)
        offs, mask = _tile(rows, cols, M, N)
        if COL:
            lam, _ = _lambda(p_ptr, cols, cols < N, t, FROM_S)
            lam = lam[None, :]
        else:
            lam, _ = _lambda(p_ptr, rows % C, rows < M, t, FROM_S)
            lam = lam[:, None]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if GATE == 0:
            _z, zc, z_lo, _inside, below = _point(x, lam, _PHI_CLAMP)
        else:
            _z, zc, z_lo, _inside, below = _point(x, lam, _SIGMOID_CLAMP)
        # x on the negative side, 0 elsewhere and below −CL (f(−∞) = 0, not −inf·0); NaN stays NaN.
        # Both sides of a select are evaluated, so neither may form inf·0.
        xn = tl.where(below | (zc >= 0), 0.0, x)
        # Negative side: the normal factors first, the power of two last (one rounding into a subnormal).
        if GATE == 0:
            c, m, s = _phi_parts(zc, z_lo)
            y = tl.where(zc < 0, ((xn * c) * m) * s, x * (1.0 - c * (m * s)))
        else:
            m, s, r = _sigmoid_parts(zc, z_lo)
            y = tl.where(zc < 0, ((xn * m) * r) * s, x * r)
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _gate_bwd(g_ptr, x_ptr, p_ptr, gx_ptr, part_ptr, M, N, C, t, num_n, iters,
                  COL: tl.constexpr, FROM_S: tl.constexpr, GATE: tl.constexpr,
                  NEED_X: tl.constexpr, NEED_P: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        pid = tl.program_id(0)
        pid_m = pid // num_n
        pid_n = pid % num_n
        if COL:  # a column block, `iters` row tiles; λ per column
            cols = pid_n * BN + tl.arange(0, BN)
            lam, scale = _lambda(p_ptr, cols, cols < N, t, FROM_S)
            lam2 = lam[None, :]
            acc = tl.zeros([BN], dtype=tl.float32)
        else:  # a row block, `iters` column tiles; λ per row
            rows = pid_m * BM + tl.arange(0, BM)
            lam, scale = _lambda(p_ptr, rows % C, rows < M, t, FROM_S)
            lam2 = lam[:, None]
            acc = tl.zeros([BM], dtype=tl.float32)
        for i in range(iters):
            if COL:
                rows = (pid_m * iters + i) * BM + tl.arange(0, BM)
            else:
                cols = (pid_n * iters + i) * BN + tl.arange(0, BN)
            offs, mask = _tile(rows, cols, M, N)
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            if GATE == 0:
                z, zc, z_lo, inside, _below = _point(x, lam2, _PHI_CLAMP)
                c, m, s = _phi_parts(zc, z_lo)
                tail = (c * m) * s
                cdf = tl.where(zc < 0, tail, 1.0 - tail)
                zd = ((zc * _INV_SQRT_2PI) * m) * s  # z·φ(z)
            else:
                z, zc, z_lo, inside, _below = _point(x, lam2, _SIGMOID_CLAMP)
                m, s, r = _sigmoid_parts(zc, z_lo)
                cdf = tl.where(zc < 0, (m * r) * s, r)
                zd = ((zc * m) * (r * r)) * s  # z·σ'(z)
            if NEED_X:
                gx = g * (cdf + zd)  # ∂f/∂x = g(z) + z·g'(z)
                tl.store(gx_ptr + offs, gx.to(gx_ptr.dtype.element_ty), mask=mask)
            if NEED_P:
                # λ·∂f/∂λ = x·z·g'(z); x is 0 where |z| is clamped (there z·g'(z) = 0, and x may be ±inf)
                term = tl.where(mask, g * tl.where(inside | (z != z), x, 0.0) * zd, 0.0)  # noqa: PLR0124 (NaN)
                if COL:
                    acc += tl.sum(term, axis=0)
                else:
                    acc += tl.sum(term, axis=1)
        if NEED_P:
            acc = acc * scale  # ∂λ/∂s / λ per channel
            if COL:
                tl.store(part_ptr + pid_m * N + cols, acc, mask=cols < N)
            else:
                tl.store(part_ptr + pid_n * M + rows, acc, mask=rows < M)


# ---------------------------------------------------------------------------------------------
# Host side


def _resolve(x: torch.Tensor, p: torch.Tensor, channel_dim: int):
    """(view of x whose memory is the [M, N] matrix, permuted?, M, N, C, outer, col) or a reason string."""
    if p.numel() == 1:
        C, outer, inner = 1, 1, x.numel()
    else:
        if x.dim() < 1:
            return "a per-channel λ needs x with a channel dim"
        d = channel_dim % x.dim() if -x.dim() <= channel_dim < x.dim() else None
        if d is None:
            return f"channel_dim {channel_dim} is out of range for x of shape {tuple(x.shape)}"
        C = x.shape[d]
        if p.numel() != C:
            return f"s/λ has {p.numel()} elements, x has {C} channels on dim {channel_dim}"
        outer, inner = math.prod(x.shape[:d]), math.prod(x.shape[d + 1:])
        if d == 1 and x.dim() == 4 and inner > 1 and not x.is_contiguous() \
                and x.is_contiguous(memory_format=torch.channels_last):
            # NCHW stored NHWC: run as channels last on the permuted view, no copy.
            xv = x.permute(0, 2, 3, 1)
            return xv, True, outer * inner, C, C, outer * inner, True
    xv = x.contiguous()
    if C > 1 and inner == 1:
        return xv, False, outer, C, C, outer, True
    return xv, False, outer * C, inner, C, outer, False


def _unsupported(x: torch.Tensor, p: torch.Tensor, channel_dim: int) -> str | None:
    if not available():
        return _IMPORT_ERROR
    if not (isinstance(x, torch.Tensor) and isinstance(p, torch.Tensor)):
        return "x and s/λ must be tensors"
    if x.dtype not in SUPPORTED_DTYPES or p.dtype not in SUPPORTED_DTYPES:
        return f"dtypes {x.dtype}/{p.dtype}: the Triton path takes float32, bfloat16 and float16 only"
    if x.device != p.device:
        return f"x is on {x.device}, s/λ on {p.device}"
    if x.device.type == "cpu":
        if not interpreted():
            return "CPU tensors need the Triton interpreter (TRITON_INTERPRET=1 before import)"
    elif x.device.type != "cuda":
        return f"device {x.device.type} is not supported"
    if p.numel() == 0:
        return "s/λ is empty"
    if x.numel() >= 2**31:
        return "x has 2^31 elements or more (row/column indices are int32)"
    r = _resolve(x, p, channel_dim)
    return r if isinstance(r, str) else None


def supports(x: torch.Tensor, s_or_lam: torch.Tensor, channel_dim: int = 1) -> bool:
    """Whether `gate_s` / `gate_frozen` can run on these tensors (else the caller falls back)."""
    return _unsupported(x, s_or_lam, channel_dim) is None


def _tiles(M: int, N: int, col: bool) -> tuple[int, int]:
    bn = min(triton.next_power_of_2(N), MAX_BN_COL if col else MAX_BN_ROW)
    bm = min(triton.next_power_of_2(M), max(1, TILE // bn))
    return bm, bn


def _device_ctx(x: torch.Tensor):
    return torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext()


def _forward(x: torch.Tensor, p: torch.Tensor, t: float, gate: int, channel_dim: int, from_s: bool):
    xv, permuted, M, N, C, _outer, col = _resolve(x, p, channel_dim)
    y = torch.empty_like(xv, memory_format=torch.contiguous_format)
    if xv.numel():
        bm, bn = _tiles(M, N, col)
        num_m, num_n = triton.cdiv(M, bm), triton.cdiv(N, bn)
        with _device_ctx(x):
            _gate_fwd[(num_m * num_n,)](xv, p.reshape(-1).contiguous(), y, M, N, C, float(t), num_n,
                                        COL=col, FROM_S=from_s, GATE=gate, BM=bm, BN=bn, **LAUNCH)
    return y.permute(0, 3, 1, 2) if permuted else y.view(x.shape)


def _backward(grad: torch.Tensor, x: torch.Tensor, p: torch.Tensor, t: float, gate: int, channel_dim: int,
              from_s: bool, need_x: bool, need_p: bool):
    xv, permuted, M, N, C, outer, col = _resolve(x, p, channel_dim)
    gv = (grad.permute(0, 2, 3, 1) if permuted else grad.reshape(xv.shape)).contiguous()
    gx = torch.empty_like(xv, memory_format=torch.contiguous_format) if need_x else None
    gp = None
    if xv.numel() == 0:
        gp = torch.zeros(p.shape, dtype=p.dtype, device=p.device) if need_p else None
    else:
        bm, bn = _tiles(M, N, col)
        num_m, num_n = triton.cdiv(M, bm), triton.cdiv(N, bn)
        red, other = (num_m, num_n) if col else (num_n, num_m)  # tiles along / across the reduced axis
        iters = max(1, min(MAX_ITERS, red, (red * other) // TARGET_PROGRAMS)) if need_p else 1
        chunks = triton.cdiv(red, iters)
        if col:
            num_m = chunks
        else:
            num_n = chunks
        part = torch.empty((chunks, N if col else M), dtype=torch.float32, device=x.device) if need_p else None
        with _device_ctx(x):
            _gate_bwd[(num_m * num_n,)](gv, xv, p.reshape(-1).contiguous(), gx if need_x else xv,
                                        part if need_p else xv, M, N, C, float(t), num_n, iters,
                                        COL=col, FROM_S=from_s, GATE=gate, NEED_X=need_x, NEED_P=need_p,
                                        BM=bm, BN=bn, **LAUNCH)
        if need_p:
            # one deterministic reduction over chunks (and, in row mode, over the outer index)
            gp = (part.sum(0) if col else part.view(chunks, outer, C).sum((0, 1))).to(p.dtype).view(p.shape)
    if gx is not None:
        gx = gx.permute(0, 3, 1, 2) if permuted else gx.view(x.shape)
    return gx, gp


def _gate_id(gate: str) -> int:
    if gate not in GATES:
        raise ValueError(f"gate {gate!r} is not one of {', '.join(GATES)}")
    return GATES[gate]


def _check(x: torch.Tensor, p: torch.Tensor, channel_dim: int) -> None:
    why = _unsupported(x, p, channel_dim)
    if why is not None:
        raise ValueError(f"the Triton λ-gate cannot run here: {why}")


class LambdaGateS(torch.autograd.Function):
    """x·g(λx) with λ = 1 + softplus(s/t) inside the kernels; gradients to x and s; saves x and s."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, s: torch.Tensor, t: float, gate: int, channel_dim: int) -> torch.Tensor:
        ctx.save_for_backward(x, s)
        ctx.t, ctx.gate, ctx.channel_dim = t, gate, channel_dim
        return _forward(x, s, t, gate, channel_dim, from_s=True)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, s = ctx.saved_tensors
        need_x, need_s = ctx.needs_input_grad[:2]
        if not (need_x or need_s):
            return None, None, None, None, None
        gx, gs = _backward(grad, x, s, ctx.t, ctx.gate, ctx.channel_dim, True, need_x, need_s)
        return gx, gs, None, None, None


class LambdaGateFrozen(torch.autograd.Function):
    """x·g(λx) with a given λ (the harden stage): gradient to x only; λ is treated as a constant."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, lam: torch.Tensor, gate: int, channel_dim: int) -> torch.Tensor:
        ctx.save_for_backward(x, lam)
        ctx.gate, ctx.channel_dim = gate, channel_dim
        return _forward(x, lam, 1.0, gate, channel_dim, from_s=False)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, lam = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        gx, _ = _backward(grad, x, lam, 1.0, ctx.gate, ctx.channel_dim, False, True, False)
        return gx, None, None, None


def gate_s(x: torch.Tensor, s: torch.Tensor, t: float, gate: str = "phi", channel_dim: int = 1) -> torch.Tensor:
    """x·g(λx), λ = 1 + softplus(s/t); s has 1 element (layer/global) or C = x.shape[channel_dim]
    (channel_dim 1 for [N, C, ...], −1 for [..., C]). Autograd to x and s; ∂s in s's dtype."""
    g = _gate_id(gate)
    _check(x, s, channel_dim)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature t must be a positive finite number, got {t}")
    return LambdaGateS.apply(x, s, float(t), g, channel_dim)


def gate_frozen(x: torch.Tensor, lam: torch.Tensor, gate: str = "phi", channel_dim: int = 1) -> torch.Tensor:
    """x·g(λx) with a frozen λ buffer (1 or C elements); autograd to x only."""
    g = _gate_id(gate)
    _check(x, lam, channel_dim)
    return LambdaGateFrozen.apply(x, lam, g, channel_dim)
