"""λ-GELU module: values and both gradients against a float64 reference, properties, registry."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pipeline.activations import (
    ACTIVATIONS, GateContext, LambdaGELU, hardenable_gates, lambda_from_s, lambda_gelu,
    lambda_gelu_reference, s_from_lambda,
)
from pipeline.config import GateConfig

VALUE_ATOL = 1e-6  # float32 λ-GELU vs float64 reference, |x| ≤ 8
GRAD_ATOL = 2e-5  # float32 gradients vs float64 autograd of the reference
SUP_GAP = 0.16998  # sup_x |ReLU(x) − xΦ(λx)| ≤ c/λ with c = 0.1699712...; 0.16998 > c
EXTREME = 1e4


def _gate(granularity="layer", channels=6, t=0.1, init="uniform", index=0, count=1, lam=1.05):
    cfg = GateConfig(granularity=granularity, temperature=t, init=init, init_lambda=lam)
    return ACTIVATIONS["lambda_gelu"].build(GateContext(channels, index, count, cfg, {}))


@pytest.mark.parametrize("granularity,shape", [("layer", (64, 6)), ("channel", (64, 6)), ("channel", (8, 6, 5, 5)), ("global", (8, 6, 5, 5))])
def test_forward_and_grads_match_float64_reference(granularity, shape):
    torch.manual_seed(0)
    gate = _gate(granularity)
    with torch.no_grad():
        gate.s.add_(torch.randn_like(gate.s) * 0.3)  # distinct λ per channel
    x = (torch.randn(shape) * 3).requires_grad_()
    y = gate(x)
    g = torch.randn_like(y)
    gx, gs = torch.autograd.grad(y, (x, gate.s), g)

    x64 = x.detach().double().requires_grad_()
    s64 = gate.s.detach().double().requires_grad_()
    lam = lambda_from_s(s64, gate.temperature)
    lam_b = lam.reshape(()) if lam.numel() == 1 else lam.view(1, -1, *([1] * (x.dim() - 2)))
    y64 = lambda_gelu_reference(x64, lam_b)
    gx64, gs64 = torch.autograd.grad(y64, (x64, s64), g.double())

    torch.testing.assert_close(y.double(), y64, atol=VALUE_ATOL, rtol=1e-6)
    torch.testing.assert_close(gx.double(), gx64, atol=GRAD_ATOL, rtol=1e-5)
    # grad_s sums over many elements: relative tolerance on the sum.
    torch.testing.assert_close(gs.double(), gs64, atol=GRAD_ATOL * x.numel() ** 0.5, rtol=1e-4)


def test_gradcheck_float64_through_softplus():
    gate = _gate("channel", channels=3).double()
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, s: lambda_gelu(x, lambda_from_s(s, 0.1)), (x, gate.s), eps=1e-6, atol=1e-6)


@given(s=st.floats(-1e3, 1e3), t=st.floats(1e-3, 10))
def test_lambda_at_least_one_for_all_s_t(s, t):
    lam = lambda_from_s(torch.tensor([s], dtype=torch.float64), t)
    assert torch.isfinite(lam).all() and float(lam) >= 1.0


@settings(max_examples=200)
@given(x=st.floats(-50, 50), lam=st.floats(1.0, 1e4))
def test_sup_gap_to_relu(x, lam):
    xt = torch.tensor(x, dtype=torch.float64)
    assert abs(float(torch.relu(xt) - lambda_gelu(xt, lam))) <= SUP_GAP / lam


@settings(max_examples=100)
@given(lam=st.floats(1.0, EXTREME), scale=st.floats(1e-3, EXTREME), s_over_t=st.floats(-1e3, 1e3))
def test_finite_values_and_grads_at_extremes(lam, scale, s_over_t):
    x = (torch.linspace(-1, 1, 257) * scale).requires_grad_()
    lam_t = torch.tensor(lam, requires_grad=True)
    y = lambda_gelu(x, lam_t)
    gx, gl = torch.autograd.grad(y.sum(), (x, lam_t))
    assert torch.isfinite(y).all() and torch.isfinite(gx).all() and torch.isfinite(gl).all()
    s = torch.tensor([s_over_t * 0.1], requires_grad=True)
    lam_s = lambda_from_s(s, 0.1)
    (gs,) = torch.autograd.grad(lambda_gelu(x.detach(), lam_s.reshape(())).sum(), s)
    assert torch.isfinite(lam_s).all() and torch.isfinite(gs).all()


@given(lam=st.floats(1.0 + 1e-6, 500.0), t=st.floats(0.05, 2.0))
def test_s_from_lambda_inverts(lam, t):
    assert math.isclose(float(lambda_from_s(torch.tensor(s_from_lambda(lam, t), dtype=torch.float64), t)), lam, rel_tol=1e-9)


@pytest.mark.parametrize("mode,expected", [("uniform", [1.05, 1.05, 1.05]), ("increasing", [1.05, 1.525, 2.0]), ("decreasing", [2.0, 1.525, 1.05])])
def test_init_modes(mode, expected):
    cfg = GateConfig(init=mode, init_lambda=1.05, init_lambda_max=2.0)
    lams = [float(ACTIVATIONS["lambda_gelu"].build(GateContext(4, i, 3, cfg, {})).lam.detach()) for i in range(3)]
    assert lams == pytest.approx(expected, abs=1e-6)


def test_global_granularity_shares_one_parameter():
    cfg = GateConfig(granularity="global")
    shared: dict = {}
    gates = [ACTIVATIONS["lambda_gelu"].build(GateContext(4, i, 3, cfg, shared)) for i in range(3)]
    assert gates[0].s is gates[1].s is gates[2].s
    assert sum(1 for _ in nn.ModuleList(gates).parameters()) == 1


def test_freeze_overrides_lambda_and_stops_s_gradient():
    gate = _gate()
    gate.freeze(torch.tensor([42.0]))
    assert float(gate.lam) == 42.0
    x = torch.randn(16, 6, requires_grad=True)
    gate(x).sum().backward()
    assert gate.s.grad is None
    torch.testing.assert_close(gate(x), lambda_gelu_reference(x, 42.0), atol=VALUE_ATOL, rtol=0)
    restored = _gate()
    restored.load_state_dict(gate.state_dict())  # frozen state travels in the checkpoint
    assert bool(restored.frozen) and float(restored.lam) == 42.0


def test_registry_entries_build_with_one_signature():
    ctx = GateContext(5, 0, 1, GateConfig(), {})
    for name, spec in ACTIVATIONS.items():
        m = spec.build(ctx)
        assert isinstance(m, nn.Module)
        assert bool(hardenable_gates(m)) == spec.hardenable, name  # a linked pair holds its gate inside
        assert m(torch.randn(3, 5)).shape == (3, 5 * spec.expansion)
    assert isinstance(_gate(), LambdaGELU)
