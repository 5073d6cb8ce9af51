"""The certificate's float32 statement (analysis/theory/certificate/): its premise, γ_n = n·u/(1 − n·u) bounding one
float32 dot product of length n against its exact value for any summation order, checked against exact sums of
the float64 products (every product of two float32 numbers is exact in float64) on lengths and magnitudes chosen
to stress it; and the whole per-sample statement, |R̃(x) − S̃(x)| ≤ δ(x) + ρ_S(x) + ρ_R(x), checked on small
networks against PyTorch's own float32 outputs of the smooth and the swapped ReLU network."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from analysis.theory import certificate as cert
from analysis.theory.certificate import chain32
from analysis.theory.certificate.core import U32, gamma
from analysis.theory.certificate.interpreter import Certifier, relu_swapped
from pipeline.activations import LambdaGELU
from pipeline.models import Normalize

# The reference: math.fsum of exact float64 products is the exact dot product rounded once to float64.
REF_RTOL = 2.0 ** -52
# A bound that is sound but far from attainable would hide a wrong γ (e.g. √n·u): on 1 followed by n − 1 terms just
# under half an ulp of 1, summed in order, each addition rounds back to 1, and the error reaches this share of γ_n·Σ.
ATTAINED_SHARE = 0.9

LENGTHS = (1, 2, 3, 17, 256, 784, 4096, 65_536)


def _cases(n: int, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    f = np.float32
    ones = np.ones(n, dtype=f)
    big = rng.choice([-1.0, 1.0], n) * np.exp2(rng.integers(-20, 21, n))
    one_then_tiny = np.concatenate([[1.0], np.full(n - 1, U32 * (1 - 2.0 ** -10))])  # each + rounds away
    return {
        "uniform": (rng.uniform(-1, 1, n).astype(f), rng.uniform(-1, 1, n).astype(f)),
        "positive": (rng.uniform(0, 1, n).astype(f), rng.uniform(0, 1, n).astype(f)),  # no cancellation
        "magnitudes_2^±20": (big.astype(f), rng.uniform(-1, 1, n).astype(f)),
        "cancelling": (np.concatenate([x := rng.normal(0, 1e4, n // 2), -x, rng.normal(0, 1, n % 2)]).astype(f),
                       ones),  # large terms that cancel, exact result near 0
        "one_then_tiny": (one_then_tiny.astype(f), ones),
    }


def _orders(x: np.ndarray, w: np.ndarray) -> dict[str, float]:
    """fl(x·w) in float32 in several summation orders, and PyTorch's matmul on the CPU (what the networks run)."""
    p = (x * w).astype(np.float32)  # the products, each rounded once

    def sequential(q: np.ndarray) -> float:
        return float(np.cumsum(q, dtype=np.float32)[-1]) if len(q) else 0.0

    mag = np.argsort(np.abs(p))
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    return {"sequential": sequential(p), "reversed": sequential(p[::-1]), "ascending": sequential(p[mag]),
            "descending": sequential(p[mag[::-1]]), "pairwise": float(np.sum(p, dtype=np.float32)),
            "torch_dot": float(torch.dot(xt, wt)), "torch_linear": float(torch.nn.functional.linear(xt[None], wt[None])[0, 0]),
            "torch_linear_batch": float(torch.nn.functional.linear(xt[None].expand(4, -1), wt[None].expand(3, -1))[2, 1])}


@pytest.mark.parametrize("n", LENGTHS)
def test_gamma_n_bounds_a_float32_dot_product_in_any_order(n):
    rng = np.random.default_rng(n)
    for case, (x, w) in _cases(n, rng).items():
        exact = math.fsum((x.astype(np.float64) * w.astype(np.float64)).tolist())
        scale = float(np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)))
        bound = gamma(n) * scale + REF_RTOL * scale
        for order, got in _orders(x, w).items():
            assert abs(got - exact) <= bound, (case, order, n, abs(got - exact) / scale, gamma(n))


@pytest.mark.parametrize("n", (256, 4096, 65_536))
def test_gamma_n_is_nearly_attained_in_order(n):
    x, w = _cases(n, np.random.default_rng(0))["one_then_tiny"]
    exact = math.fsum((x.astype(np.float64) * w.astype(np.float64)).tolist())
    got = _orders(x, w)["sequential"]
    assert abs(got - exact) >= ATTAINED_SHARE * gamma(n) * exact, (abs(got - exact) / exact, gamma(n))


# ---------------------------------------------------------------------------------------------
# The per-sample statement on small networks, against PyTorch's float32 outputs of both networks

def _gate(lam: float) -> nn.Module:
    g = LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1)
    g.freeze(torch.tensor([lam]))
    return g


def _smooth(lam: float, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(Normalize([0.3], [0.7], (1, 4, 4)), nn.Flatten(), nn.Linear(16, 48), _gate(lam), nn.Linear(48, 48),
                         _gate(lam), nn.Linear(48, 32), _gate(lam), nn.Linear(32, 6)).eval()


def _inputs(net: nn.Sequential, seed: int) -> torch.Tensor:
    """The data's range, large magnitudes (large rounding errors), and inputs whose first-layer pre-activations sit
    at the kink, where the ReLU network's units can flip under rounding."""
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.rand(400, 1, 4, 4, generator=g), 30 * torch.randn(100, 1, 4, 4, generator=g)])
    with torch.no_grad():  # move each of 100 inputs along the first row of W until that unit's pre-activation is 0
        w = net[2].weight[0]
        base = torch.rand(100, 1, 4, 4, generator=g)
        u = net[2](net[1](net[0](base)))[:, 0]
        grad = (w * net[0].scale.reshape(-1)).reshape(1, 1, 4, 4)  # d u_0 / d x
        at_kink = base - (u / grad.square().sum()).reshape(-1, 1, 1, 1) * grad
    return torch.cat([x, at_kink])


@pytest.mark.parametrize("lam", (1.0, 10.0, 160.0))
@pytest.mark.parametrize("seed", range(2))
def test_the_float32_statement_holds_for_pytorch_float32_on_both_networks(lam, seed):
    smooth = _smooth(lam, seed)
    relu = relu_swapped(smooth)
    x = _inputs(smooth, seed)
    with torch.no_grad():
        s32, r32 = smooth(x), relu(x)  # what the statement is about: PyTorch's float32 forward on the CPU
    measured = (r32.double() - s32.double()).abs()
    bound = (Certifier(smooth).per_sample(x).per_logit + chain32.rounding_bound(smooth, x)
             + chain32.rounding_bound(relu, x))
    assert bool((measured <= bound).all()), float((measured - bound).max())
    kept = cert.certified_mask(s32, bound)
    assert bool((r32.argmax(1)[kept] == s32.argmax(1)[kept]).all())


CLOSED_FORM_RTOL = 1e-12  # the bound against its closed form, both in float64


def test_one_linear_layer_gets_gamma_n_plus_1_once():
    """A dot product of length 40 plus a bias: γ_41·(|W|·|x| + |b|), with the slack for the float64 evaluation
    (1 + 2⁻²⁰) and 2·40 + 1 operations' underflow allowance (2⁻¹²⁶ each); no doubling, γ_n being a proof."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(40, 7)).eval()
    x = 10 * torch.randn(50, 40)
    u = 2.0 ** -24
    g41 = 41 * u / (1 - 41 * u)
    w, b = net[0].weight.double(), net[0].bias.double()
    expected = (1 + 2.0 ** -20) * g41 * (x.double().abs() @ w.abs().T + b.abs()) + 81 * 2.0 ** -126
    got = chain32.rounding_bound(net, x)
    torch.testing.assert_close(got, expected, rtol=CLOSED_FORM_RTOL, atol=0)


# ---------------------------------------------------------------------------------------------
# pipeline.numerics: which of the project's dot-product bounds was right, and the library's accuracy

SUBNORMAL_LENGTHS = (1, 7, 256)
# There the error exceeds γ_n·m by orders of magnitude (measured: 3e5 at n = 7, 700 at n = 256 where the products'
# errors partly cancel): the relative bound is no bound.
UNDERFLOW_EXCESS = 100.0


def _subnormal_products(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Factors near 2⁻⁷⁵ whose products (near 2⁻¹⁵⁰, far below 2⁻¹²⁶) are subnormal or flush to 0 in float32."""
    x = (np.exp2(-75.0) * rng.uniform(1.0, 2.0, n)).astype(np.float32)
    w = (np.exp2(-75.0) * rng.uniform(1.0, 2.0, n) * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    return x, w


@pytest.mark.parametrize("flush", (False, True), ids=("gradual", "flush_to_zero"))
@pytest.mark.parametrize("n", SUBNORMAL_LENGTHS)
def test_the_dot_product_bound_needs_its_underflow_term(n, flush):
    """γ_n·m alone (the export check's old bound) fails on products that underflow; `numerics.dot_error` holds, in
    gradual underflow and with flush-to-zero (torch.set_flush_denormal), for numpy's and torch's float32 sums."""
    from pipeline import numerics

    x, w = _subnormal_products(n, np.random.default_rng(n))
    exact = math.fsum((x.astype(np.float64) * w.astype(np.float64)).tolist())
    scale = float(np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)))
    torch.set_flush_denormal(flush)  # refused (False) on a CPU without the mode: then gradual is measured twice
    try:
        got = {"numpy": float(np.sum(x * w, dtype=np.float32)),
               "torch_dot": float(torch.dot(torch.from_numpy(x), torch.from_numpy(w)))}
    finally:
        torch.set_flush_denormal(False)
    worst = max(abs(v - exact) for v in got.values())
    assert worst > UNDERFLOW_EXCESS * numerics.gamma(n) * scale, (worst, numerics.gamma(n) * scale)
    assert worst <= numerics.dot_error(n, scale), (worst, numerics.dot_error(n, scale))


# The float32 library functions the bounds assume within LIBRARY_ULPS units of u: each on a dense grid of its range,
# against torch's float64 evaluation of the same float32 input. Bounded functions are measured against u·(|y| + 1)
# (their accuracy is absolute: `quantize/rounding.py`), the others against u·|y|.
LIBRARY = {  # name: (function, low, high, bounded)
    "exp": (torch.exp, -87.0, 88.0, False), "expm1": (torch.expm1, -80.0, 80.0, False),
    "log": (torch.log, 1e-30, 1e30, False), "log1p": (torch.log1p, -0.999, 1e6, False),
    "sqrt": (torch.sqrt, 1e-30, 1e30, False), "tanh": (torch.tanh, -20.0, 20.0, True),
    "sigmoid": (torch.sigmoid, -90.0, 90.0, True), "erf": (torch.erf, -6.0, 6.0, True),
    "erfc": (torch.erfc, -6.0, 12.0, True),
}
LIBRARY_POINTS = 400_001


@pytest.mark.parametrize("name", LIBRARY)
def test_the_float32_library_is_within_its_assumed_ulps(name):
    from pipeline import numerics

    fn, lo, hi, bounded = LIBRARY[name]
    if lo > 0:  # positive ranges over many decades: a log grid
        x = torch.logspace(math.log10(lo), math.log10(hi), LIBRARY_POINTS, dtype=torch.float64).float()
    else:
        x = torch.linspace(lo, hi, LIBRARY_POINTS, dtype=torch.float64).float()
    y64 = fn(x.double())
    diff = (fn(x).double() - y64).abs()
    err = diff[diff > 0] / (numerics.U * (y64[diff > 0].abs() + (1.0 if bounded else 0.0)))  # exact values: no 0/0
    assert float(err.max()) <= numerics.LIBRARY_ULPS, (name, float(err.max()))
    assert numerics.ULPS == numerics.SAFETY * numerics.LIBRARY_ULPS  # what the export check allows per call
