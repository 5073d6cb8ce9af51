"""analysis.api: the verify stage's verifiers on a model and data tensors (check, swap and export through the API
are exercised on a user's residual model in tests/test_convert.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from _digits import digits, trained
from analysis import api
from analysis.verification import registry
from pipeline import to_relu

SAMPLES = 4
SMALL_EPS, LARGE_EPS = 1e-3, 0.5  # a radius the digits MLP survives, and one (half the pixel range) it cannot


@pytest.fixture(scope="module")
def relu_mlp():
    torch.manual_seed(0)
    model, _ = trained("lambda_gelu", epochs=10)
    return model, to_relu(copy.deepcopy(model))


def test_verify_a_model_on_data_tensors(relu_mlp):
    smooth, relu = relu_mlp
    ds = digits()
    data = (ds.val.x, ds.val.y)
    out = api.verify(relu, data, [SMALL_EPS, LARGE_EPS], low=0.0, high=1.0, samples=SAMPLES, timeout_s=5.0)
    assert out["verifier"] == registry.resolve("auto") and len(out["rows"]) == 2 * SAMPLES
    correct = (relu(ds.val.x[:SAMPLES]).argmax(-1) == ds.val.y[:SAMPLES]).float().mean().item()
    assert out["certified"][SMALL_EPS] == correct  # the complete chain decides every correctly classified sample
    assert out["certified"][LARGE_EPS] == 0.0 and {r["result"] for r in out["rows"] if r["eps"] == LARGE_EPS} == {"sat"}
    bounds = api.verify(smooth, data, [SMALL_EPS], low=0.0, high=1.0, samples=SAMPLES, verifier="crown")
    assert bounds["certified"][SMALL_EPS] > 0  # the smooth model through its gates' relaxations
    assert not smooth.training and not relu.training
