"""HardSwish's relaxation (`analysis.verification.ops.relu.HardSwish`) by dense sampling in float64, each side apart:
its interval holds every value, and its lines (CROWN's default slopes and random slopes, as α-CROWN may give) hold at
every sampled point and at the kinks, on intervals in every regime (left of −3, across one or both kinks, inside the
quadratic piece, right of 3, a single point); its forward is torch's hardswish; and a CROWN pass through it holds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from analysis.verification.bounds import Bounder, Spec
from analysis.verification.graph import Graph, Node
from analysis.verification.ops.affine import Linear
from analysis.verification.ops.relu import HardSwish

DT = torch.float64
SAMPLES = 4001
FORWARD_TOL = 1e-15  # the formula x·clip(x/6 + ½) against torch's, a few float64 roundings of values ≤ 8
SOUND_TOL = 0.0  # every line and interval end carries its own rounding slack: no tolerance beyond it


def _intervals(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ends = torch.tensor([[-9.0, -4.0], [-5.0, -1.0], [-4.0, 4.0], [-2.0, 1.5], [-1.0, 5.0], [3.5, 7.0], [-3.0, 3.0],
                         [0.7, 0.7], [-3.0, -3.0]], dtype=DT)
    rand = torch.sort(torch.rand(40, 2, generator=gen, dtype=DT) * 16 - 8, dim=1).values
    both = torch.cat([ends, rand])
    return both[:, 0], both[:, 1]


def _points(l: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    t = torch.linspace(0, 1, SAMPLES, dtype=DT)[:, None]
    xs = l + t * (u - l)
    # the kinks and f's minimum (x = −3/2), where an interval's range and a line's touching point may lie
    special = torch.stack([torch.full_like(l, v).clamp(l, u) for v in (-3.0, 3.0, -1.5)])
    return torch.cat([xs, special])  # [points, units]


def test_hardswish_forward_is_torchs():
    x = torch.linspace(-8, 8, 10001, dtype=DT)
    assert float((HardSwish(1).forward(x) - F.hardswish(x)).abs().max()) <= FORWARD_TOL


@pytest.mark.parametrize("seed", range(3))
def test_hardswish_interval_and_lines_hold_each_side(seed):
    gen = torch.Generator().manual_seed(seed)
    l, u = _intervals(gen)
    op = HardSwish(l.numel())
    xs = _points(l, u)
    y = op.forward(xs)
    lo, hi = op.interval(l, u)
    assert bool((y >= lo - SOUND_TOL).all()) and bool((y <= hi + SOUND_TOL).all())
    assert bool((hi - lo <= (y.amax(0) - y.amin(0)) + 1e-9).all())  # the exact range, up to the slack
    slopes = [None] + [(torch.rand(l.shape, generator=gen, dtype=DT) * 2 - 0.5,
                        torch.rand(l.shape, generator=gen, dtype=DT) * 2 - 0.5) for _ in range(4)]
    for sl in slopes:
        al, bl, au, bu = op.crown_lines(l, u, sl)
        assert bool((al * xs + bl <= y + SOUND_TOL).all()), "lower line above f"
        assert bool((au * xs + bu >= y - SOUND_TOL).all()), "upper line below f"
        # each line touches f somewhere on the interval (its intercept is exact, up to the slack and the sampling)
        assert bool(((y - (al * xs + bl)).amin(0) <= 1e-6).all()) and bool(((au * xs + bu - y).amin(0) <= 1e-6).all())


def test_crown_through_hardswish_holds_at_sampled_points():
    gen = torch.Generator().manual_seed(7)
    W1, b1 = torch.randn(12, 4, generator=gen, dtype=DT) * 2, torch.randn(12, generator=gen, dtype=DT)
    W2, b2 = torch.randn(3, 12, generator=gen, dtype=DT), torch.randn(3, generator=gen, dtype=DT)
    net = Graph((4,), [Node(Linear(W1, b1), (0,)), Node(HardSwish(12), (1,)), Node(Linear(W2, b2), (2,))])
    x0 = torch.randn(4, generator=gen, dtype=DT)
    lb, ub = x0 - 0.5, x0 + 0.5
    b = Bounder(net, lb, ub)
    b.crown()
    C = torch.cat([torch.eye(3, dtype=DT), -torch.eye(3, dtype=DT)])
    lower = b.spec_bounds(Spec(C, torch.zeros(6)))
    alpha = b.alpha_spec(Spec(C, torch.zeros(6)), list(range(6)), steps=10)
    xs = lb + (ub - lb) * torch.rand(20000, 4, generator=gen, dtype=DT)
    vals = net.forward(xs) @ C.T
    assert bool((vals >= lower - 1e-9).all()) and bool((vals >= alpha - 1e-9).all())
    assert bool((alpha >= lower - 1e-9).all())
