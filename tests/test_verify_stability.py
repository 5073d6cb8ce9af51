"""Provable sparsity: units proven dead or always active over the whole input domain are so on every
sampled input, the tight bounds prove at least what IBP proves, and a unit made dead by construction is found."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from _digits import trained
from analysis.verification.stability import check_by_sampling, stable_units
from pipeline.relu_swap import to_relu


def test_stable_units_of_a_trained_model_hold_on_samples():
    model = to_relu(trained("lambda_gelu", epochs=5)[0])
    out = stable_units(model, (1, 8, 8), 0.0, 1.0)
    assert [r["site"] for r in out] == ["act0", "act1"] and [r["units"] for r in out] == [64, 32]
    for r in out:
        assert r["dead"] >= r["dead_ibp"] and r["active"] >= r["active_ibp"] and r["dead"] + r["active"] <= r["units"]
        assert r["dead_mask"].sum() == r["dead"] and not (r["dead_mask"] & r["active_mask"]).any()
    assert check_by_sampling(model, (1, 8, 8), 0.0, 1.0, out, n=4000)


def test_a_unit_dead_by_construction_is_found_and_ibp_counts_agree_on_a_point_box():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    with torch.no_grad():
        model[0].bias[1] = -100.0  # dead for every input in [0, 1]^3
        model[0].bias[2] = +100.0  # always active
    out = stable_units(model, (3,), 0.0, 1.0, method="ibp")
    assert out[0]["dead_mask"][1] and out[0]["active_mask"][2]
    x = np.full(3, 0.3)
    point = stable_units(model, (3,), x, x)  # a point: every unit is stable, by every method
    assert point[0]["dead"] + point[0]["active"] == 4 == point[0]["dead_ibp"] + point[0]["active_ibp"]


def test_sparsity_stage_countsprovably_stable_units_per_layer_and_per_channel():
    from types import SimpleNamespace

    from analysis.sparsity import provably_stable

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    with torch.no_grad():
        mlp[1].bias[1] = -100.0
    info = SimpleNamespace(input_shape=(3,), input_low=0.0, input_high=1.0)
    layers = {"2": {"units": 4}}
    out = provably_stable(mlp, info, layers)
    ref = stable_units(mlp, (3,), 0.0, 1.0)[0]
    assert out["provably_dead"] == layers["2"]["provably_dead"] == ref["dead"] >= 1 and ref["dead_mask"][1]
    assert out["provably_dead_ibp"] == ref["dead_ibp"]
    cnn = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 16, 2)).eval()
    with torch.no_grad():
        cnn[0].bias.copy_(torch.tensor([-100.0, 100.0]))  # channel 0 dead, channel 1 always active everywhere
    layers = {"1": {"units": 2}}  # APoZ counts conv channels
    out = provably_stable(cnn, SimpleNamespace(input_shape=(1, 4, 4), input_low=0.0, input_high=1.0), layers)
    assert (layers["1"]["provably_dead"], layers["1"]["provably_active"]) == (1, 1)
    unbounded = provably_stable(mlp, SimpleNamespace(input_shape=(3,), input_low=float("-inf"), input_high=1.0), {"2": {"units": 4}})
    assert unbounded["provable_note"].startswith("not computed: the input domain is unbounded")
