"""CROWN's fast paths on the CPU. Float32 convolutions (`Conv.back32`, `Bounder._float32_back`) and the ReLU sites'
float32 screen (`Bounder._relu_rows`): the float32 coefficients within the rounding bound the bound adds, the bound
sound at sampled points however A cancels, and a CROWN pass through the screen giving the float64 pass's spec bounds
and unstable units (SAME_TOL), every interval sound; the gates' float32 sites (FLOAT32_GATES) sound and within
F32_TOL. Float64: a Conv's back-substitution by its matrix, by col2im and as 1×1 products equal to the transposed
convolution; the ReLU step on the crossing units only equal to the general one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import analysis.verification.float32 as float32_mod
from analysis.verification.bounds import Bounder, Spec
from analysis.verification.graph import Graph, Node
from analysis.verification.ops.affine import Conv
from analysis.verification.ops.base import Activation
from analysis.verification.ops.relu import ReLU
from analysis.verification.readers import from_torch
from pipeline.numerics import UNDERFLOW, dot_error
from test_verify_bounds import NET_TOL, _random_dag, _samples, cnn

# the screened pass against float64's: spec bounds and the unstable units' intervals, relative to 1 + |value|. Not
# float64's 1e-12: a unit the float32 pass proves stable keeps float32's (wider) interval, and interval arithmetic over
# it is the reference a later unit's CROWN bound is intersected with; where that reference is the binding side, the
# later interval is looser by float32's rounding carried through it (3e-7 on one interval, 1.3e-9 on the spec rows,
# of the cases below; 0 on the trained [16,32] preact ResNet, benchmarks/peers/crown-preact1632)
SAME_TOL = 1e-6
# the gates' sites in float32: their rounding error reaches every later bound (≈ γ_n ≈ 1e-5 relative per conv)
F32_TOL = 1e-3

CONVS = [  # (in_shape, out_channels, kernel, stride, padding, dilation, groups)
    ((8, 6, 6), 16, 3, 1, 1, 1, 1),
    ((8, 7, 7), 16, 3, 2, 1, 1, 1),
    ((8, 6, 6), 16, 2, 1, 0, 2, 2),
    ((4, 5, 5), 12, 1, 1, 0, 1, 1),
]


def _conv(cfg, seed: int) -> Conv:
    shape, co, k, stride, pad, dil, groups = cfg
    gen = torch.Generator().manual_seed(seed)
    # float64 weights (a BatchNorm folded in): not float32 numbers, so back32 rounds them too
    w = torch.randn(co, shape[0] // groups, k, k, generator=gen, dtype=torch.float64) * 0.7
    b = torch.randn(co, generator=gen, dtype=torch.float64) * 0.2
    return Conv(w, b, shape, (stride, stride), (pad, pad), (dil, dil), groups)


def _cancelling_rows(n_out: int, seed: int) -> torch.Tensor:
    """Rows with large entries of both signs (far beyond their sums), as deep back-substitution makes them."""
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(12, n_out, generator=gen, dtype=torch.float64) * 1e3
    A[:4] = torch.randn(4, n_out, generator=gen, dtype=torch.float64)
    A[4:6] *= 1e-30  # tiny coefficients
    return A


@pytest.mark.parametrize("cfg", CONVS)
def test_back32_coefficients_are_within_the_rounding_bound(cfg):
    conv = _conv(cfg, 0)
    A = _cancelling_rows(conv.out_size, 1)
    exact = conv.back(A)[0][0]
    got, A32 = conv.back32(A)
    assert got.dtype == torch.float64 and A32.dtype == torch.float32
    n = conv.back_terms
    # |A|·|M| through the transposed convolution with |W|
    absconv = Conv(conv.weight.abs(), torch.zeros_like(conv.bias), conv.in_shape, conv.stride, conv.padding,
                   conv.dilation, conv.groups)
    magnitude = absconv.back(A.abs())[0][0]
    allowed = dot_error(n + 2, magnitude) + 2 * n * float(conv.weight.abs().max()) * UNDERFLOW
    assert torch.all((got - exact).abs() <= allowed)
    assert float((got - exact).abs().max()) > 0  # float32 did round: the test measures something


@pytest.mark.parametrize("cfg", CONVS)
def test_float32_back_bound_holds_at_sampled_points(cfg, monkeypatch):
    monkeypatch.setattr(float32_mod, "FLOAT32_MIN_TERMS", 1)
    conv = _conv(cfg, 2)
    net = Graph(conv.in_shape, [Node(conv, (0,))])
    gen = torch.Generator().manual_seed(3)
    x0 = torch.randn(net.num_inputs, generator=gen, dtype=torch.float64) * 2
    lb, ub = x0 - 0.05, x0 + 0.05
    b = Bounder(net, lb, ub)
    A = _cancelling_rows(conv.out_size, 4)
    fast = b._float32_back(1, A)
    assert fast is not None
    (Ai,), c = fast
    xs = _samples(lb, ub, 2000, gen)
    lhs = (conv.forward(xs) @ A.T)  # A·h at each point, float64
    rhs = xs @ Ai.T + c
    scale = 1 + (A.abs() @ conv.forward(xs).abs().T).T
    assert float(((rhs - lhs) / scale).max()) <= NET_TOL
    # and the bound is float32-close to the exact one, not vacuous
    exact = b.backward(A, 1)
    b32 = b.backward(A, 1, float32=True)
    assert torch.all(b32 <= exact + NET_TOL * (1 + exact.abs()))
    assert torch.all(exact - b32 <= 1e-3 * (1 + (A.abs() @ conv.forward(x0[None]).abs().T).reshape(-1)))


def test_float32_back_is_not_used_with_gradients_or_few_terms(monkeypatch):
    conv = _conv(CONVS[0], 5)
    net = Graph(conv.in_shape, [Node(conv, (0,))])
    x0 = torch.zeros(net.num_inputs, dtype=torch.float64)
    b = Bounder(net, x0 - 0.1, x0 + 0.1)
    A = torch.randn(3, conv.out_size, dtype=torch.float64)
    assert b._float32_back(1, A) is not None  # 16·9 = 144 terms ≥ FLOAT32_MIN_TERMS
    assert b._float32_back(1, A.clone().requires_grad_(True)) is None
    monkeypatch.setattr(float32_mod, "FLOAT32_MIN_TERMS", 10_000)
    assert b._float32_back(1, A) is None


@pytest.mark.parametrize("co,groups,float32", [(4, 1, False), (8, 2, True), (8, 8, True)])
def test_float32_back_takes_grouped_convs_whatever_their_terms(co, groups, float32):
    # 3×3 convs of 8 input channels summing 36 terms (plain, 4 outputs; grouped, 4 channels a group) or 9 (depthwise),
    # all under FLOAT32_MIN_TERMS: a grouped conv's float64 route costs more than float32's (benchmarks.crown_time
    # grouped), a plain one's does not
    conv = _conv(((8, 6, 6), co, 3, 1, 1, 1, groups), 6)
    assert conv.back_terms < float32_mod.FLOAT32_MIN_TERMS
    net = Graph(conv.in_shape, [Node(conv, (0,))])
    x0 = torch.zeros(net.num_inputs, dtype=torch.float64)
    b = Bounder(net, x0 - 0.1, x0 + 0.1)
    A = torch.randn(3, conv.out_size, dtype=torch.float64)
    assert (b._float32_back(1, A) is not None) == float32


def _preact(seed: int) -> tuple[torch.nn.Module, tuple[int, ...]]:
    import dataclasses

    from pipeline.config import GateConfig, ModelConfig
    from pipeline.models import build_model

    spec = {"model": dataclasses.asdict(ModelConfig(name="preact_resnet", channels=[4, 8])), "activation": "relu",
            "gate": dataclasses.asdict(GateConfig()), "input_shape": [1, 8, 8], "num_classes": 10, "mean": [0.5],
            "std": [0.25]}
    torch.manual_seed(seed)
    model = build_model(spec).eval()
    with torch.no_grad():  # BatchNorm statistics away from the identity, as trained ones are
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    return model, (1, 8, 8)


def _pass(net: Graph, lb, ub, spec: Spec, float32: bool, monkeypatch) -> tuple[Bounder, torch.Tensor]:
    monkeypatch.setattr(float32_mod, "FLOAT32_MIN_TERMS", 1 if float32 else 0)
    b = Bounder(net, lb, ub)
    b.crown()
    assert (b._f32_used > 0) == float32
    return b, b.spec_bounds(spec)


def _check_sound(b: Bounder, spec_lo: torch.Tensor, spec: Spec, xs: torch.Tensor) -> None:
    vals = b.net.values(xs)
    for s, j in enumerate(b.site_input):
        l, u = b.pre[s]
        assert float((l - vals[j]).max()) <= NET_TOL and float((vals[j] - u).max()) <= NET_TOL
    y = vals[b.net.output] @ spec.C.T + spec.d
    assert float((spec_lo - y).max()) <= NET_TOL


@pytest.mark.parametrize("model_fn,radius", [(_preact, 0.01), (_preact, 0.05), (lambda s: cnn("relu", s), 0.05)])
@pytest.mark.parametrize("seed", [0, 1])
def test_screened_crown_gives_float64_spec_bounds_and_unstable_units(model_fn, radius, seed, monkeypatch):
    model, shape = model_fn(seed)
    net = from_torch(model, shape)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.rand(net.num_inputs, generator=gen, dtype=torch.float64)
    lb, ub = x0 - radius, x0 + radius
    spec = Spec(torch.randn(6, net.num_outputs, generator=gen, dtype=torch.float64), torch.zeros(6))
    b64, s64 = _pass(net, lb, ub, spec, False, monkeypatch)
    b32, s32 = _pass(net, lb, ub, spec, True, monkeypatch)
    assert torch.all((s32 - s64).abs() <= SAME_TOL * (1 + s64.abs()))
    for s in range(len(b64.sites)):
        (l0, u0), (l1, u1) = b64.pre[s], b32.pre[s]
        cross0, cross1 = (l0 < 0) & (u0 > 0), (l1 < 0) & (u1 > 0)
        assert torch.equal(cross0, cross1)
        assert torch.all((l1 - l0)[cross0].abs() <= SAME_TOL * (1 + l0[cross0].abs()))
        assert torch.all((u1 - u0)[cross0].abs() <= SAME_TOL * (1 + u0[cross0].abs()))
    _check_sound(b32, s32, spec, _samples(lb, ub, 1500, gen))


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_float32_gates_are_sound_and_close(seed, monkeypatch):
    net = _random_dag(seed, conv=True)  # ReLUs and the smooth gates, residual sums, a concatenation, pooling
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.rand(net.num_inputs, generator=gen, dtype=torch.float64)
    lb, ub = x0 - 0.05, x0 + 0.05
    spec = Spec(torch.randn(4, net.num_outputs, generator=gen, dtype=torch.float64), torch.zeros(4))
    b64, s64 = _pass(net, lb, ub, spec, False, monkeypatch)
    monkeypatch.setattr(float32_mod, "FLOAT32_GATES", True)
    b32, s32 = _pass(net, lb, ub, spec, True, monkeypatch)
    assert torch.all(s64 - s32 <= F32_TOL * (1 + s64.abs()))
    _check_sound(b32, s32, spec, _samples(lb, ub, 1500, gen))


def test_a_network_with_gates_is_float64_when_float32_gates_are_off(monkeypatch):
    # FLOAT32_GATES (the default) screens the gates' sites in float32 too; off, a gated network's CROWN is float64's
    net = _random_dag(3, conv=True)
    x0 = torch.rand(net.num_inputs, dtype=torch.float64)
    monkeypatch.setattr(float32_mod, "FLOAT32_MIN_TERMS", 1)
    assert any(isinstance(n.op, Activation) and not isinstance(n.op, ReLU) for n in net.nodes[1:])
    for on in (True, False):
        monkeypatch.setattr(float32_mod, "FLOAT32_GATES", on)
        b = Bounder(net, x0 - 0.05, x0 + 0.05)
        b.crown()
        assert (b._f32_used > 0) == on


@pytest.mark.parametrize("stride", [1, 2])
def test_1x1_back_substitution_is_the_transposed_convolution(stride):
    gen = torch.Generator().manual_seed(stride)
    conv = Conv(torch.randn(6, 4, 1, 1, generator=gen, dtype=torch.float64), torch.randn(6, generator=gen, dtype=torch.float64),
                (4, 5, 5), (stride, stride))
    A = torch.randn(7, conv.out_size, generator=gen, dtype=torch.float64)
    (got,), c = conv.back(A)
    ref = F.conv_transpose2d(A.reshape(7, *conv.out_shape), conv.weight, None, conv.stride, 0,
                             (5 - ((conv.out_shape[1] - 1) * stride + 1),) * 2).reshape(7, -1)
    assert torch.allclose(got, ref, rtol=0, atol=1e-12)
    assert torch.allclose(c, A.reshape(7, 6, -1).sum(-1) @ conv.bias, rtol=0, atol=1e-12)


def test_relu_step_on_crossing_units_is_the_general_one():
    """CROWN's ReLU lines applied to the crossing units only (the CPU path without slopes) give what the general
    step gives with the same lines passed as slopes."""
    model, shape = cnn("relu", 7)
    net = from_torch(model, shape)
    gen = torch.Generator().manual_seed(7)
    x0 = torch.rand(net.num_inputs, generator=gen, dtype=torch.float64)
    b = Bounder(net, x0 - 0.1, x0 + 0.1)
    b.crown()
    relu = [s for s in range(len(b.sites)) if isinstance(b.op(s), ReLU)]
    assert any(bool(b._crossing(s, *(b.relaxation(s)[i] for i in (0, 2, 3))).numel()) for s in relu)
    A = torch.randn(9, net.num_outputs, generator=gen, dtype=torch.float64)
    slopes = {s: b.relaxation(s)[0].expand(9, -1).clone() for s in relu}
    fast, general = b.backward(A, b.net.output), b.backward(A, b.net.output, slopes)
    assert torch.allclose(fast, general, rtol=0, atol=1e-12 * (1 + float(general.abs().max())))


@pytest.mark.parametrize("cfg", [((16, 4, 4), 32, 3, 1, 1, 1, 1), ((16, 8, 8), 16, 3, 1, 1, 1, 1), ((3, 9, 9), 4, 3, 2, 0, 2, 1),
                                 ((8, 6, 6), 16, 2, 1, 0, 2, 2)])
def test_float64_conv_back_paths_are_the_transposed_convolution(cfg):
    """The matrix (a 4×4 map), col2im (8×8; strided and dilated) and grouped paths of `Conv.back` against torch's."""
    conv = _conv(cfg, 9)
    A = torch.randn(6, conv.out_size, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    (got,), c = conv.back(A)
    _c, h, w = conv.in_shape
    _, ho, wo = conv.out_shape
    k = conv.weight.shape[2]
    op = [h - ((ho - 1) * conv.stride[0] - 2 * conv.padding[0] + conv.dilation[0] * (k - 1) + 1),
          w - ((wo - 1) * conv.stride[1] - 2 * conv.padding[1] + conv.dilation[1] * (k - 1) + 1)]
    ref = F.conv_transpose2d(A.reshape(6, *conv.out_shape), conv.weight, None, conv.stride, conv.padding, tuple(op),
                             conv.groups, conv.dilation).reshape(6, -1)
    assert torch.allclose(got, ref, rtol=0, atol=1e-12)
