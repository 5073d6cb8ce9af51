"""The per-sample swap bound with the change carried with its signs (`analysis/theory/certificate/signed.py`): it holds
against the change computed in exact rational arithmetic (the ReLU network is a rational function of the float64
values it shares with the smooth one), where the box walk, which takes the smooth network's float64 values as exact,
misses it; against the float64 change on conv nets with BatchNorm, residual adds and squeeze-excite products it holds,
is the measured change to 1e-9 and is never looser than the box walk's bound (but for the rounding the box leaves
out), which is orders of magnitude above it."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

from analysis.theory import certificate as cert
from analysis.theory.certificate.signed import monotone_image
from benchmarks.signed_certificate import conv_net

SOUND_ATOL = 1e-10  # the float64 forwards' own rounding: the slack the tests against float64 changes allow
SOUND_RTOL = 1e-13
BOX_RTOL = 1e-6  # the box leaves out the smooth network's float64 rounding: by so much it can be below the signed bound
TIGHT_RTOL = 1e-9  # signed bound ≤ measured·(1 + this) + SOUND_ATOL on nets with no unit near a kink


class HardGate(nn.Module):
    """x·hardsigmoid(λx) written out, a user's gate of the λ-HardSwish family: rational, so exact in Fractions."""

    GATE = "hardsigmoid"

    def __init__(self, lam: float):
        super().__init__()
        self.lam = torch.tensor([lam], dtype=torch.float64)

    def forward(self, x):
        return x * torch.clamp(self.lam * x / 6 + 0.5, 0, 1)


def _exact_relu(net: nn.Sequential, x: torch.Tensor) -> list[list[Fraction]]:
    """The swapped network (every HardGate → ReLU) on each row of x in rational arithmetic from the first gate's input
    on, that input being the float64 value both networks share (the walk's premise: what comes before the first gate
    is one computation)."""
    out = []
    with torch.no_grad():
        shared = net[0](x)
    for row in shared.tolist():
        h = [Fraction(v) for v in row]
        for m in net[1:]:
            if isinstance(m, nn.Linear):
                w, b = m.weight.tolist(), m.bias.tolist()
                h = [sum((Fraction(wij) * hj for wij, hj in zip(wi, h)), Fraction(bi)) for wi, bi in zip(w, b)]
            else:
                h = [max(v, Fraction(0)) for v in h]
        out.append(h)
    return out


def _cancelling_mlp(seed: int, lam: float) -> nn.Sequential:
    """Layer 1 computes each unit twice (the copies 1e-7 apart); layer 2 takes ±1e6 times each pair's difference, so
    its change cancels to a small fraction of |W|·|c|: where the float64 rounding of W·c counts."""
    g = torch.Generator().manual_seed(seed)
    l1, l2, l3 = nn.Linear(3, 8).double(), nn.Linear(8, 4).double(), nn.Linear(4, 3).double()
    with torch.no_grad():
        base = torch.randn(4, 3, generator=g, dtype=torch.float64)
        l1.weight.copy_(torch.cat([base, base * (1 + 1e-7)]))
        l1.bias.copy_(torch.randn(8, generator=g, dtype=torch.float64) * 0.1)
        w2 = torch.zeros(4, 8, dtype=torch.float64)
        for i in range(4):
            w2[i, i], w2[i, i + 4] = 1e6, -1e6
        l2.weight.copy_(w2 + torch.randn(4, 8, generator=g, dtype=torch.float64))
        l3.weight.copy_(torch.randn(3, 4, generator=g, dtype=torch.float64))
    return nn.Sequential(l1, HardGate(lam), l2, HardGate(lam), l3)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lam", [0.5, 8.0])
def test_the_signed_bound_holds_against_the_change_in_rational_arithmetic(seed, lam):
    net = _cancelling_mlp(seed, lam)
    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64) * 3
    bound = cert.Certifier(net).per_sample(x).per_logit
    box = cert.Certifier(net).per_sample(x, signed=False).per_logit
    with torch.no_grad():
        smooth = net(x)  # the smooth network's values as the walk takes them (float64)
    exact = _exact_relu(net, x)
    worst = max(abs(e - Fraction(s)) - Fraction(b)
                for er, sr, br in zip(exact, smooth.tolist(), bound.tolist()) for e, s, b in zip(er, sr, br))
    assert worst <= 0, f"the signed bound misses the rational change by {float(worst):.3g}"
    if lam == 8.0:
        # most units saturate the hard gate (|λx| ≥ 3), where the box walk says 0: it takes the smooth network's float64
        # values as exact, and on these weights their rounding is what the change is
        box_misses = max(abs(e - Fraction(s)) - Fraction(b)
                         for er, sr, br in zip(exact, smooth.tolist(), box.tolist()) for e, s, b in zip(er, sr, br))
        assert box_misses > 0, "the cancelling net no longer tests the radius: the box holds here too"


@pytest.mark.parametrize("seed,lam", [(0, 20.0), *[pytest.param(s, lam, marks=pytest.mark.slow)  # ~5 s each
                                                    for s in range(3) for lam in (1.0, 20.0, 300.0) if (s, lam) != (0, 20.0)]])
def test_on_conv_nets_the_signed_bound_holds_is_the_change_and_is_never_looser(seed, lam):
    model = conv_net(blocks=4, lam=lam, seed=seed)
    x = torch.randn(24, 3, 6, 6, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    c = cert.Certifier(model)
    signed, box = c.per_sample(x).per_logit, c.per_sample(x, signed=False).per_logit
    with torch.no_grad():
        s, r = model.double()(x), cert.relu_swapped(model).double()(x)
    change = (r - s).abs()
    slack = SOUND_ATOL + SOUND_RTOL * torch.maximum(s.abs(), r.abs())
    assert float((change - signed - slack).max()) <= 0, "the signed bound is below the measured change"
    assert bool((signed <= box * (1 + BOX_RTOL) + SOUND_ATOL).all()), "the signed bound is looser than the box walk's"
    assert float((signed - change * (1 + TIGHT_RTOL) - SOUND_ATOL).max()) <= 0, float((signed / change).max())
    assert float((box / change.clamp_min(1e-300)).median()) > 10  # the boxes drop the signs: what this fixes


@pytest.mark.parametrize("h", [torch.relu, nn.Hardsigmoid(), nn.ReLU6()], ids=["relu", "hardsigmoid", "relu6"])
def test_a_monotone_image_holds_across_kinks_at_dense_samples(h):
    """(c', r') after h holds h(z + Δ) − h(z) for every Δ in [c − r, c + r], at z beside, on and across the kinks."""
    z = torch.tensor([-3.0, -3.0 + 1e-3, -1e-3, 0.0, 1e-3, 0.7, 3.0, 3.0 - 1e-3, 6.0, 5.9, -2.0], dtype=torch.float64)
    for c0, r0 in [(0.0, 0.0), (2e-3, 1e-3), (-2e-3, 5e-3), (0.5, 0.25), (-4.0, 1.0)]:
        c, r = torch.full_like(z, c0), torch.full_like(z, r0)
        y = h(z)
        c1, r1 = monotone_image(h, z, y, c, r, ops=1)
        delta = torch.linspace(-1, 1, 4001, dtype=torch.float64).view(-1, 1) * r + c
        got = h(z + delta) - y
        assert float(((got - c1).abs() - r1).max()) <= 0, (c0, r0)
