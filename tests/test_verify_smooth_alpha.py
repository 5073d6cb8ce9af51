"""α-CROWN for the intermediate bounds of smooth sites (`AlphaCrown.alpha_intermediate` at `Smooth` sites) and the
closed-form roots of f' = a their lines use (`smooth.Function.inverse`): the roots agree with bisection, every
optimized interval holds at densely sampled points of the box (each side apart), is never looser than CROWN's and,
on a net built for it, strictly tighter; the property's bound that follows holds at the samples too."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from analysis.verification.bounds import Bounder, Spec
from analysis.verification.ops.smooth import function, line_intercepts, slope_range
from analysis.verification.readers import read

SAMPLES = 20_000  # points of the box per net (its corners among them)
# roots found in closed form and by 64-step bisection agree to this (both brackets far below it)
ROOT_TOL = 1e-9
# a sampled value may exceed a bound by float64 rounding of the forward pass only
EVAL_TOL = 1e-10
# the nets' tightening by intermediate α must exceed this mean width share at the last site (seen ~5-20 %)
MIN_GAIN = 0.01


@pytest.mark.parametrize("kind", ["sigmoid", "tanh", "softsign", "erf", "softplus"])
def test_closed_form_roots_give_the_bisections_intercepts(kind):
    """The lines' intercepts with the closed-form root equal bisection's (the same function without `inverse`) on
    crossing, one-sided, narrow and wide intervals, slopes anywhere in (and at the ends of) f''s range there."""
    fn = function(kind)
    slow = dataclasses.replace(fn, inverse=None)
    gen = torch.Generator().manual_seed(1)
    c = torch.cat([torch.randn(4000, generator=gen, dtype=torch.float64) * 4, torch.tensor([0.0, 3.0, -3.0, 1e-3])])
    w = torch.cat([torch.rand(4000, generator=gen, dtype=torch.float64) * 10, torch.tensor([1e-7, 2.0, 40.0, 1e-3])])
    L, U = c - w / 2, c + w / 2
    lo, hi = slope_range(fn, L, U)
    t = torch.rand(2, L.numel(), generator=gen, dtype=torch.float64)
    t[:, :8] = torch.tensor([0.0, 1.0])[:, None]  # the range's own ends
    a_lo, a_up = lo + t[0] * (hi - lo), lo + t[1] * (hi - lo)
    fast = line_intercepts(fn, L, U, a_lo, a_up)
    ref = line_intercepts(slow, L, U, a_lo, a_up)
    for got, want in zip(fast, ref):
        assert torch.allclose(got, want, rtol=0, atol=ROOT_TOL), float((got - want).abs().max())


def _net(kind: str, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    act = {"sigmoid": nn.Sigmoid, "tanh": nn.Tanh}[kind]
    net = nn.Sequential(nn.Linear(3, 16), act(), nn.Linear(16, 16), act(), nn.Linear(16, 16), act(), nn.Linear(16, 3))
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.Linear):
                m.weight.mul_(2.5)  # wide pre-activation intervals: the relaxations' slack is what α can win back
    return net.double()


def _points(lb: torch.Tensor, ub: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = lb + (ub - lb) * torch.rand(SAMPLES, lb.numel(), generator=gen, dtype=torch.float64)
    corners = torch.cartesian_prod(*[torch.stack([lo, hi]) for lo, hi in zip(lb, ub)])
    return torch.cat([x, corners])


@pytest.mark.parametrize("kind", ["sigmoid", "tanh"])
@pytest.mark.parametrize("seed", [0, 1])
def test_intermediate_alpha_holds_at_samples_and_is_never_looser_than_crown(kind, seed):
    net = _net(kind, seed)
    g = read(net, (3,))
    lb, ub = torch.full((3,), -0.6, dtype=torch.float64), torch.full((3,), 0.4, dtype=torch.float64)
    b = Bounder(g, lb, ub)
    b.crown()
    crown = [(l.clone(), u.clone()) for l, u in b.pre]
    assert b.alpha_intermediate(steps=15)
    xs = _points(lb, ub, seed)
    vals = b.net.values(xs)
    for s, j in enumerate(b.site_input):
        l, u = b.pre[s]
        cl, cu = crown[s]
        assert bool((l >= cl).all() and (u <= cu).all()), f"site {s} looser than CROWN"
        v = vals[j]
        assert float((l - v).max()) <= EVAL_TOL, f"site {s}: lower bound above a sample by {float((l - v).max())}"
        assert float((v - u).max()) <= EVAL_TOL, f"site {s}: upper bound below a sample by {float((v - u).max())}"
    # strictly tighter where it matters: the last site's intervals shrink by more than MIN_GAIN of their width
    (l, u), (cl, cu) = b.pre[-1], crown[-1]
    assert float((u - l).sum()) < (1 - MIN_GAIN) * float((cu - cl).sum())
    # the spec's bounds on the tightened intervals hold, and are no lower than on CROWN's
    C = torch.randn(6, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    spec = Spec(C, torch.zeros(6))
    low = b.alpha_spec(spec, list(range(6)), steps=15)
    ref = Bounder(g, lb, ub)
    ref.crown()
    assert bool((low >= ref.spec_bounds(spec) - EVAL_TOL).all())
    out = net(xs) @ C.T
    assert float((low - out).max()) <= EVAL_TOL
