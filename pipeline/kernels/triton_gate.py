"""Fused Triton kernels for the λ-gates f(x) = x·g(λx), g = Φ (λ-GELU) or σ (λ-Swish), for CUDA.

One layer is one autograd node: λ = 1 + softplus(s/t) and ∂λ/∂s = σ(s/t)/t are computed inside the kernels
from the hardness parameter s, and ∂L/∂s is reduced inside the backward kernel. Only x and s are saved.
A frozen-λ path (λ a given buffer, gradient to x only) serves the harden stage.

**Layout.** x is viewed as [outer, C, inner] (C = x.shape[channel_dim], one λ per channel; C = 1 for a
layer/global λ, with outer = 1 and inner = numel):
  col mode (inner == 1, or NCHW stored channels-last)  the matrix [outer, C], tiles [BM, BN], λ per column;
  row mode (otherwise)                                  per channel c the matrix [outer, inner] at stride
                                                        C·inner, tiles [BO, BI], one λ per program.
λ is computed once per program (a vector in col mode), not per element: softplus costs an exp and a log.

**∂L/∂s in one launch.** Each backward program walks `iters` tiles of one channel (row mode) or one column
block (col mode), accumulates in fp32 registers, and writes one partial per channel; then it counts itself
done on that channel's counter (an acq_rel atomic, after a barrier, as Triton's layer-norm tutorial
publishes its partial sums). The program that arrives last sums the channel's partials in a fixed order,
scales by ∂λ/∂s / λ once, writes ∂s and resets the counter. No second launch, and the same inputs give the
same bits on every call (the order of the sum does not depend on which program finishes last). The
counters and partials live in the launch plan: launches of one plan must not overlap, which holds on one
stream (CUDA graph replays included); two streams running the same layer shape at once would need two plans.

**Φ with one exponential.** Φ(−a) = exp(−a²/2)·R(a) for a = |λx|, R(a) = t·Q(t) with t = 1/(1 + p·a) and Q
a polynomial of 8th degree fitted for minimax relative error on a ∈ [0, 40] (4e-7 relative in float32
arithmetic; `pipeline/kernels/phi_fit.py` refits and checks the coefficients; 16-bit inputs keep it too:
f' = Φ(z) + z·φ(z) cancels near z = −0.75, where a 4th-degree Q cost a float16 ulp). The backward's z·φ(z) = z·exp(−z²/2)/√(2π) shares the
same exponential, so each kernel computes one exp and one reciprocal per element (the previous version,
an erfc with its own exp beside exp(−z²/2), took about twice the instructions and was compute-bound).
For float32 inputs exp(−z²/2) is exact to a few ulp over the whole range: z = λx carries the rounding
residual of the product (fma), a² = q + q_lo exactly, and the exponent is reduced Cody–Waite style with
2^k built from the bits of the rounding constant; the result is m·2^(k+K0)·2^−K0 with the first two factors
normal, and the final ·2^−K0 is the one rounding into a subnormal. 16-bit inputs (one rounding of the
fp32 result to 8 or 11 bits) use plain exp2: its argument's rounding costs at most 1e-6 relative where
the result is not negligible.

Non-contiguous inputs are copied with .contiguous(); a 4-D NCHW tensor in channels_last memory format
with channel_dim=1 runs in col mode without a copy, and its outputs keep that memory format.
float64 is not supported (`supports` is False; the caller falls back to the CPU/eager kernels).
Kernels run on CPU tensors only under the Triton interpreter (TRITON_INTERPRET=1 set before import).

**Launch path.** Everything that depends only on (shape, strides, dtype, device, channel layout) is decided
once and kept in a `_Plan`: the view, tiles, grids, the partials and counters, and, per kernel
variant, the compiled kernel's runner (Triton ≥ 3.3: `CompiledKernel[grid]`, called with every parameter,
constexprs included, as `JITFunction.run` does). A call then costs a dict lookup, the output's allocation and
one launch each way. The first call of a plan, the interpreter, and tensors whose alignment differs from
the plan's go through `JITFunction.run`, which specializes and compiles.
"""

from __future__ import annotations

import math

import torch

from pipeline.gates import INV_SQRT_2PI  # Φ's constants have one home (absolute: the tests load this file by path)

# |z| beyond which z·φ(z) and Φ(z) ∈ {0, 1} are exact in float32: clamping z there only turns ±inf finite.
PHI_CLAMP = 40.0
# Same for σ: x·exp(−110) rounds to 0 in float32 for |x| ≤ 110 (smallest subnormal 1.4e-45 = e^−103.3).
SIGMOID_CLAMP = 110.0
# exp(h) for h < −EXP_FLOOR is computed as exp(−EXP_FLOOR): every f and f' built on it rounds to 0 there.
EXP_FLOOR = 110.0
# 2^(k + EXP_BIAS) stays a normal float for k ≥ round(−EXP_FLOOR·log2 e) = −159; results are scaled by 2^−EXP_BIAS last.
EXP_BIAS = 34
SOFTPLUS_THRESHOLD = 20.0  # F.softplus: identity above s/t = 20
GATES = {"phi": 0, "sigmoid": 1}
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# R(a) = Φ(−a)/exp(−a²/2) ≈ t·Q(t), t = 1/(1 + p·a): (p, coefficients of Q from t⁰ up), from phi_fit.py.
PHI_TAIL = (0.36000001430511475,
            (0.1436176747083664, 0.14368188381195068, 0.12400976568460464, 0.09603732824325562,
             -0.00038626097375527024, 0.10736887156963348, -0.22359921038150787, 0.13950815796852112,
             -0.030238205567002296))

# Tiling: at most BLOCK elements per program, ELEMS_PER_THREAD per thread (8 warps at BLOCK: one 16-byte access per
# thread and operand in 16-bit formats, two in fp32; 16 per thread kept the learned backward at 126 registers and 2
# programs per SM); tensors smaller than MIN_PROGRAMS·BLOCK get smaller tiles, down to MIN_BLOCK. Col mode tiles are at
# most MAX_BN_COL channels wide (a 128-byte line of bf16). The backward keeps about TARGET_PROGRAMS programs, walks at
# most MAX_ITERS tiles per program, and makes at most MAX_CHUNKS partials per channel where it can; the last program
# sums PART_STEP partials per step. BWD_MAXNREG caps the learned backward's registers so that 4 programs fit per SM
# instead of 3, with no spills.
BLOCK = 2048
ELEMS_PER_THREAD = 8
MIN_BLOCK = 256
MIN_PROGRAMS = 264
MAX_BN_COL = 64
TARGET_PROGRAMS = 1024
MAX_ITERS = 16
MAX_CHUNKS = 64
PART_STEP = 4096
BWD_MAXNREG = 64
# Launch options, pinned: the exact residuals use explicit fma, so contraction elsewhere only helps accuracy
# (Triton 3.9 warns that its default flips in 3.10). The interpreter ignores these; num_warps is the plan's.
LAUNCH = {"enable_fp_fusion": True}

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

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


def _lean_launch_ok() -> bool:
    """Triton ≥ 3.3 passes every declared parameter, constexprs included, to a compiled kernel's launcher."""
    major, minor = (int(v) for v in triton.__version__.split(".")[:2])
    return (major, minor) >= (3, 3)


if _IMPORT_ERROR is None:
    _INV_SQRT_2PI = tl.constexpr(INV_SQRT_2PI)
    _PHI_CLAMP = tl.constexpr(PHI_CLAMP)
    _SIGMOID_CLAMP = tl.constexpr(SIGMOID_CLAMP)
    _EXP_FLOOR = tl.constexpr(EXP_FLOOR)
    _SP_THRESHOLD = tl.constexpr(SOFTPLUS_THRESHOLD)
    _LOG2E = tl.constexpr(1.4426950408889634)
    # Cody–Waite split of ln 2: k·_LN2_HI is exact for |k| < 512 (LN2_HI has 15 significant bits).
    _LN2_HI = tl.constexpr(0.693145751953125)
    _LN2_LO = tl.constexpr(1.428606765330187e-06)
    # fma(h, log2 e, _ROUND) rounds h·log2 e to an integer k (ulp 1 in [2^23, 2^24)) and leaves k + EXP_BIAS + 127
    # in the low mantissa bits: shifted left by 23 they are the bits of 2^(k + EXP_BIAS).
    _ROUND = tl.constexpr(12582912.0 + EXP_BIAS + 127)
    _ROUND_BITS = tl.constexpr(0x4B400000)
    _TWO_M_BIAS = tl.constexpr(2.0 ** -EXP_BIAS)
    _PT = tl.constexpr(PHI_TAIL[0])
    _A0, _A1, _A2, _A3, _A4, _A5, _A6, _A7, _A8 = (tl.constexpr(c) for c in PHI_TAIL[1])

    @triton.jit
    def _ex2(v, FAST: tl.constexpr):
        """2^v: compiled, the hardware's ex2.approx.ftz (one MUFU instruction, 2 ulp; tl.exp2 adds a subnormal
        fix-up that no argument here needs); interpreted, numpy's exp2."""
        if FAST:
            return libdevice.exp2(v)
        else:
            return tl.exp2(v)

    @triton.jit
    def _rcp(v, FAST: tl.constexpr):
        """1/v for v in [1, 16]: compiled, the hardware's approximate reciprocal (1 ulp; `1/v` compiles to a
        division with range fix-ups); interpreted, an exact division."""
        if FAST:
            return libdevice.fast_dividef(1.0, v)
        else:
            return 1.0 / v

    @triton.jit
    def _exp_parts(h, h_lo, FAST: tl.constexpr):
        """(m, s) with exp(h + h_lo) = m·s·2^−EXP_BIAS to a few ulp, for −EXP_FLOOR ≤ h ≤ 0 exact and |h_lo| ≪ 1:
        m ∈ [0.7, 1.42] and s = 2^(k + EXP_BIAS) are normal floats."""
        t1 = tl.fma(h, _LOG2E, _ROUND)
        k = t1 - _ROUND  # the integer nearest h·log2 e, exactly
        r = tl.fma(k, -_LN2_HI, h)  # exact
        r = tl.fma(k, -_LN2_LO, r) + h_lo  # |r| ≲ 0.35
        m = _ex2(r * _LOG2E, FAST)
        s = ((t1.to(tl.int32, bitcast=True) - _ROUND_BITS) << 23).to(tl.float32, bitcast=True)
        return m, s

    @triton.jit
    def _lambda_vec(p_ptr, idx, mask, t, FROM_S: tl.constexpr):
        """λ (and ∂λ/∂s / λ when FROM_S) for a vector or scalar of channels, in fp32."""
        p = tl.load(p_ptr + idx, mask=mask, other=0.0).to(tl.float32)
        if FROM_S:
            # inductor passes a Python float as fp64 (torch.compile through gate_op.py), the launcher as fp32: in fp64,
            # λ would reach _times_e's 32-bit bitcast and fail to compile; in fp32 both paths round alike
            t = tl.cast(t, tl.float32)
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
    def _gate_parts(x, lam, GATE: tl.constexpr, PRECISE: tl.constexpr, FAST: tl.constexpr):
        """Per element, with z = λx, a = |z| clamped and E = m·s·2^−EXP_BIAS = exp(−a²/2) (Φ) or exp(−a) (σ):
        (zc, neg, inside, m, s, tail, zdg) where
          tail·E = g(−a)                  (Φ(−a) = R(a)·E; σ(−a) = E·r, r = 1/(1 + E))
          zdg·E  = z·g'(z)                (z·φ(z) = z·E/√(2π); z·σ'(z) = z·E·r²)
        neg: z < 0; inside: |z| ≤ clamp (beyond it x·g(−a)·E is 0 and x may be ±inf)."""
        z = lam * x
        if GATE == 0:
            CL: tl.constexpr = _PHI_CLAMP
        else:
            CL: tl.constexpr = _SIGMOID_CLAMP
        inside = tl.abs(z) <= CL
        zc = tl.clamp(z, -CL, CL, propagate_nan=tl.PropagateNan.ALL)
        a = tl.abs(zc)
        neg = zc < 0
        if PRECISE:
            z_lo = tl.where(inside, tl.fma(lam, x, -z), 0.0)  # λ·x = z + z_lo exactly (0 for ±inf)
            a_lo = tl.where(neg, -z_lo, z_lo)
        if GATE == 0:
            if PRECISE:
                q = a * a
                q_lo = tl.fma(a, a, -q)  # a² = q + q_lo exactly
                # −(a + a_lo)²/2 = −q/2 − (q_lo/2 + a·a_lo) up to a_lo² (relative 1e-14)
                m, s = _exp_parts(tl.maximum(-0.5 * q, -_EXP_FLOOR), -0.5 * q_lo - a * a_lo, FAST)
            else:
                m = _ex2(tl.maximum(-0.5 * a * a, -_EXP_FLOOR) * _LOG2E, FAST)  # E itself (`_times_e`)
                s = 1.0
            tt = _rcp(1.0 + _PT * a, FAST)
            qp = _A8
            qp = qp * tt + _A7
            qp = qp * tt + _A6
            qp = qp * tt + _A5
            qp = qp * tt + _A4
            qp = qp * tt + _A3
            qp = qp * tt + _A2
            qp = qp * tt + _A1
            qp = qp * tt + _A0
            tail = tt * qp
            zdg = zc * _INV_SQRT_2PI
        else:
            if PRECISE:
                m, s = _exp_parts(tl.maximum(-a, -_EXP_FLOOR), -a_lo, FAST)
            else:
                m = _ex2(tl.maximum(-a, -_EXP_FLOOR) * _LOG2E, FAST)  # E itself (`_times_e`)
                s = 1.0
            r = _rcp(1.0 + _times_e(1.0, m, s, PRECISE), FAST)
            tail = r
            zdg = (zc * r) * r
        return zc, neg, inside, m, s, tail, zdg

    @triton.jit
    def _times_e(v, m, s, PRECISE: tl.constexpr):
        """v·E. PRECISE (float32 inputs): E = m·s·2^−EXP_BIAS, the normal factors first, the power of two last (one
        rounding into a subnormal); else E = m (flushed to 0 below 2^−126: at most that, absolutely, for 16-bit outputs)."""
        if PRECISE:
            return ((v * m) * s) * _TWO_M_BIAS
        else:
            return v * m

    @triton.jit
    def _tile(pid, M, N, C, TI, COL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        """(offsets, mask, channel index or column vector) of tile `pid` in the forward's enumeration."""
        if COL:  # tiles of the [M, N = C] matrix; pid → (row tile, column tile)
            rows = (pid // TI) * BM + tl.arange(0, BM)
            cols = (pid % TI) * BN + tl.arange(0, BN)
            offs = rows[:, None] * N + cols[None, :]
            return offs, (rows < M)[:, None] & (cols < N)[None, :], cols
        else:  # per channel c, tiles of the [M = outer, N = inner] matrix at stride C·N; pid → (o tile, c, i tile)
            i_t = pid % TI
            rest = pid // TI
            c = rest % C
            rows = (rest // C) * BM + tl.arange(0, BM)
            cols = i_t * BN + tl.arange(0, BN)
            offs = (rows * C + c)[:, None] * N + cols[None, :]
            return offs, (rows < M)[:, None] & (cols < N)[None, :], c

    @triton.jit
    def _gate_fwd(x_ptr, p_ptr, y_ptr, M, N, C, TI, t,
                  COL: tl.constexpr, FROM_S: tl.constexpr, GATE: tl.constexpr, PRECISE: tl.constexpr,
                  FAST: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        offs, mask, ch = _tile(tl.program_id(0), M, N, C, TI, COL, BM, BN)
        if COL:
            lam, _ = _lambda_vec(p_ptr, ch, ch < N, t, FROM_S)
            lam = lam[None, :]
        else:
            lam, _ = _lambda_vec(p_ptr, ch, ch < C, t, FROM_S)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        zc, neg, inside, m, s, tail, _zdg = _gate_parts(x, lam, GATE, PRECISE, FAST)
        # f = x·g(z): on the negative side x·tail·E, on the positive side x − x·tail·E for Φ (1 − Φ(−a) = Φ(a)) and
        # x·r for σ. Beyond the clamp x·tail·E is 0 (f(−∞) = 0, f(+∞) = +∞): x is zeroed there, so ±inf never forms
        # inf·0 (both sides of a select are evaluated); NaN stays NaN through x − 0.
        v = _times_e(tl.where(inside, x, 0.0) * tail, m, s, PRECISE)
        if GATE == 0:
            y = tl.where(neg, v, x - v)
        else:
            y = tl.where(neg, v, x * tail)
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _gate_bwd(g_ptr, x_ptr, p_ptr, gx_ptr, gp_ptr, part_ptr, cnt_ptr, M, N, C, TI, TT, CH, iters, t,
                  COL: tl.constexpr, FROM_S: tl.constexpr, GATE: tl.constexpr, PRECISE: tl.constexpr,
                  FAST: tl.constexpr, NEED_X: tl.constexpr, NEED_P: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr, PR: tl.constexpr):
        pid = tl.program_id(0)
        if COL:  # program (column block b, chunk ch): row tiles ch·iters .. ch·iters + iters − 1
            b = pid % TI
            ch = pid // TI
            cols = b * BN + tl.arange(0, BN)
            lam, scale = _lambda_vec(p_ptr, cols, cols < N, t, FROM_S)
            lam = lam[None, :]
        else:  # program (channel c, chunk ch): tiles ch·iters .. of channel c's [outer, inner] matrix
            b = pid % C
            ch = pid // C
            lam, scale = _lambda_vec(p_ptr, b, b < C, t, FROM_S)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for i in range(iters):
            j = ch * iters + i
            if COL:
                rows = j * BM + tl.arange(0, BM)
                offs = rows[:, None] * N + cols[None, :]
                mask = (rows < M)[:, None] & (cols < N)[None, :]
            else:
                rows = (j // TI) * BM + tl.arange(0, BM)
                cc = (j % TI) * BN + tl.arange(0, BN)
                offs = (rows * C + b)[:, None] * N + cc[None, :]
                m_lim = tl.where(j < TT, M, 0)  # tiles past the channel's last one load nothing
                mask = (rows < m_lim)[:, None] & (cc < N)[None, :]
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            zc, neg, inside, m, s, tail, zdg = _gate_parts(x, lam, GATE, PRECISE, FAST)
            zd = _times_e(zdg, m, s, PRECISE)  # z·g'(z)
            if NEED_X:
                if GATE == 0:
                    gt = _times_e(tail, m, s, PRECISE)
                    cdf = tl.where(neg, gt, 1.0 - gt)
                else:
                    cdf = tl.where(neg, _times_e(tail, m, s, PRECISE), tail)
                gx = g * (cdf + zd)  # ∂f/∂x = g(z) + z·g'(z)
                tl.store(gx_ptr + offs, gx.to(gx_ptr.dtype.element_ty), mask=mask)
            if NEED_P:
                # λ·∂f/∂λ = x·z·g'(z); x is 0 where |z| is clamped (there z·g'(z) = 0, and x may be ±inf)
                acc += tl.where(mask, g * tl.where(inside | (x != x), x, 0.0) * zd, 0.0)
        if NEED_P:
            if COL:
                tl.store(part_ptr + ch * N + cols, tl.sum(acc, axis=0), mask=cols < N)
            else:
                tl.store(part_ptr + ch * C + b, tl.sum(acc))
            tl.debug_barrier()  # every thread's partial is written before the count below publishes them
            done = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel")
            if done == CH - 1:  # the last program of this channel (block): sum its partials in chunk order
                if COL:
                    tot = tl.zeros([BN], dtype=tl.float32)
                    for k in range(0, CH, PR):
                        r = k + tl.arange(0, PR)
                        pm = (r < CH)[:, None] & (cols < N)[None, :]
                        blk = tl.load(part_ptr + r[:, None] * N + cols[None, :], mask=pm, other=0.0,
                                      cache_modifier=".cg")
                        tot += tl.sum(blk, axis=0)
                    tl.store(gp_ptr + cols, tot * scale, mask=cols < N)
                else:
                    tot = tl.zeros([PR], dtype=tl.float32)
                    for k in range(0, CH, PR):
                        r = k + tl.arange(0, PR)
                        tot += tl.load(part_ptr + r * C + b, mask=r < CH, other=0.0, cache_modifier=".cg")
                    tl.store(gp_ptr + b, tl.sum(tot) * scale)
                tl.atomic_xchg(cnt_ptr + b, 0)  # ready for the next launch of this plan


# ---------------------------------------------------------------------------------------------
# Host side: plans


class Layout:
    """Tiles, grids and the backward's chunking for one (shape, channel layout, λ size): the numbers a launch needs
    (see the module docstring); `_Plan` adds the buffers and launchers a layout keeps, the custom op (`gate_op.py`)
    allocates its own per call."""

    def __init__(self, numel: int, C: int, outer: int, inner: int, permuted: bool):
        self.permuted = permuted
        self.C = C
        self.col = permuted or (C > 1 and inner == 1)
        # A tile of `block` elements, ELEMS_PER_THREAD per thread; small tensors get smaller tiles, so that at least
        # MIN_PROGRAMS programs share the work (one thread's serial chain of exp, reciprocal and polynomial is long).
        block = min(BLOCK, max(MIN_BLOCK, triton.next_power_of_2(triton.cdiv(numel, MIN_PROGRAMS))))
        self.warps = max(1, block // (32 * ELEMS_PER_THREAD))
        if self.col:
            M, N = outer * inner if permuted else outer, C
            bn = min(triton.next_power_of_2(N), MAX_BN_COL)
            bm = min(triton.next_power_of_2(M), max(1, block // bn))
            tm, tn = triton.cdiv(M, bm), triton.cdiv(N, bn)
            self.TI, self.TT = tn, tm  # column blocks; row tiles per column block
            self.fwd_grid = (tm * tn, 1, 1)
            self.lanes = tn  # programs across the reduced axis: one per column block
        else:
            M, N = outer, inner
            bn = min(triton.next_power_of_2(N), block)
            bm = min(triton.next_power_of_2(M), max(1, block // bn))
            ti = triton.cdiv(N, bn)
            self.TI, self.TT = ti, triton.cdiv(M, bm) * ti  # tiles along inner; tiles per channel
            self.fwd_grid = (self.TT * C, 1, 1)
            self.lanes = C
        self.M, self.N, self.bm, self.bn = M, N, bm, bn
        # Tiles per backward program: enough programs to fill the GPU, at most MAX_CHUNKS partials per channel (the
        # last program sums them in one step) where MAX_ITERS allows.
        self.iters = max(1, min(MAX_ITERS, max((self.TT * self.lanes) // TARGET_PROGRAMS, triton.cdiv(self.TT, MAX_CHUNKS)),
                                self.TT))
        self.CH = triton.cdiv(self.TT, self.iters)
        self.bwd_grid = (self.CH * self.lanes, 1, 1)
        # partials the last program sums per step: a [pr, bn] tile in col mode, a [pr] vector in row mode
        self.pr = min(triton.next_power_of_2(self.CH), max(1, PART_STEP // bn) if self.col else PART_STEP)
        self.parts = self.CH * (N if self.col else C)  # partials: one per chunk and channel (or column)

    def view(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1) if self.permuted else x.contiguous()

    def restore(self, y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return y.permute(0, 3, 1, 2) if self.permuted else y


class _Plan(Layout):
    """A layout with what its launches keep: the partials and self-resetting counters of the backward, and per kernel
    variant the compiled kernel's launch function."""

    def __init__(self, x: torch.Tensor, C: int, outer: int, inner: int, permuted: bool):
        super().__init__(x.numel(), C, outer, inner, permuted)
        self.part = torch.empty(self.parts, dtype=torch.float32, device=x.device)
        self.counters = torch.zeros(self.lanes, dtype=torch.int32, device=x.device)
        self.runners: dict[tuple, object] = {}
        self.device_index = x.device.index if x.device.type == "cuda" else None


# Plans are never evicted: a captured CUDA graph keeps the addresses of a plan's partials and counters, so they must
# live as long as the process (a plan costs a few hundred bytes of device memory per layer shape).
_PLANS: dict[tuple, _Plan | str] = {}


def clear_plans() -> None:
    """Forget every launch plan (tests that change the tiling constants call this; never while a captured graph that
    launched these kernels may still be replayed)."""
    _PLANS.clear()


def _key(x: torch.Tensor, p: torch.Tensor, channel_dim: int) -> tuple:
    return (x.shape, x.stride(), x.dtype, x.device, p.numel(), p.dtype, p.device, channel_dim)


def _layout(x: torch.Tensor, p: torch.Tensor, channel_dim: int) -> tuple[int, int, int, bool] | str:
    """(C, outer, inner, permuted) or a reason string."""
    if p.numel() == 1:
        return 1, 1, x.numel(), False
    if x.dim() < 1:
        return "a per-channel λ needs x with a channel dim"
    d = channel_dim % x.dim() if -x.dim() <= channel_dim < x.dim() else None
    if d is None:
        return f"channel_dim {channel_dim} is out of range for x of shape {tuple(x.shape)}"
    C = x.shape[d]
    if p.numel() != C:
        return f"s/λ has {p.numel()} elements, x has {C} channels on dim {channel_dim}"
    outer, inner = math.prod(x.shape[:d]), math.prod(x.shape[d + 1:])
    # NCHW stored NHWC: run as channels last on the permuted view, no copy.
    permuted = (d == 1 and x.dim() == 4 and inner > 1 and not x.is_contiguous()
                and x.is_contiguous(memory_format=torch.channels_last))
    return C, outer, inner, permuted


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
    lay = _layout(x, p, channel_dim)
    return lay if isinstance(lay, str) else None


def _plan(x: torch.Tensor, p: torch.Tensor, channel_dim: int) -> _Plan | str:
    """The cached plan for these tensors, or the reason the kernels cannot take them (also cached)."""
    key = _key(x, p, channel_dim)
    plan = _PLANS.get(key)
    if plan is None:
        why = _unsupported(x, p, channel_dim)
        if why is not None:
            plan = why
        elif x.numel() == 0:
            return "empty"
        else:
            C, outer, inner, permuted = _layout(x, p, channel_dim)
            plan = _Plan(x, C, outer, inner, permuted)
        _PLANS[key] = plan
    return plan


def supports(x: torch.Tensor, s_or_lam: torch.Tensor, channel_dim: int = 1) -> bool:
    """Whether `gate_s` / `gate_frozen` can run on these tensors (else the caller falls back)."""
    return _unsupported(x, s_or_lam, channel_dim) is None


# ---------------------------------------------------------------------------------------------
# Host side: launches


def _aligned(*ts: torch.Tensor) -> int:
    """A bit per pointer that may be a view into other memory: 16-byte aligned (Triton specializes compiled kernels on
    it). The outputs, fresh from the caching allocator, always are."""
    bits = 0
    for i, t in enumerate(ts):
        bits |= (t.data_ptr() % 16 == 0) << i
    return bits


_LAUNCHER = {"kind": None, "error": None}  # which launcher the compiled kernels use (reported in kernels.status())


def _static_launcher_cls():
    """torch's C++ launcher for Triton cubins (inductor's: no Python per argument), or None where this torch has none."""
    try:
        from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    except ImportError:
        try:
            from torch._inductor.runtime.static_cuda_launcher import StaticallyLaunchedCudaKernel
        except ImportError:
            return None
    return StaticallyLaunchedCudaKernel


_CUBIN_DIR: list[str] = []


def _runner(fn, kernel, grid: tuple[int, int, int], args: tuple, index: int):
    """A launch function (args, stream) for a compiled kernel: torch's static launcher where it takes the kernel (the
    cubin's own parameters only: declared constexprs and the ones Triton specialized away are dropped), else Triton's
    runner, which takes every declared parameter (Triton ≥ 3.3)."""
    cls = _static_launcher_cls()
    if cls is not None:
        try:
            import os
            import tempfile

            if not _CUBIN_DIR:
                _CUBIN_DIR.append(tempfile.mkdtemp(prefix="lambda_gate_cubin_"))
            path = os.path.join(_CUBIN_DIR[0], f"{kernel.hash}.cubin")
            with open(path, "wb") as f:
                f.write(kernel.asm["cubin"])
            kernel._cubin_path = path  # what the launcher reads (inductor sets it on its own kernels)
            st = cls(kernel)
            st.load_kernel(index)
            drop = set(st.full_constexprs) | {p.num for p in fn.params if p.is_constexpr}
            keep = tuple(i for i in range(len(args)) if i not in drop)
            run, (gx, gy, gz) = st.run, grid

            def static(a, stream):
                run(gx, gy, gz, stream, *[a[i] for i in keep])
            # Proven once per kernel variant: the JIT launch just wrote the outputs; the static launch must write the
            # same bits (an error or a difference leaves Triton's runner in charge).
            outs = [a for a in args if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]
            before = [o.clone() for o in outs]
            static(args, torch._C._cuda_getCurrentRawStream(index))
            if not all(torch.equal(b, o) for b, o in zip(before, outs)):
                raise RuntimeError("the static launcher's outputs differ from Triton's")
            _LAUNCHER["kind"] = "torch static launcher"
            return static, True
        except Exception as exc:  # noqa: BLE001 - an internal API of torch: fall back, say why
            _LAUNCHER["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not _lean_launch_ok():
        return None, False
    tr = kernel[grid]
    _LAUNCHER["kind"] = _LAUNCHER["kind"] or "triton runner"
    return (lambda a, stream: tr(*a, stream=stream)), False


def _launch(fn, plan: _Plan, grid: tuple[int, int, int], variant: tuple, tensors: tuple, args: tuple,
            device: torch.device, maxnreg: int | None = None) -> None:
    """Launch `fn` with `args` (every parameter in order, constexprs last) through the plan's cached launch function;
    the first launch of a variant (or of a new pointer alignment) goes through `JITFunction.run`, which compiles."""
    if device.type == "cpu":  # the interpreter
        fn[grid](*args, num_warps=plan.warps, **LAUNCH)
        return
    key = (variant, _aligned(*tensors))
    runner = plan.runners.get(key)
    index = plan.device_index if plan.device_index is not None else torch.cuda.current_device()
    if runner is None:
        opts = {"num_warps": plan.warps, **LAUNCH, **({"maxnreg": maxnreg} if maxnreg else {})}
        with torch.cuda.device(index):
            kernel = fn[grid](*args, **opts)
            # (the static launcher's first launch repeats this one: the kernels only write their outputs)
            runner = _runner(fn, kernel, grid, args, index)[0] if kernel is not None else None
        if runner is not None:
            plan.runners[key] = runner
        return
    if index != torch._C._cuda_getDevice():
        with torch.cuda.device(index):
            runner(args, torch._C._cuda_getCurrentRawStream(index))
    else:
        runner(args, torch._C._cuda_getCurrentRawStream(index))


def _forward(x: torch.Tensor, p: torch.Tensor, t: float, gate: int, plan: _Plan, from_s: bool) -> torch.Tensor:
    xv = plan.view(x)
    y = torch.empty_like(xv, memory_format=torch.contiguous_format)  # xv's shape: no view back unless permuted
    precise, fast = x.dtype == torch.float32, x.device.type == "cuda"
    _launch(_gate_fwd, plan, plan.fwd_grid, (0, from_s, gate, precise), (xv, p),
            (xv, p, y, plan.M, plan.N, plan.C, plan.TI, float(t), plan.col, from_s, gate, precise, fast, plan.bm,
             plan.bn), x.device)
    return plan.restore(y, x)


def _backward(grad: torch.Tensor, x: torch.Tensor, p: torch.Tensor, t: float, gate: int, plan: _Plan,
              from_s: bool, need_x: bool, need_p: bool):
    xv = plan.view(x)
    gv = (grad.permute(0, 2, 3, 1) if plan.permuted else grad).contiguous()  # ∂y has x's shape
    gx = torch.empty_like(xv, memory_format=torch.contiguous_format) if need_x else xv
    gp = torch.empty(p.numel(), dtype=torch.float32, device=x.device) if need_p else plan.part
    precise, fast = x.dtype == torch.float32, x.device.type == "cuda"
    args = (gv, xv, p, gx, gp, plan.part, plan.counters, plan.M, plan.N, plan.C, plan.TI, plan.TT, plan.CH,
            plan.iters, float(t), plan.col, from_s, gate, precise, fast, need_x, need_p, plan.bm, plan.bn, plan.pr)
    _launch(_gate_bwd, plan, plan.bwd_grid, (1, from_s, gate, precise, need_x, need_p), (gv, xv, p),
            args, x.device, BWD_MAXNREG if need_p else None)
    if need_p and (p.dtype != torch.float32 or p.dim() != 1):
        gp = gp.to(p.dtype).view(p.shape)
    return (plan.restore(gx, x) if need_x else None), (gp if need_p else None)


def _gate_id(gate: str) -> int:
    if gate not in GATES:
        raise ValueError(f"gate {gate!r} is not one of {', '.join(GATES)}")
    return GATES[gate]


def _checked_plan(x: torch.Tensor, p: torch.Tensor, channel_dim: int) -> _Plan | None:
    """The plan, None for an empty x; raises with the reason when the kernels cannot take these tensors."""
    plan = _plan(x, p, channel_dim)
    if isinstance(plan, str):
        if plan == "empty":
            return None
        raise ValueError(f"the Triton λ-gate cannot run here: {plan}")
    return plan


class LambdaGateS(torch.autograd.Function):
    """x·g(λx) with λ = 1 + softplus(s/t) inside the kernels; gradients to x and s; saves x and s."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, s: torch.Tensor, t: float, gate: int, plan: _Plan | None) -> torch.Tensor:
        ctx.save_for_backward(x, s)
        ctx.t, ctx.gate, ctx.plan = t, gate, plan
        return _forward(x, s, t, gate, plan, True) if plan is not None else torch.empty_like(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, s = ctx.saved_tensors
        need_x, need_s = ctx.needs_input_grad[:2]
        if ctx.plan is None:  # an empty x
            return (torch.zeros_like(x) if need_x else None), (torch.zeros_like(s) if need_s else None), None, None, None
        if not (need_x or need_s):
            return None, None, None, None, None
        gx, gs = _backward(grad, x, s, ctx.t, ctx.gate, ctx.plan, True, need_x, need_s)
        return gx, gs, None, None, None


class LambdaGateFrozen(torch.autograd.Function):
    """x·g(λx) with a given λ (the harden stage): gradient to x only; λ is treated as a constant."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, lam: torch.Tensor, gate: int, plan: _Plan | None) -> torch.Tensor:
        ctx.save_for_backward(x, lam)
        ctx.gate, ctx.plan = gate, plan
        return _forward(x, lam, 1.0, gate, plan, False) if plan is not None else torch.empty_like(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, lam = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        if ctx.plan is None:
            return torch.zeros_like(x), None, None, None
        gx, _ = _backward(grad, x, lam, 1.0, ctx.gate, ctx.plan, False, True, False)
        return gx, None, None, None


def gate_s(x: torch.Tensor, s: torch.Tensor, t: float, gate: str = "phi", channel_dim: int = 1) -> torch.Tensor:
    """x·g(λx), λ = 1 + softplus(s/t); s has 1 element (layer/global) or C = x.shape[channel_dim]
    (channel_dim 1 for [N, C, ...], −1 for [..., C]). Autograd to x and s; ∂s in s's dtype."""
    g = _gate_id(gate)
    plan = _checked_plan(x, s, channel_dim)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature t must be a positive finite number, got {t}")
    return LambdaGateS.apply(x, s if s.dim() == 1 else s.reshape(-1), float(t), g, plan)


def gate_frozen(x: torch.Tensor, lam: torch.Tensor, gate: str = "phi", channel_dim: int = 1) -> torch.Tensor:
    """x·g(λx) with a frozen λ buffer (1 or C elements); autograd to x only."""
    g = _gate_id(gate)
    plan = _checked_plan(x, lam, channel_dim)
    return LambdaGateFrozen.apply(x, lam if lam.dim() == 1 else lam.reshape(-1), g, plan)


def try_gate_s(x: torch.Tensor, s: torch.Tensor, t: float, gate: int, channel_dim: int) -> torch.Tensor | None:
    """`gate_s` for the training path: None (the caller falls back) when the kernels cannot take these tensors.
    The checks are the plan's, made once per layout; `gate` is an id of `GATES` and t is positive."""
    plan = _PLANS.get(_key(x, s, channel_dim))
    if plan is None:
        plan = _plan(x, s, channel_dim)
    if isinstance(plan, str):
        return None
    return LambdaGateS.apply(x, s if s.dim() == 1 else s.reshape(-1), t, gate, plan)


def try_gate_frozen(x: torch.Tensor, lam: torch.Tensor, gate: int, channel_dim: int) -> torch.Tensor | None:
    """`gate_frozen` for the training path, like `try_gate_s`."""
    plan = _PLANS.get(_key(x, lam, channel_dim))
    if plan is None:
        plan = _plan(x, lam, channel_dim)
    if isinstance(plan, str):
        return None
    return LambdaGateFrozen.apply(x, lam if lam.dim() == 1 else lam.reshape(-1), gate, plan)
