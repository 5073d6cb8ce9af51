"""Float32 rounding carried through a chain's Jacobian (`analysis/theory/certificate/chain32.py`): the bound must hold
against the float64 network on every sample, for smooth gates at small and large λ and for ReLU, on inputs placed
to stress it (large magnitudes, pre-activations near the kink); and it must be tighter than the walk's boxes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from analysis.bounds_check import swap_certificate
from analysis.theory.certificate import chain32
from pipeline.activations import LambdaGELU
from pipeline.data import Split
from pipeline.models import Normalize


def _gate(lam: float) -> nn.Module:
    g = LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1)
    g.freeze(torch.tensor([lam]))
    return g


def _chain(act, widths, seed, normalize=True) -> nn.Sequential:
    torch.manual_seed(seed)
    mods: list[nn.Module] = [Normalize([0.3], [0.7], (1, 4, 4))] if normalize else []
    mods.append(nn.Flatten())
    w = 16
    for h in widths:
        mods += [nn.Linear(w, h), act()]
        w = h
    mods.append(nn.Linear(w, 5))
    return nn.Sequential(*mods).eval()


def _measured(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return (net(x).double() - copy.deepcopy(net).double()(x.double())).abs()


ACTS = {"relu": nn.ReLU, "lambda_gelu_1": lambda: _gate(1.0), "lambda_gelu_10": lambda: _gate(10.0),
        "lambda_gelu_160": lambda: _gate(160.0)}


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("seed", range(3))
def test_the_bound_holds_against_float64_on_every_sample(act, seed):
    net = _chain(ACTS[act], [64, 64, 32], seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.rand(300, 1, 4, 4, generator=g),  # the data's range
                   100 * torch.randn(100, 1, 4, 4, generator=g)])  # large magnitudes: large rounding errors
    bound = chain32.rounding_bound(net, x)
    err = _measured(net, x)
    assert bound.shape == err.shape and bool((err <= bound).all()), float((err - bound).max())


def test_pre_activations_at_the_kink_are_covered():
    """Biases set so that many first-layer units sit within rounding distance of 0, where ReLU may flip."""
    net = _chain(nn.ReLU, [32, 32], 0, normalize=False)
    x = torch.rand(200, 1, 4, 4)
    with torch.no_grad():
        u = net[1](net[0](x))
        net[1].bias -= u[0]  # sample 0 at exactly 0 on every unit, the others near it
    bound = chain32.rounding_bound(net, x)
    assert bool((_measured(net, x) <= bound).all())


def test_linear_after_linear_and_no_normalization():
    torch.manual_seed(5)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.Linear(32, 32), _gate(160.0), nn.Linear(32, 32),
                        nn.Linear(32, 4)).eval()
    x = 50 * torch.randn(200, 1, 4, 4)
    bound = chain32.rounding_bound(net, x)
    assert bool((_measured(net, x) <= bound).all())


def test_only_chains_are_read():
    assert chain32.chain(_chain(nn.ReLU, [8], 0)) is not None
    residual = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 2))  # no rule for tanh here
    assert chain32.chain(residual) is None and chain32.rounding_bound(residual, torch.rand(3, 16)) is None
    assert chain32.chain(nn.Sequential(nn.Linear(4, 4), nn.ReLU())) is None  # must end in a Linear
    assert chain32.chain(nn.Sequential(nn.ReLU(), nn.Linear(4, 2))) is None  # an activation before any Linear
    norm = Normalize([0.3], [0.7], (4,))
    assert chain32.chain(nn.Sequential(norm, copy.deepcopy(norm), nn.Linear(4, 2))) is None  # one normalization


def test_the_jacobian_statement_is_tighter_than_the_boxes_and_holds():
    """Four 64-wide layers at λ = 160. Both statements hold; the Jacobian one is tighter (median over samples; here
    the real-arithmetic swap bound δ, common to both, is most of it) and keeps at least as many top-1 predictions."""
    net = _chain(lambda: _gate(160.0), [64, 64, 64, 64], 1)
    x = torch.rand(400, 1, 4, 4)
    cert = swap_certificate(net, Split(x, torch.zeros(400, dtype=torch.long)), 100, x[:1], jacobian_samples=250)
    box, jac = cert["float32"], cert["float32_jacobian"]
    assert box["pass"] and jac["pass"] and jac["samples"] == 250
    assert jac["bound_to_change"]["median"] < 0.75 * box["bound_to_change"]["median"]
    assert jac["certified_fraction"] >= box["certified_fraction"]


def test_a_linear_layer_without_bias_is_read():
    """A bias-free Linear (its zero bias made on the weight's device and dtype): the bound holds on random inputs."""
    import torch
    from torch import nn

    from analysis.theory.certificate import chain32

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 5, bias=False), nn.ReLU(), nn.Linear(5, 3, bias=False))
    x = torch.randn(40, 6)
    bound = chain32.rounding_bound(net, x)
    with torch.no_grad():
        exact = net.double()(x.double())
        net.float()
        err = (net(x).double() - exact).abs()
    assert bound is not None and (err <= bound).all()
