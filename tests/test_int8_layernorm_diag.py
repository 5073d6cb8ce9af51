"""benchmarks/int8_layernorm.py's exact minimum of a row's variance over a box of intervals, against a dense search
over the common value c (the variance of x is min over c of mean((x_i − c)²), so its minimum over the box is min over
c of mean(dist(c, [l_i, u_i])²)) and against sampled points of the box."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.int8_layernorm import exact_min_variance

DENSE_TOL = 1e-6  # the dense search's grid of 20001 values of c over the row's span


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.floats(0.01, 3.0), st.integers(0, 10**6))
def test_the_exact_minimum_matches_a_dense_search_and_no_point_of_the_box_goes_below(n, spread, seed):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(2, n, generator=g, dtype=torch.float64)
    w = torch.rand(2, n, generator=g, dtype=torch.float64) * spread
    l, u = c - w, c + w
    got = exact_min_variance(l, u)
    cs = torch.linspace(float(l.min()) - 1, float(u.max()) + 1, 20001, dtype=torch.float64)
    dense = ((l[:, None, :] - cs[None, :, None]).clamp(min=0) ** 2
             + (cs[None, :, None] - u[:, None, :]).clamp(min=0) ** 2).mean(-1).min(-1).values
    assert torch.all(got <= dense + 1e-12) and torch.all(got >= dense - DENSE_TOL)
    x = l[:, None, :] + (u - l)[:, None, :] * torch.rand(2, 2000, n, generator=g, dtype=torch.float64)
    assert torch.all(x.var(-1, unbiased=False).min(-1).values >= got - 1e-12)
    # a row whose intervals share a point can be constant: its minimum is 0
    shared = l.max(-1).values <= u.min(-1).values
    assert torch.all(got[shared] <= 1e-12)
