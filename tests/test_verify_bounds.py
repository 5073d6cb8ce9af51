"""Soundness of every bound, by dense sampling in float64 (one side at a time, auto_LiRPA's practice):
the smooth gates' linear relaxations (hypothesis over intervals, slopes and λ), the closed-form swap gap,
and IBP / CROWN / α-CROWN through every layer type (Linear, Conv, normalization, BatchNorm, ReLU, each gate,
per-channel λ, linked pairs), plus IBP against a per-neuron reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.verification.bounds import (SMOOTH_GATES, Bounder, Spec, default_slopes, gate_range, intercepts,
                                          slope_range, swap_gap, swap_gap_unit)
from analysis.verification.network import Linear, Network, ReLU, Scale, from_torch
from _modules import Affine
from pipeline.activations import GELU, SERF, LambdaGELU, LambdaSERF, LambdaSwish, Linked, SiLU

GATES = list(SMOOTH_GATES)
# sampled values vs bounds, float64 on both sides: rounding of F(y) − a·y at |y| ≤ 1e4
SAMPLE_TOL = 1e-9
# a relaxation's intercept vs the sampled extremum: the bound is exact up to the sampling grid
GRID_POINTS = 20001
# network bounds vs sampled activations (float64, summation order only)
NET_TOL = 1e-9

interval = st.tuples(st.floats(-60, 60), st.floats(0, 80)).map(lambda t: (t[0], t[0] + t[1]))


def _grid(L: float, U: float) -> torch.Tensor:
    return torch.linspace(L, U, GRID_POINTS, dtype=torch.float64)


@settings(max_examples=150, deadline=None)
@given(gate=st.sampled_from(GATES), box=interval, t=st.floats(-0.5, 1.5))
def test_any_slope_gives_sound_and_tight_lines(gate, box, t):
    """For any slope a, a·y + min and a·y + max of F(y) − a·y enclose F on [L, U] (sound), and touch it (tight)."""
    g = SMOOTH_GATES[gate]
    L, U = box
    lo_s, hi_s = slope_range(g, torch.tensor(L, dtype=torch.float64), torch.tensor(U, dtype=torch.float64))
    a = torch.tensor(float(lo_s + t * (hi_s - lo_s)), dtype=torch.float64)  # inside and outside the slope range
    lo, hi = intercepts(g, torch.tensor(L, dtype=torch.float64), torch.tensor(U, dtype=torch.float64), a)
    y = _grid(L, U)
    e = g.F(y) - a * y
    scale = 1 + float((g.F(y).abs() + (a * y).abs()).max())
    assert float(e.max()) <= float(hi) + SAMPLE_TOL * scale, "upper line below the function"
    assert float(e.min()) >= float(lo) - SAMPLE_TOL * scale, "lower line above the function"
    # tight: the grid comes within one grid step's change of e (|e'| ≤ |F'| + |a| ≤ 3) of each intercept
    step = (U - L) / (GRID_POINTS - 1)
    assert float(hi) - float(e.max()) <= 3 * step + 1e-9 * scale
    assert float(e.min()) - float(lo) <= 3 * step + 1e-9 * scale


@settings(max_examples=100, deadline=None)
@given(gate=st.sampled_from(GATES), box=interval, lam=st.floats(0.5, 300))
def test_default_relaxation_and_ibp_are_sound_in_x(gate, box, lam):
    """CROWN's lines (least-area slope) and the IBP range, mapped back to x = y/λ."""
    g = SMOOTH_GATES[gate]
    l, u = box[0] / lam, box[1] / lam
    lt, ut, lamt = (torch.tensor([v], dtype=torch.float64) for v in (l, u, lam))
    a_lo, a_up = default_slopes(g, lamt * lt, lamt * ut)
    b_lo, _ = intercepts(g, lamt * lt, lamt * ut, a_lo)
    _, b_up = intercepts(g, lamt * lt, lamt * ut, a_up)
    x = _grid(l, u)
    f = g.f(x, lam)
    tol = SAMPLE_TOL * (1 + float(f.abs().max()) + float(x.abs().max()))
    assert torch.all(f <= a_up * x + b_up / lam + tol)
    assert torch.all(f >= a_lo * x + b_lo / lam - tol)
    rlo, rhi = gate_range(g, lamt, lt, ut)
    assert float(f.min()) >= float(rlo) - tol and float(f.max()) <= float(rhi) + tol


@pytest.mark.parametrize("gate", GATES)
def test_each_gate_has_exactly_its_two_inflection_points(gate):
    """The exact-extremum search relies on F'' < 0, > 0, < 0 on three pieces: scan the sign of F''."""
    g = SMOOTH_GATES[gate]
    y = torch.linspace(-50, 50, 1_000_001, dtype=torch.float64)
    s = torch.sign(g.d2F_sign(y))
    changes = y[1:][(s[1:] != s[:-1]) & (s[1:] != 0)]
    assert changes.numel() == 2
    np.testing.assert_allclose(changes.numpy(), g.inflections, atol=2e-4)
    y1, y2 = g.inflections
    assert float(g.d2F_sign(torch.tensor(y1 - 1.0))) < 0 < float(g.d2F_sign(torch.tensor(0.5 * (y1 + y2))))
    assert float(g.d2F_sign(torch.tensor(y2 + 1.0))) < 0
    # and F' really is the derivative of F
    yy = torch.linspace(-8, 8, 1601, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(g.F(yy).sum(), yy)
    np.testing.assert_allclose(g.dF(yy.detach()).numpy(), grad.numpy(), rtol=0, atol=1e-12)


def test_gelu_gap_peaks_at_the_closed_form_point():
    """sup_z |ReLU(z) − z·Φ(λz)| = c/λ with c = max_u u·Φ(−u) ≈ 0.169971 at u ≈ 0.751792 (DESIGN.md)."""
    g = SMOOTH_GATES["phi"]
    assert g.peaks[0] == pytest.approx(0.751792, abs=1e-5) and g.peaks[1] == pytest.approx(0.751792, abs=1e-5)
    assert g.peak_values[0] == pytest.approx(0.169971, abs=1e-6)
    for lam in (1.0, 7.5, 160.0):
        b = swap_gap_unit(g, torch.tensor([lam]), torch.tensor([-5.0]), torch.tensor([5.0]))
        assert float(b) == pytest.approx(0.1699712 / lam, rel=1e-5)


@settings(max_examples=150, deadline=None)
@given(gate=st.sampled_from(GATES), box=st.tuples(st.floats(-3, 3), st.floats(0, 4)), lam=st.floats(0.5, 300))
def test_swap_gap_closed_form_is_the_sup(gate, box, lam):
    """The closed form (endpoint or peak t*/λ on each side) bounds |ReLU − f| on [l, u] and equals its max."""
    g = SMOOTH_GATES[gate]
    l, u = box[0], box[0] + box[1]
    z = _grid(l, u)
    z = torch.cat([z, torch.tensor([g.peaks[0] / lam, -g.peaks[1] / lam], dtype=torch.float64).clamp(l, u)])
    diff = (z.clamp(min=0) - g.f(z, lam)).abs()
    b = float(swap_gap_unit(g, torch.tensor([lam], dtype=torch.float64), torch.tensor([l], dtype=torch.float64),
                            torch.tensor([u], dtype=torch.float64)))
    # the direct difference cancels: one float64 ulp of |z| is its own rounding error
    assert float(diff.max()) <= b * (1 + 1e-9) + 4e-16 * (1 + max(abs(l), abs(u)))
    assert b - float(diff.max()) <= 1e-6 * b + 1e-12  # attained (the peaks are in the sample)


# ---------------------------------------------------------------------------------------------
# networks


def _lambda_gate(cls, lam: torch.Tensor) -> nn.Module:
    gate = cls(nn.Parameter(torch.zeros(lam.numel())), 0.1)
    gate.freeze(lam)
    return gate


def _act(kind: str, channels: int, per_channel: bool) -> nn.Module:
    lam = torch.linspace(1.5, 40.0, channels) if per_channel else torch.tensor([12.0])
    return {"relu": lambda: nn.ReLU(), "gelu": lambda: GELU(), "silu": lambda: SiLU(), "serf": lambda: SERF(),
            "lambda_gelu": lambda: _lambda_gate(LambdaGELU, lam), "lambda_swish": lambda: _lambda_gate(LambdaSwish, lam),
            "lambda_serf": lambda: _lambda_gate(LambdaSERF, lam), "nn.gelu": lambda: nn.GELU()}[kind]()


ACTS = ["relu", "gelu", "silu", "serf", "lambda_gelu", "lambda_swish", "lambda_serf", "nn.gelu"]


def mlp(kind: str, seed: int, per_channel: bool = False, linked: bool = False) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(seed)
    shape = (6,)
    act = (lambda c: Linked(_act(kind, c, per_channel))) if linked else (lambda c: _act(kind, c, per_channel))
    w = 2 if linked else 1
    model = nn.Sequential(Affine(torch.linspace(-2, 2, 6), torch.linspace(0.3, -0.3, 6)), nn.Linear(6, 12), act(12),
                          nn.Linear(12 * w, 10), nn.BatchNorm1d(10), act(10), nn.Linear(10 * w, 4)).eval()
    with torch.no_grad():
        bn = model[4]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(-1.5, 1.5)
        bn.bias.uniform_(-0.3, 0.3)
    return model, shape


def cnn(kind: str, seed: int, per_channel: bool = True, linked: bool = False) -> tuple[nn.Module, tuple[int, ...]]:
    torch.manual_seed(seed)
    shape = (2, 7, 6)
    act = (lambda c: Linked(_act(kind, c, per_channel))) if linked else (lambda c: _act(kind, c, per_channel))
    w = 2 if linked else 1
    model = nn.Sequential(Affine(torch.tensor([1.5, -0.5]).reshape(2, 1, 1), torch.tensor([0.2, 0.1]).reshape(2, 1, 1)),
                          nn.Conv2d(2, 4, 3, stride=1, padding=1), nn.BatchNorm2d(4), act(4),
                          nn.Conv2d(4 * w, 4, 3, stride=2, padding=1, dilation=1), act(4),
                          nn.Conv2d(4 * w, 4, 2, stride=1, padding=0, dilation=2, groups=2), act(4),
                          nn.Flatten(), nn.Linear(4 * w * 2 * 1, 3)).eval()
    with torch.no_grad():
        bn = model[2]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return model, shape


def _check_network(model: nn.Module, shape: tuple[int, ...], radius: float, seed: int, samples: int = 3000,
                   alpha_steps: int = 10) -> None:
    net = from_torch(model, shape)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.rand(int(np.prod(shape)), generator=gen, dtype=torch.float64)
    lb, ub = x0 - radius, x0 + radius
    # the reader computes what torch computes
    xs = lb + (ub - lb) * torch.rand(samples, x0.numel(), generator=gen, dtype=torch.float64)
    corners = torch.where(torch.rand(samples // 6, x0.numel(), generator=gen) < 0.5, lb, ub)
    xs = torch.cat([xs, corners])
    with torch.no_grad():
        ref = model.double()(xs.reshape(-1, *shape))
    np.testing.assert_allclose(net.forward(xs).numpy(), ref.numpy(), rtol=0, atol=1e-10)
    b = Bounder(net, lb, ub)
    stages = {"ibp": [(l.clone(), u.clone()) for l, u in b.pre]}
    b.crown()
    stages["crown"] = list(b.pre)
    b.alpha_intermediate(steps=alpha_steps)
    stages["alpha"] = list(b.pre)
    C = torch.randn(5, net.num_outputs, generator=gen, dtype=torch.float64)
    spec = Spec(C, torch.zeros(5))
    spec_lo = {"crown": b.spec_bounds(spec), "alpha": b.alpha_spec(spec, list(range(5)), steps=alpha_steps)}
    h = xs
    s = 0
    for k, layer in enumerate(b.net.layers):
        if k in b.site_of:
            for name, pre in stages.items():
                l, u = pre[s]
                assert float((l - h).max()) <= NET_TOL, f"{name} lower bound of site {s} violated by {float((l - h).max()):.3g}"
                assert float((h - u).max()) <= NET_TOL, f"{name} upper bound of site {s} violated by {float((h - u).max()):.3g}"
            # tighter than IBP (or equal)
            assert torch.all(stages["alpha"][s][0] >= stages["ibp"][s][0] - NET_TOL)
            assert torch.all(stages["alpha"][s][1] <= stages["ibp"][s][1] + NET_TOL)
            s += 1
        h = layer.forward(h)
    y = h @ C.T
    for name, lo in spec_lo.items():
        assert float((lo - y).max()) <= NET_TOL, f"{name} spec bound violated by {float((lo - y).max()):.3g}"
    out_lo, out_hi = b.ibp_out
    assert torch.all(h >= out_lo - NET_TOL) and torch.all(h <= out_hi + NET_TOL)


@pytest.mark.parametrize("kind", ACTS)
def test_mlp_bounds_are_sound(kind):
    """Normalization (negative scales), Linear, BatchNorm1d, and the activation, one λ per layer."""
    model, shape = mlp(kind, seed=1)
    _check_network(model, shape, radius=0.3, seed=1)


@pytest.mark.parametrize("kind", ["relu", "lambda_gelu", "lambda_swish", "lambda_serf"])
def test_per_channel_lambda_and_linked_pairs_are_sound(kind):
    model, shape = mlp(kind, seed=2, per_channel=True, linked=True)
    _check_network(model, shape, radius=0.2, seed=2)


@pytest.mark.parametrize("kind", ["relu", "lambda_gelu", pytest.param("gelu", marks=pytest.mark.slow),
                                  pytest.param("lambda_serf", marks=pytest.mark.slow)])
def test_conv_bounds_are_sound(kind):
    """Conv2d with padding, stride, dilation and groups; BatchNorm2d folded into the conv; per-channel λ."""
    model, shape = cnn(kind, seed=3, linked=kind == "relu")
    _check_network(model, shape, radius=0.15, seed=3, samples=1200, alpha_steps=4)  # float64 conv on CPU is slow


def test_conv_back_substitution_is_the_matrix_transpose():
    model, shape = cnn("relu", seed=4)
    net = from_torch(model, shape).merged()
    from analysis.verification.network import Conv

    for conv in [layer for layer in net.layers if isinstance(layer, Conv)]:
        M, c = conv.sparse()
        M = torch.as_tensor(M.toarray())
        x = torch.randn(7, conv.in_size, dtype=torch.float64)
        np.testing.assert_allclose(conv.forward(x).numpy(), (x @ M.T + torch.as_tensor(c)).numpy(), atol=1e-12)
        A = torch.randn(5, conv.out_size, dtype=torch.float64)
        back, bias = conv.back(A)
        np.testing.assert_allclose(back.numpy(), (A @ M).numpy(), atol=1e-12)
        np.testing.assert_allclose(bias.numpy(), (A @ torch.as_tensor(c)).numpy(), atol=1e-12)


def _reference_ibp(layers, lb, ub):
    """Textbook interval arithmetic, one neuron and one weight at a time (Linear / Scale / ReLU)."""
    lo, hi = [float(v) for v in lb], [float(v) for v in ub]
    pre = []
    for layer in layers:
        if isinstance(layer, Linear):
            W, b = layer.W.tolist(), layer.b.tolist()
            nl, nh = [], []
            for i in range(len(W)):
                a = c = b[i]
                for j, w in enumerate(W[i]):
                    a += w * lo[j] if w >= 0 else w * hi[j]
                    c += w * hi[j] if w >= 0 else w * lo[j]
                nl.append(a)
                nh.append(c)
            lo, hi = nl, nh
        elif isinstance(layer, Scale):
            pairs = [sorted((lo[i] * s + t, hi[i] * s + t)) for i, (s, t) in enumerate(zip(layer.scale.tolist(), layer.shift.tolist()))]
            lo, hi = [p[0] for p in pairs], [p[1] for p in pairs]
        else:
            pre.append((lo, hi))
            lo, hi = [max(v, 0.0) for v in lo], [max(v, 0.0) for v in hi]
    return pre, (lo, hi)


@pytest.mark.parametrize("seed", range(6))
def test_ibp_matches_per_neuron_reference(seed):
    rng = np.random.default_rng(seed)
    widths = [int(rng.integers(2, 7))] + [int(rng.integers(3, 12)) for _ in range(int(rng.integers(1, 4)))] + [3]
    layers = [Scale(rng.uniform(-2, 2, widths[0]), rng.normal(0, 0.5, widths[0]))]
    for k in range(len(widths) - 1):
        layers.append(Linear(rng.normal(0, 1 / np.sqrt(widths[k]), (widths[k + 1], widths[k])), rng.normal(0, 0.3, widths[k + 1])))
        if k < len(widths) - 2:
            layers.append(ReLU(widths[k + 1]))
    net = Network((widths[0],), layers)
    c = rng.uniform(-1, 1, widths[0])
    lb, ub = c - 0.3, c + 0.3
    b = Bounder(Network(net.input_shape, net.layers), lb, ub)  # merged inside: compare on the merged layers
    ref_pre, ref_out = _reference_ibp(b.net.layers, lb, ub)
    for (l, u), (rl, ru) in zip(b.ibp_pre, ref_pre):
        np.testing.assert_allclose(l.numpy(), rl, atol=1e-10)
        np.testing.assert_allclose(u.numpy(), ru, atol=1e-10)
    np.testing.assert_allclose(b.ibp_out[0].numpy(), ref_out[0], atol=1e-10)


def test_swap_gap_bounds_the_smooth_relu_difference_by_sampling():
    """|smooth(x) − relu(x)| ≤ swap_gap on the box, per output, for λ-GELU at a small and a large λ."""
    for lam, seed in ((3.0, 0), (150.0, 1)):
        model, shape = mlp("lambda_gelu", seed=seed, per_channel=True)
        for g in model.modules():
            if isinstance(g, LambdaGELU):
                g.freeze(torch.full_like(g.lam_fixed, lam))
        smooth = from_torch(model, shape)
        relu = smooth.relu_version()
        gen = torch.Generator().manual_seed(seed)
        x0 = torch.rand(6, generator=gen, dtype=torch.float64)
        lb, ub = x0 - 0.2, x0 + 0.2
        b = Bounder(relu, lb, ub)
        b.crown()
        gap = swap_gap(smooth, b.pre)
        xs = lb + (ub - lb) * torch.rand(20000, 6, generator=gen, dtype=torch.float64)
        diff = (smooth.forward(xs) - relu.forward(xs)).abs().max(0).values
        assert torch.all(diff <= gap + 1e-12), (diff, gap)
        assert float(gap.max()) < (1.0 if lam > 100 else math.inf)
