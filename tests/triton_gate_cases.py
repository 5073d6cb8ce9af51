"""The fused Triton λ-gate kernels (pipeline.kernels.triton_gate) against a float64 autograd reference
x·0.5·erfc(−λx/√2) / x·σ(λx) with λ = 1 + softplus(s/t).

Not collected by the suite itself: tests/test_triton_kernel.py runs this file in a child process, on the CPU under
the Triton interpreter (TRITON_INTERPRET=1 set before triton is imported) and, on a machine with a GPU, on CUDA with
compiled kernels (TRITON_GATE_TEST_COMPILED=1). Triton fixes interpreter mode process-wide at its first import, so a
test process of the suite never sets it: it would leak into every other test of that process.
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed: the Triton λ-gate kernels cannot run")

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.kernels import triton_gate as tg

_COMPILED_CHILD = os.environ.get("TRITON_GATE_TEST_COMPILED") == "1"

if not _COMPILED_CHILD and not tg.interpreted():
    pytest.skip("run through tests/test_triton_kernel.py: the kernels need the Triton interpreter (TRITON_INTERPRET=1 "
                "before triton is imported) on the CPU, or TRITON_GATE_TEST_COMPILED=1 on CUDA", allow_module_level=True)


DEVICE = "cuda" if _COMPILED_CHILD else "cpu"

# ---------------------------------------------------------------------------------------------
# Tolerances: |actual − reference| ≤ ATOL + RTOL·|reference| unless said otherwise.

# fp32: λ = 1 + softplus(s/t) is rounded to fp32 in the kernel (the reference keeps it in fp64), and Φ's
# relative sensitivity to z is ~z², so one ulp of λ costs ~z²·6e-8: 1e-5 covers |z| ≲ 10 where f is not tiny.
F32_RTOL = 1e-5
# Absolute floor where f or f' crosses 0 (GELU's minimum near z ≈ −0.75): ~8 ulp of 1.
F32_ATOL = 1e-6
# 16-bit outputs are one rounding of the fp32 result: one ulp of the format (2^-7 bf16, 2^-10 fp16).
BF16_RTOL = 2.0**-7
F16_RTOL = 2.0**-10
HALF_ATOL = 1e-6  # fp32 math error before the final rounding (fp16 subnormal spacing is 6e-8)
# ∂L/∂s is summed in fp32 from the same (16-bit or fp32) inputs: relative to Σ|per-element terms| (the ℓ1
# scale of the sum, so cancellation between terms of both signs is not counted against the kernel).
GRAD_S_RTOL = 1e-5
# Far negative tail: relative error vs the fp64 reference, relative to max(|ref|, smallest normal fp32).
TAIL_RTOL = 1e-5
FLT_TINY = torch.finfo(torch.float32).tiny

TOLS = {torch.float32: (F32_RTOL, F32_ATOL), torch.bfloat16: (BF16_RTOL, HALF_ATOL),
        torch.float16: (F16_RTOL, HALF_ATOL)}

LAYOUTS = {  # name: (shape, channels (1: one λ), channel_dim)
    "layer": ((4, 6, 5), 1, 1),
    "channel_nc": ((6, 5), 5, 1),  # [N, C]: channels last in memory (col mode)
    "channel_nchw": ((3, 4, 5, 6), 4, 1),  # inner = 30, not a power of two (row mode)
    "channel_last": ((3, 7, 5), 5, -1),  # [B, T, C]
}
T = 0.5  # exactly representable: the kernel's fp32 t equals the reference's


# ---------------------------------------------------------------------------------------------
# Reference


def _bcast(p: torch.Tensor, x: torch.Tensor, channel_dim: int) -> torch.Tensor:
    if p.numel() == 1:
        return p.reshape(())
    d = channel_dim % x.dim()
    shape = [1] * x.dim()
    shape[d] = -1
    return p.reshape(shape)


def _per_channel(v: torch.Tensor, p: torch.Tensor, channel_dim: int) -> torch.Tensor:
    if p.numel() == 1:
        return v.sum().reshape(p.shape)
    return v.movedim(channel_dim, -1).reshape(-1, p.numel()).sum(0).reshape(p.shape)


def reference(x, p, grad, gate="phi", channel_dim=1, t=T, frozen=False):
    """fp64 (y, ∂x, ∂p, ℓ1 scale of ∂p) by autograd; p is s (learned) or λ (frozen)."""
    x64 = x.detach().cpu().double().requires_grad_()
    p64 = p.detach().cpu().double().requires_grad_()
    grad = grad.detach().cpu()
    lam = _bcast(p64 if frozen else 1.0 + F.softplus(p64 / t), x64, channel_dim)
    z = lam * x64
    # σ(z) = exp(−softplus(−z)): its autograd derivative σ(z)σ(−z) keeps relative accuracy for z ≫ 1,
    # where torch.sigmoid's σ(1 − σ) is 0 in float64 (threshold 700: exp(700) is finite).
    g = 0.5 * torch.special.erfc(-z / math.sqrt(2.0)) if gate == "phi" else torch.exp(-F.softplus(-z, threshold=700))
    y = x64 * g
    gx, gp = torch.autograd.grad(y, (x64, p64), grad.double())
    with torch.no_grad():  # |g·∂f/∂s| per element: x²·g'(z)·∂λ/∂s
        dg = torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi) if gate == "phi" else torch.sigmoid(z) * torch.sigmoid(-z)
        dlam = torch.ones_like(p64) if frozen else torch.sigmoid(p64 / t) / t
        scale = _per_channel((grad.double() * x64 * x64 * dg).abs(), p64, channel_dim) * dlam
    return y.detach(), gx, gp, scale


def assert_close(actual, expected, rtol, atol, what):
    actual = actual.double().cpu()
    expected = expected.double().cpu()
    assert actual.shape == expected.shape, what
    err = (actual - expected).abs()
    bound = atol + rtol * expected.abs()
    bad = ~(err <= bound)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} out of tolerance; the first at "
                           f"actual={actual[bad][0].item()!r} expected={expected[bad][0].item()!r}")


def assert_grad_s(actual, expected, scale, what):
    err = (actual.double().cpu() - expected.cpu()).abs()
    assert (err <= GRAD_S_RTOL * scale.cpu() + 1e-30).all(), f"{what}: {actual} vs {expected} (scale {scale})"


def run_s(x, s, grad, gate="phi", channel_dim=1, t=T):
    x = x.detach().requires_grad_()
    s = s.detach().requires_grad_()
    y = tg.gate_s(x, s, t, gate, channel_dim)
    y.backward(grad)
    return y.detach(), x.grad, s.grad


def run_frozen(x, lam, grad, gate="phi", channel_dim=1):
    x = x.detach().requires_grad_()
    y = tg.gate_frozen(x, lam, gate, channel_dim)
    y.backward(grad)
    return y.detach(), x.grad


def _data(shape, channels, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    s = torch.empty(channels).uniform_(-2.0, 2.0, generator=gen)  # λ ∈ [1.02, 5.0] at t = 0.5
    grad = torch.randn(shape, generator=gen).to(dtype)
    return x.to(DEVICE), s.to(DEVICE), grad.to(DEVICE)


# ---------------------------------------------------------------------------------------------
# Values and gradients


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("gate", ["phi", "sigmoid"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_learned_values_and_gradients(layout, gate, dtype):
    shape, channels, cd = LAYOUTS[layout]
    x, s, grad = _data(shape, channels, dtype)
    y, gx, gs = run_s(x, s, grad, gate, cd)
    ry, rgx, rgs, scale = reference(x, s, grad, gate, cd)
    rtol, atol = TOLS[dtype]
    assert y.dtype == dtype and gx.dtype == dtype and gs.dtype == s.dtype and gs.shape == s.shape
    assert_close(y, ry, rtol, atol, "y")
    assert_close(gx, rgx, rtol, atol, "∂x")
    assert_grad_s(gs, rgs, scale, "∂s")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("gate", ["phi", "sigmoid"])
@pytest.mark.parametrize("layout", ["layer", "channel_nchw", "channel_last"])
def test_frozen_values_and_gradient(layout, gate, dtype):
    shape, channels, cd = LAYOUTS[layout]
    x, _, grad = _data(shape, channels, dtype, seed=1)
    lam = torch.linspace(1.0, 7.5, channels, device=DEVICE)
    lam.requires_grad_()  # treated as a constant: no gradient flows to it
    y, gx = run_frozen(x, lam, grad, gate, cd)
    ry, rgx, _, _ = reference(x, lam, grad, gate, cd, frozen=True)
    rtol, atol = TOLS[dtype]
    assert_close(y, ry, rtol, atol, "y")
    assert_close(gx, rgx, rtol, atol, "∂x")
    assert lam.grad is None


def test_only_x_and_s_are_saved_and_one_node_per_layer():
    x, s, _ = _data((4, 3, 8), 3, torch.float32)
    x.requires_grad_()
    s.requires_grad_()
    y = tg.gate_s(x, s, T)
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 2 and saved[0] is x and saved[1] is s
    nexts = [type(f).__name__ for f, _ in y.grad_fn.next_functions if f is not None]
    assert nexts == ["AccumulateGrad", "AccumulateGrad"]  # no softplus/add/reshape nodes for λ


def test_grad_to_s_only_and_x_only():
    x, s, grad = _data((5, 4), 4, torch.float32)
    _, rgx, rgs, scale = reference(x, s, grad)
    y = tg.gate_s(x, s.requires_grad_(), T)  # x needs no gradient
    y.backward(grad)
    assert_grad_s(s.grad, rgs, scale, "∂s without ∂x")
    xr = x.clone().requires_grad_()
    tg.gate_s(xr, s.detach(), T).backward(grad)
    assert_close(xr.grad, rgx, F32_RTOL, F32_ATOL, "∂x without ∂s")


def test_channels_last_memory_format_and_non_contiguous_input():
    x, s, grad = _data((2, 3, 4, 5), 3, torch.float32)
    xcl = x.to(memory_format=torch.channels_last)
    y, gx, gs = run_s(xcl, s, grad.to(memory_format=torch.channels_last))
    ry, rgx, rgs, scale = reference(x, s, grad)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert_close(y, ry, F32_RTOL, F32_ATOL, "y channels_last")
    assert_close(gx, rgx, F32_RTOL, F32_ATOL, "∂x channels_last")
    assert_grad_s(gs, rgs, scale, "∂s channels_last")
    xt = x.transpose(2, 3)  # non-contiguous: copied
    y, gx, gs = run_s(xt, s, grad.transpose(2, 3))
    ry, rgx, rgs, scale = reference(xt, s, grad.transpose(2, 3))
    assert_close(y, ry, F32_RTOL, F32_ATOL, "y transposed")
    assert_close(gx, rgx, F32_RTOL, F32_ATOL, "∂x transposed")
    assert_grad_s(gs, rgs, scale, "∂s transposed")


@pytest.mark.parametrize("layout", ["layer", "channel_nchw", "channel_last"])
def test_multi_tile_reduction_loop(monkeypatch, layout):
    """Small tiles and no parallelism target force several tiles per backward program (the `iters` loop)."""
    monkeypatch.setattr(tg, "BLOCK", 4)
    monkeypatch.setattr(tg, "MAX_BN_COL", 2)
    monkeypatch.setattr(tg, "PART_STEP", 4)
    monkeypatch.setattr(tg, "TARGET_PROGRAMS", 1)
    monkeypatch.setattr(tg, "MAX_ITERS", 3)
    tg.clear_plans()  # plans made with the default tiles must not serve these shapes
    monkeypatch.setattr(tg, "_PLANS", {})
    shape = {"layer": (5, 7, 3), "channel_nchw": (3, 5, 4, 7), "channel_last": (13, 7, 6)}[layout]
    cd = -1 if layout == "channel_last" else 1
    channels = 1 if layout == "layer" else shape[cd]
    x, s, grad = _data(shape, channels, torch.float32, seed=3)
    y, gx, gs = run_s(x, s, grad, "phi", cd)
    ry, rgx, rgs, scale = reference(x, s, grad, "phi", cd)
    assert_close(y, ry, F32_RTOL, F32_ATOL, "y")
    assert_close(gx, rgx, F32_RTOL, F32_ATOL, "∂x")
    assert_grad_s(gs, rgs, scale, "∂s")
    (plan,) = tg._PLANS.values()
    assert plan.iters > 1 and plan.CH > plan.pr  # several tiles per program, several steps of the last program's sum


def test_empty_input():
    x = torch.empty(0, 4, device=DEVICE, requires_grad=True)
    s = torch.zeros(4, device=DEVICE, requires_grad=True)
    y = tg.gate_s(x, s, T)
    y.sum().backward()
    assert y.shape == (0, 4) and x.grad.shape == (0, 4) and torch.equal(s.grad, torch.zeros_like(s))


# ---------------------------------------------------------------------------------------------
# Numerics at the edges

EDGE_X = [-math.inf, -1e4, -30.0, -1.0, -1e-4, 0.0, 1e-4, 1.0, 30.0, 1e4, math.inf]


@pytest.mark.parametrize("gate", ["phi", "sigmoid"])
@pytest.mark.parametrize("mode", ["s/t=-1e3", "s/t=0.3", "s/t=+1e3", "lam=1", "lam=1e4"])
def test_extremes(gate, mode):
    """One channel per element ([1, C], channels last), so ∂s is per element: its value at x = ±inf is 0."""
    x = torch.tensor([EDGE_X], device=DEVICE)
    grad = torch.ones_like(x)
    n = x.shape[1]
    kind, val = mode.split("=")
    fin = torch.isfinite(x[0])
    if kind == "s/t":
        s = torch.full((n,), float(val) * T, device=DEVICE)
        y, gx, gs = run_s(x, s, grad, gate, -1)
        ry, rgx, rgs, scale = reference(x[:, fin], s[fin], grad[:, fin], gate, -1)
        assert torch.isfinite(gs).all()
        assert (gs[~fin] == 0).all()  # ∂f/∂s at x = ±inf
        assert_grad_s(gs[fin], rgs, scale, "∂s")
    else:
        lam = torch.full((n,), float(val), device=DEVICE)
        y, gx = run_frozen(x, lam, grad, gate, -1)
        ry, rgx, _, _ = reference(x[:, fin], lam[fin], grad[:, fin], gate, -1, frozen=True)
    y, gx, fin = y.cpu()[0], gx.cpu()[0], fin.cpu()
    assert y[0] == 0 and y[-1] == math.inf  # f(−∞) = 0, f(+∞) = +∞
    assert gx[0] == 0 and gx[-1] == 1  # f'(−∞) = 0, f'(+∞) = 1
    assert torch.isfinite(gx).all() and not torch.isnan(y).any()
    assert_close(y[fin], ry[0], F32_RTOL, F32_ATOL, "y")
    assert_close(gx[fin], rgx[0], F32_RTOL, F32_ATOL, "∂x")


def test_lambda_limits_from_s():
    """s/t = −1e3 gives λ = 1 exactly and ∂s = 0; s/t = 1e3 gives λ = 1001 and ∂λ/∂s = 1/t."""
    x = torch.linspace(-3, 3, 13, device=DEVICE)
    grad = torch.ones_like(x)
    y, _, gs = run_s(x, torch.tensor([-1e3 * T], device=DEVICE), grad)
    y1, _ = run_frozen(x, torch.tensor([1.0], device=DEVICE), grad)
    assert torch.equal(y, y1) and gs.item() == 0.0
    y, _, gs = run_s(x, torch.tensor([1e3 * T], device=DEVICE), grad)
    y1, _ = run_frozen(x, torch.tensor([1001.0], device=DEVICE), grad)
    assert torch.equal(y, y1) and math.isfinite(gs.item())


def test_nan_propagates():
    x = torch.tensor([float("nan"), 1.0, -1.0], device=DEVICE)
    y, gx, gs = run_s(x, torch.tensor([0.3], device=DEVICE), torch.ones_like(x))
    assert torch.isnan(y[0]) and torch.isnan(gx[0]) and torch.isnan(gs).all()
    assert torch.isfinite(y[1:]).all() and torch.isfinite(gx[1:]).all()


@pytest.mark.parametrize("gate,z_min", [("phi", -30.0), ("sigmoid", -100.0)])
@pytest.mark.parametrize("lam_mode", ["frozen 1", "frozen 3.7", "s/t=-1e3", "s/t=0.8"])
def test_far_negative_tail_relative_error(gate, z_min, lam_mode):
    """y and ∂x for z ∈ [z_min, −5] keep float32 relative accuracy (no 1 + erf cancellation) wherever the
    result is a normal float; below that, the error is bounded by TAIL_RTOL·(smallest normal)."""
    z = torch.linspace(z_min, -5.0, 501, dtype=torch.float64)
    if lam_mode.startswith("frozen"):
        lam = torch.tensor([float(lam_mode.split()[1])])
        x = (z / lam).float().to(DEVICE)
        grad = torch.ones_like(x)
        y, gx = run_frozen(x, lam.to(DEVICE), grad, gate)
        ry, rgx, _, _ = reference(x, lam, grad, gate, frozen=True)
    else:
        s = torch.tensor([float(lam_mode.split("=")[1]) * T])
        lam = 1.0 + F.softplus(s.double() / T)
        x = (z / lam).float().to(DEVICE)
        grad = torch.ones_like(x)
        y, gx, _ = run_s(x, s.to(DEVICE), grad, gate)
        ry, rgx, _, _ = reference(x, s, grad, gate)
    for got, ref, what in ((y, ry, "y"), (gx, rgx, "∂x")):
        err = (got.double().cpu() - ref).abs() / ref.abs().clamp_min(FLT_TINY)
        assert err.max() <= TAIL_RTOL, f"{what}: max relative error {err.max():.3g} at z={z[err.argmax()]:.4g}"
        assert (ref.abs() >= FLT_TINY).sum() > 100  # the range holds many normal results


def test_result_does_not_depend_on_position():
    """The same x gives the same bits anywhere: block starts, across tile edges, in the last partial tile."""
    gen = torch.Generator().manual_seed(7)
    v = torch.tensor([-math.inf, -40.0, -13.0, -6.0, -0.75, -1e-3, 0.0, 2e-3, 0.9, 4.0, 50.0, math.inf,
                      -2.5, 1.5, -9.0, 11.0])
    k = v.numel()
    for shape, cd, offsets in [((3000,), 1, [0, 1016, 2040, 3000 - k]),  # layer: 1024-wide tiles
                               ((300, k), -1, [0, 255 * k, 299 * k])]:  # channels last: 256-row tiles
        x = torch.randn(shape, generator=gen).reshape(-1)
        for o in offsets:
            x[o:o + k] = v
        x = x.reshape(shape).to(DEVICE)
        s = torch.full((1 if len(shape) == 1 else k,), 0.4, device=DEVICE)
        for gate in ("phi", "sigmoid"):
            y, gx, _ = run_s(x, s, torch.ones_like(x), gate, cd)
            y, gx = y.reshape(-1).cpu(), gx.reshape(-1).cpu()
            for o in offsets[1:]:
                assert torch.equal(y[o:o + k], y[:k]), (shape, gate, o)
                assert torch.equal(gx[o:o + k], gx[:k]), (shape, gate, o)


@pytest.mark.parametrize("layout", ["layer", "channel_last"])
def test_grad_s_is_deterministic(layout):
    shape, cd = ((2100,), 1) if layout == "layer" else ((700, 8), -1)
    x, s, grad = _data(shape, 1 if layout == "layer" else 8, torch.float32, seed=5)
    first = run_s(x, s, grad, "phi", cd)[2]
    second = run_s(x, s, grad, "phi", cd)[2]
    assert torch.equal(first, second)


# ---------------------------------------------------------------------------------------------
# API


def test_supports_and_errors():
    x = torch.randn(4, 3, device=DEVICE)
    s = torch.zeros(3, device=DEVICE)
    assert tg.available() and tg.unavailable_reason() is None
    assert tg.supports(x, s) and tg.supports(x, s[:1]) and tg.supports(x.bfloat16(), s)
    assert tg.supports(x.t(), torch.zeros(4, device=DEVICE), channel_dim=-1)
    assert not tg.supports(x.double(), s)  # float64: the caller falls back
    assert not tg.supports(x, s.double())
    assert not tg.supports(x, torch.zeros(5, device=DEVICE))  # wrong channel count
    assert not tg.supports(x, s, channel_dim=3)
    assert not tg.supports(x.to(torch.int32), s)
    with pytest.raises(ValueError, match="float64|float32"):
        tg.gate_s(x.double(), s, T)
    with pytest.raises(ValueError, match="gate"):
        tg.gate_s(x, s, T, gate="relu")
    with pytest.raises(ValueError, match="temperature"):
        tg.gate_s(x, s, 0.0)


# ---------------------------------------------------------------------------------------------
# Property test


@settings(max_examples=20, deadline=None)
@given(xs=st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=40),
       s_over_t=st.floats(-1e3, 1e3, width=32), t=st.sampled_from([0.25, 1.0, 4.0]))
def test_property_phi_matches_reference(xs, s_over_t, t):
    x = torch.tensor(xs, dtype=torch.float32, device=DEVICE)
    s = torch.tensor([s_over_t * t], dtype=torch.float32, device=DEVICE)
    grad = torch.ones_like(x)
    y, gx, gs = run_s(x, s, grad, "phi", 1, t)
    ry, rgx, rgs, scale = reference(x, s, grad, "phi", 1, t)
    assert_close(y, ry, F32_RTOL, F32_ATOL, "y")
    assert_close(gx, rgx, F32_RTOL, F32_ATOL, "∂x")
    assert_grad_s(gs, rgs, scale, "∂s")


# ---------------------------------------------------------------------------------------------
# Launch plans


def test_plans_are_kept_per_layout_and_reused():
    """One plan per (shape, strides, dtype, device, λ size, channel dim); a second call of a layout reuses it, and a
    transposed view of the same shape (other strides) gets its own."""
    tg.clear_plans()
    x, s, grad = _data((6, 5), 5, torch.float32, seed=11)
    first = run_s(x, s, grad)
    assert len(tg._PLANS) == 1
    (plan,) = tg._PLANS.values()
    again = run_s(x.clone(), s, grad)
    assert len(tg._PLANS) == 1 and next(iter(tg._PLANS.values())) is plan
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    run_s(x.double().float(), s, grad)  # another tensor of the same layout: the same plan
    assert len(tg._PLANS) == 1
    xt = torch.randn(5, 6, device=DEVICE).t()  # shape (6, 5), strides (1, 6)
    run_s(xt, s, grad)
    assert len(tg._PLANS) == 2
    run_s(x.bfloat16(), s, grad.bfloat16())
    run_frozen(x, torch.full((5,), 2.0, device=DEVICE), grad)
    assert len(tg._PLANS) == 3  # bf16 is a new plan; the frozen λ has s's layout and shares it
    if DEVICE == "cuda":  # compiled: each kernel variant's runner is kept after its first (compiling) launch
        assert plan.runners and all(callable(r) for r in plan.runners.values())


def test_unsupported_layouts_are_remembered_and_fall_back():
    x = torch.randn(4, 3, device=DEVICE).double()
    assert tg.try_gate_s(x, torch.zeros(3, device=DEVICE), T, 0, 1) is None
    assert isinstance(tg._PLANS[tg._key(x, torch.zeros(3, device=DEVICE), 1)], str)


@pytest.mark.parametrize("layout", ["layer", "channel_nc", "channel_last"])
def test_training_entry_points_match_the_checked_ones(layout):
    """`try_gate_s` / `try_gate_frozen` (what the gate modules call on CUDA) give the bits of `gate_s` / `gate_frozen`."""
    shape, channels, cd = LAYOUTS[layout]
    x, s, grad = _data(shape, channels, torch.float32, seed=12)
    want = run_s(x, s, grad, "phi", cd)
    xr, sr = x.detach().requires_grad_(), s.detach().requires_grad_()
    y = tg.try_gate_s(xr, sr, T, tg.GATES["phi"], cd)
    y.backward(grad)
    for a, b in zip((y.detach(), xr.grad, sr.grad), want):
        assert torch.equal(a, b)
    lam = torch.linspace(1.5, 4.0, channels, device=DEVICE)
    want = run_frozen(x, lam, grad, "sigmoid", cd)
    xr = x.detach().requires_grad_()
    y = tg.try_gate_frozen(xr, lam, tg.GATES["sigmoid"], cd)
    y.backward(grad)
    assert torch.equal(y.detach(), want[0]) and torch.equal(xr.grad, want[1])


# ---------------------------------------------------------------------------------------------
# The registry's gate modules


@pytest.mark.parametrize("gate_name", ["lambda_gelu", "lambda_swish"])
@pytest.mark.parametrize("granularity", ["layer", "channel"])
def test_gate_modules_run_through_the_triton_backend_of_the_registry(gate_name, granularity):
    """The pipeline's own gate modules on the `triton` kernel choice: learned (λ from s inside the kernel) and
    frozen (the annealing buffer), [N, C] and token [B, T, C] inputs, against the gate's autograd expression."""
    from pipeline import kernels
    from pipeline.activations import ACTIVATIONS, GateContext
    from pipeline.config import GateConfig

    gen = torch.Generator().manual_seed(3)
    for shape in ((6, 8), (2, 5, 8)):
        gate = ACTIVATIONS[gate_name].build(GateContext(8, 0, 1, GateConfig(granularity=granularity), {})).to(DEVICE)
        with torch.no_grad():
            gate.s.add_(torch.randn(gate.s.shape, generator=gen).to(DEVICE))
        for frozen in (False, True):
            if frozen:
                gate.freeze(gate.lam.detach() * 3)
            x = (torch.randn(shape, generator=gen) * 2).to(DEVICE).requires_grad_()
            with kernels.use_kernel("triton"):
                assert kernels.backend_for(x, gate._lam_for(x))[0] == "triton"
                y = gate(x)
            ref = gate.expression(x, gate._lam_for(x))
            torch.testing.assert_close(y, ref, rtol=F32_RTOL, atol=1e-6)
            g = torch.randn(shape, generator=gen).to(DEVICE)
            got = torch.autograd.grad(y, [x] + ([] if frozen else [gate.s]), g)
            want = torch.autograd.grad(ref, [x] + ([] if frozen else [gate.s]), g)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
