"""A timm model as people export it (torch.onnx, random weights, 3×32×32) is read from its ONNX file as the function
torch computes, and one CROWN pass over an L∞ box gives finite logit bounds that hold at onnxruntime's outputs on
sampled points of the box, each side apart, and are not vacuous (`benchmarks/timm_exports.py` runs the five models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis.verification.readers import from_onnx

TORCH_ATOL = 1e-5  # the float64 graph against torch's float32 forward, relative to the logits' scale


@pytest.mark.slow
def test_regnet_export_is_read_and_its_crown_bounds_hold_at_sampled_points(tmp_path):
    from benchmarks import timm_exports as te

    model = te.build("regnetx_002")  # grouped convolutions, residual adds, ReLU
    path = tmp_path / "regnetx_002.onnx"
    te.export(model, path)
    net = from_onnx(path)
    xs = torch.rand(4, *te.SHAPE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(xs).double().numpy()
    ours = net.forward(xs.reshape(4, -1).double()).numpy()
    np.testing.assert_allclose(ours, ref, rtol=0, atol=TORCH_ATOL * (1 + np.abs(ref).max()))
    x0 = np.random.default_rng(1).uniform(0, 1, int(np.prod(te.SHAPE)))
    r = te.crown_check(net, path, x0, eps=0.002, points=2000)
    assert r["finite"] and r["violations"] == 0, r
    assert r["max_below_lower"] <= r["tolerance"] and r["max_above_upper"] <= r["tolerance"], r  # each side
    assert r["mean_width"] < 10 * r["sampled_range"], r  # bounds near what the box reaches
