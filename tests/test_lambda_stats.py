"""Hardness statistics: drift, Spearman across runs (with the undefined cases), the λ plot."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from pipeline import lambda_stats as H


def test_drift_by_hand():
    lams = [[1.0, 2.0], [2.0, 2.0], [1.5, 4.0]]  # layer 0: 1 + 0.5, layer 1: 0 + 2
    assert H.per_layer_drift(lams).tolist() == [1.5, 2.0]
    assert H.drift(lams) == pytest.approx(1.75, abs=1e-15)
    assert H.drift(np.array(lams)) == H.drift(lams)


def test_drift_edge_cases():
    assert H.drift([[1.0, 3.0, 5.0]]) == 0.0  # one epoch: nothing moved
    assert H.drift([1.0, 4.0, 2.0]) == 5.0  # 1-D is one layer over epochs
    with pytest.raises(ValueError, match="epochs"):
        H.drift(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="non-finite"):
        H.drift([[1.0], [math.nan]])


def test_drift_is_linear_schedule_length():
    # Algorithm 1 anneals λ linearly to the target: the drift is |target − start| per layer.
    start, target, T = np.array([1.2, 3.0, 7.0]), 160.0, 11
    table = start + np.linspace(0, 1, T)[:, None] * (target - start)
    assert H.drift(table) == pytest.approx(np.mean(target - start), rel=1e-12)


def test_spearman():
    a = [1.0, 2.0, 3.0, 4.0]
    assert H.spearman(a, [10.0, 20.0, 35.0, 100.0])["rho"] == pytest.approx(1.0)  # monotone map
    assert H.spearman(a, a[::-1])["rho"] == pytest.approx(-1.0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=9), rng.normal(size=9)
    r = H.spearman(x, y)
    ref = spearmanr(x, y)
    assert r["rho"] == pytest.approx(ref.statistic) and r["pvalue"] == pytest.approx(ref.pvalue) and r["reason"] is None


def test_spearman_undefined_cases():
    r = H.spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
    assert math.isnan(r["rho"]) and math.isnan(r["pvalue"]) and "constant" in r["reason"] and "first" in r["reason"]
    r = H.spearman([2.0], [3.0])
    assert math.isnan(r["rho"]) and "fewer than 2" in r["reason"]
    with pytest.raises(ValueError, match="lengths"):
        H.spearman([1.0, 2.0], [1.0, 2.0, 3.0])


def test_spearman_over_epochs():
    uniform = [[1.0, 1.0, 1.0], [1.1, 1.5, 2.0], [1.2, 2.0, 3.0]]  # uniform init: constant at epoch 0
    increasing = [[1.0, 1.5, 2.0], [1.2, 1.6, 2.2], [1.3, 2.5, 2.4]]
    out = H.spearman_over_epochs(uniform, increasing)
    assert [o["epoch"] for o in out] == [0, 1, 2]
    assert math.isnan(out[0]["rho"]) and out[0]["reason"]
    assert out[1]["rho"] == pytest.approx(1.0) and out[2]["rho"] == pytest.approx(0.5)


def test_plot_lambda(tmp_path):
    table = np.array([[1.0, 1.5], [2.0, 1.7], [50.0, 60.0], [160.0, 160.0]])
    p = H.plot_lambda(table, tmp_path / "fig" / "lam.png", layer_names=["act0", "act1"], switch_epoch=2, target=160.0)
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000
    with pytest.raises(ValueError, match="layer names"):
        H.plot_lambda(table, tmp_path / "x.png", layer_names=["only one"])
