"""Certified radius by bisection and unstable ReLUs at ε, held to closed forms: a linear classifier's L∞ radius is
min_j (z_y − z_j) / ‖w_y − w_j‖₁ (the margin over the dual norm of the weight difference), and a first layer's exact
pre-activation range over an unclipped box is W x ± ε‖w_i‖₁; deeper layers' stable units are checked by dense sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from analysis.robustness.radius import bisect, certified_curve, record
from analysis.robustness.unstable import unstable_at
from analysis.verification import harness
from analysis.verification.readers import read

TOL = 1e-4  # the bisection's bracket width asked for
ROUND = 1e-9  # float64 rounding room between the closed form and the bounds' arithmetic


def _linear(seed: int, d: int = 6, c: int = 3):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(d, c)).eval()
    W = m[0].weight.detach().double().numpy()
    b = m[0].bias.detach().double().numpy()
    return m, W, b


def _true_radius(W: np.ndarray, b: np.ndarray, x: np.ndarray, y: int) -> float:
    z = W @ x + b
    return min((z[y] - z[j]) / np.abs(W[y] - W[j]).sum() for j in range(len(z)) if j != y)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_bracket_contains_a_linear_classifiers_radius_and_is_tight(seed):
    m, W, b = _linear(seed)
    d = W.shape[1]
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(6, d))
    ys = (xs @ W.T + b).argmax(1)
    ys[0] = (ys[0] + 1) % W.shape[0]  # misclassified: radius 0, the clean input its own witness
    recheck = harness.ModuleRecheck(m, (d,))
    radii = bisect(read(m, (d,)), recheck, xs, ys, eps_max=3.0, tol=TOL, timeout_s=5.0)
    assert not radii[0].clean and radii[0].proved == 0.0 == radii[0].falsified and radii[0].tries == []
    for r, x, y in zip(radii[1:], xs[1:], ys[1:]):
        true = _true_radius(W, b, x, int(y))
        assert 0 < true < 3.0
        assert r.proved - ROUND <= true <= r.open + ROUND, (r.proved, true, r.open)
        assert r.open - r.proved <= TOL
        # a linear network is decided exactly: the smallest unproved ε was falsified, with a strict witness
        assert r.falsified == r.open and r.witness is not None
        w = r.witness.astype(np.float64)
        assert np.abs(w - x).max() <= r.falsified * (1 + 1e-6) + 1e-6  # inside the box (float32 rounding)
        z = W @ w + b
        assert max(z[j] - z[y] for j in range(len(z)) if j != y) > 0 or np.argmax(z) != y
        assert recheck(r.witness).argmax() != y or np.delete(recheck(r.witness), y).max() >= recheck(r.witness)[y]
    curve = certified_curve(radii, [0.0, 0.5, 3.0])
    assert curve[0]["certified"] == 5 / 6 and curve[0]["falsified"] == 1 / 6
    assert curve[1]["certified"] == sum(r.clean and r.proved >= 0.5 for r in radii) / 6
    assert record(radii[1])["proved"] == round(radii[1].proved, 9)


def test_a_radius_beyond_eps_max_is_censored_at_it():
    m, W, b = _linear(3)
    x = np.zeros(W.shape[1])
    y = int(np.argmax(W @ x + b))
    true = _true_radius(W, b, x, y)
    radii = bisect(read(m, (W.shape[1],)), harness.ModuleRecheck(m, (W.shape[1],)), x[None], [y], eps_max=true / 2,
                   timeout_s=5.0)
    assert radii[0].proved == true / 2 and math.isinf(radii[0].open) and radii[0].tries == [(true / 2, "unsat")]


def test_bad_arguments_are_refused():
    m, _, _ = _linear(0)
    with pytest.raises(ValueError, match="eps_max must be > 0"):
        bisect(read(m, (6,)), harness.ModuleRecheck(m, (6,)), np.zeros((1, 6)), [0], eps_max=0.0)


def test_unstable_units_match_the_first_layers_closed_form_and_sampling():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8), torch.nn.ReLU(),
                            torch.nn.Linear(8, 3)).eval()
    W = m[0].weight.detach().double().numpy()
    b = m[0].bias.detach().double().numpy()
    xs = np.random.default_rng(0).uniform(size=(4, 5))
    net = read(m, (5,))
    for eps in (0.0, 0.05, 0.3):
        r = unstable_at(net, xs, eps)  # unclipped: the first layer's range is exact
        z = xs @ W.T + b
        rad = eps * np.abs(W).sum(1)
        lo, hi = z - rad, z + rad
        assert r["layers"][0]["units"] == 16 and r["relus"] == 24
        assert r["layers"][0]["unstable"] == pytest.approx(((lo < 0) & (hi > 0)).mean(), abs=1e-12)
        assert r["layers"][0]["dead"] == pytest.approx((hi <= 0).mean(), abs=1e-12)
        assert r["layers"][0]["active"] == pytest.approx(((lo >= 0) & (hi > 0)).mean(), abs=1e-12)
        assert all(t <= i for t, i in zip(r["unstable"], r["unstable_ibp"]))  # CROWN at least as tight as IBP
        for layer in r["layers"]:
            assert layer["unstable"] + layer["active"] + layer["dead"] == pytest.approx(1.0, abs=1e-12)
    # the second layer: no more units change sign on 2000 samples of a box than the bounds leave unstable there
    eps = 0.1
    gen = np.random.default_rng(1)
    with torch.no_grad():
        for x in xs:
            r = unstable_at(net, x[None], eps)
            pts = torch.from_numpy(x + eps * gen.uniform(-1, 1, size=(2000, 5))).float()
            h2 = m[2](m[1](m[0](pts))).numpy()
            assert ((h2 < 0).any(0) & (h2 > 0).any(0)).sum() <= round(r["layers"][1]["unstable"] * 8)
