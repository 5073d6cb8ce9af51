"""The certificate's rules for means, powers and square roots, floating casts and the squeeze-excite product: each rule's
box holds against dense sampling of its input box and is attained (the exact image, not a loose one), and on small
networks built around them (an RMSNorm that casts as Hugging Face's LlamaRMSNorm does, a squeeze-excite block) the
certified bounds hold against the measured change, in float64 and in float32, and stay within 100× of it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from analysis.theory import certificate as cert
from analysis.theory.certificate.core import SAMPLE_CHANNELS
from analysis.theory.certificate.interpreter import _Walk
from pipeline.activations import LambdaGELU

SAMPLES = 401  # points per element across its box, both ends included
SOUND_RTOL = 1e-12  # the float64 evaluation of the samples and the box
TIGHT = 0.999  # the sampled image reaches this share of the box: the rule is the exact image
NON_VACUOUS = 100.0  # a network's certified bound is within this factor of the measured change


def _boxed(op, z: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the rule's box for op at z with input box d, the largest |op(v) − op(z)| over v sampled densely in [z − d, z + d]
    elementwise, v moving every element together along each sampled offset)."""
    walk = _Walk(SAMPLE_CHANNELS[:1])
    box = op(walk.wrap(z, [d])).boxes[0]
    t = torch.linspace(-1, 1, SAMPLES, dtype=torch.float64).view(-1, *([1] * z.dim()))
    signs = torch.tensor([1.0, -1.0], dtype=torch.float64).view(-1, *([1] * z.dim()))
    vs = torch.cat([z + t * d, z + signs * d * torch.sign(z)])  # every point, and the corner away from / toward 0
    seen = torch.stack([(op(v) - op(z)).abs() for v in vs]).amax(0)
    return box, seen


ELEMENTWISE = {
    "square": (lambda x: x.pow(2), lambda g: torch.randn(64, generator=g, dtype=torch.float64) * 3),
    "cube": (lambda x: torch.pow(x, 3), lambda g: torch.randn(64, generator=g, dtype=torch.float64) * 3),
    "rsqrt": (torch.rsqrt, lambda g: torch.rand(64, generator=g, dtype=torch.float64) * 4 + 0.5),
    "sqrt": (torch.sqrt, lambda g: torch.rand(64, generator=g, dtype=torch.float64) * 4 + 0.5),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_rules_hold_and_are_attained(name):
    op, draw = ELEMENTWISE[name]
    g = torch.Generator().manual_seed(3)
    z = draw(g)
    d = torch.rand(64, generator=g, dtype=torch.float64) * 0.4
    box, seen = _boxed(op, z, d)
    assert (seen <= box * (1 + SOUND_RTOL)).all()
    assert (seen >= TIGHT * box).all()


def test_a_root_whose_box_reaches_zero_is_unbounded():
    box, _ = _boxed(torch.rsqrt, torch.tensor([0.3, 2.0], dtype=torch.float64), torch.tensor([0.3, 0.1], dtype=torch.float64))
    assert box[0] == float("inf") and box[1] < 1


def test_mean_and_sum_rules_hold_and_are_attained():
    g = torch.Generator().manual_seed(4)
    z = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    d = torch.rand(3, 5, 7, generator=g, dtype=torch.float64)
    for op in (lambda x: x.mean((1, 2), keepdim=True), lambda x: torch.mean(x, -1), lambda x: x.sum(1), lambda x: x.mean()):
        box, seen = _boxed(op, z, d)
        assert (seen <= box * (1 + SOUND_RTOL)).all() and (seen >= TIGHT * box).all()


def test_without_a_global_bound_powers_and_roots_refuse_the_global_walk():
    net = nn.Sequential(nn.Linear(3, 4), _gate(4.0), Square(), nn.Linear(4, 2)).double()
    with pytest.raises(cert.Refused, match="`pow` is not Lipschitz"):
        cert.swap_bound(net, (3,))
    mean_net = nn.Sequential(nn.Linear(3, 4), _gate(4.0), Mean(), nn.Linear(1, 2)).double()
    assert cert.swap_bound(mean_net, (3,)).max > 0  # linear: a global bound


class Square(nn.Module):
    def forward(self, x):
        return x.pow(2)


class Mean(nn.Module):
    def forward(self, x):
        return x.mean(-1, keepdim=True)


class RMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm, line for line: its statistics in float32 whatever the input's dtype (`compute`:
    float64 for the real-arithmetic reference)."""

    compute = torch.float32

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))
        self.variance_epsilon = 1e-6

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(self.compute)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class SqueezeExcite(nn.Module):
    """timm's efficientnet SqueezeExcite: x·σ(W₂·ReLU(W₁·mean(x)))."""

    def __init__(self, ch: int):
        super().__init__()
        self.conv_reduce, self.act1 = nn.Conv2d(ch, ch // 2, 1), nn.ReLU()
        self.conv_expand, self.gate = nn.Conv2d(ch // 2, ch, 1), nn.Sigmoid()

    def forward(self, x):
        return x * self.gate(self.conv_expand(self.act1(self.conv_reduce(x.mean((2, 3), keepdim=True)))))


class RMSNorm64(RMSNorm):
    """Its statistics in float64 inside a float32 network, cast back down at its end: a rounding the float32 network makes."""

    compute = torch.float64


def _gate(lam: float) -> LambdaGELU:
    g = LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1)
    g.freeze(torch.tensor([lam]))
    return g


def _nets():
    torch.manual_seed(0)
    rms = nn.Sequential(nn.Linear(6, 16), _gate(8.0), RMSNorm(16), nn.Linear(16, 4))
    rms64 = nn.Sequential(nn.Linear(6, 16), _gate(8.0), RMSNorm64(16), nn.Linear(16, 4))
    se = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), _gate(8.0), SqueezeExcite(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                       nn.Linear(8, 4))
    return {"rmsnorm": (rms.eval(), torch.randn(256, 6)), "rmsnorm_float64_inside": (rms64.eval(), torch.randn(256, 6)),
            "squeeze_excite": (se.eval(), torch.randn(64, 3, 6, 6))}


def _change(a: nn.Module, b: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return (a(x).double() - b(x).double()).abs().reshape(len(x), -1)


@pytest.mark.parametrize("name", ["rmsnorm", "rmsnorm_float64_inside", "squeeze_excite"])
def test_networks_bounds_hold_and_are_not_vacuous(name, monkeypatch):
    net, x = _nets()[name]
    relu = cert.relu_swapped(net, x[:2])
    ps = cert.swap_bound_per_sample(net, x)
    assert ps.float32 is not None, ps.float32_refused
    # float32, both networks as deployed (the casts are no-ops there, their rounding allowed for all the same)
    change32 = _change(net, relu, x)
    assert (change32 <= ps.float32).all()
    assert ps.float32.max() <= NON_VACUOUS * change32.max()
    # real arithmetic: the float64 networks with the casts as the identity they are there
    monkeypatch.setattr(RMSNorm, "compute", torch.float64)
    change64 = _change(net.double(), relu.double(), x.double())
    assert (change64 <= ps.per_logit * (1 + SOUND_RTOL)).all()
    assert ps.per_logit.max() <= NON_VACUOUS * change64.max()


def test_a_cast_below_float32_refuses_the_float32_statements_only():
    class Half(nn.Module):
        def forward(self, x):
            return x.to(torch.bfloat16).to(x.dtype)

    net = nn.Sequential(nn.Linear(3, 4), _gate(4.0), Half(), nn.Linear(4, 2)).eval()
    ps = cert.swap_bound_per_sample(net, torch.randn(8, 3))
    assert ps.float32 is None and "bfloat16" in ps.float32_refused and ps.max > 0
