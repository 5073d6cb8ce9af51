"""The float32 rounding bound of quantize/rounding.py: equal to the closed form where one exists (one dot
product, two layers, a normalization before a Gemm), and sound by sampling on the pipeline's own models:
PyTorch's and onnxruntime's float32 outputs stay within it, while it stays small enough to catch a wrong weight."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
import torch
from torch import nn

from pipeline.config import GateConfig, ModelConfig
from pipeline.models import build_model
from quantize import export as ex
from quantize import rounding

from _modules import Affine, TinyViT

CLOSED_FORM_RTOL = 1e-12  # the bound against its closed form, both in float64
# The bound must stay well below a change an export bug makes: a 0.1% change of one weight moves the logits by
# about that share of a logit (tests/test_export.py catches it); relative to the largest logit:
BOUND_MAX_RELATIVE = 1e-3

pytestmark = pytest.mark.usefixtures("one_thread")


def _gamma(n: int) -> float:
    u = 2.0 ** -24
    return n * u / (1 - n * u)


def _w(layer: nn.Linear) -> tuple[np.ndarray, np.ndarray]:
    return layer.weight.detach().double().numpy(), layer.bias.detach().double().numpy()


def test_one_dot_product_is_gamma_n_times_its_magnitude():
    torch.manual_seed(0)
    lin = nn.Linear(100, 1)
    x = torch.randn(8, 100)
    w, b = _w(lin)
    xs = x.double().numpy()
    expected = _gamma(101) * (np.abs(xs) @ np.abs(w).T + np.abs(b))  # 100 products and the bias
    np.testing.assert_allclose(rounding.forward_bound(lin, x).bound, expected, rtol=CLOSED_FORM_RTOL)


def test_two_layers_carry_the_first_error_through_the_second_layers_weights():
    torch.manual_seed(1)
    l1, l2 = nn.Linear(20, 30), nn.Linear(30, 5)
    net = nn.Sequential(l1, nn.ReLU(), l2)
    x = torch.randn(16, 20)
    (w1, b1), (w2, b2) = _w(l1), _w(l2)
    xs = x.double().numpy()
    z = xs @ w1.T + b1
    h = np.maximum(z, 0)
    r1 = _gamma(21) * (np.abs(xs) @ np.abs(w1).T + np.abs(b1))  # ReLU adds none, and passes it where z > 0
    expected = _gamma(31) * (h @ np.abs(w2).T + np.abs(b2)) + (r1 * (z > 0)) @ np.abs(w2).T
    np.testing.assert_allclose(rounding.forward_bound(net, x).bound, expected, rtol=CLOSED_FORM_RTOL)


def test_a_normalization_before_a_gemm_is_bounded_as_if_folded_into_it():
    # An engine may compute W·(s·x + t) + b as (W·diag(s))·x + (W·t + b): the Gemm's term covers the chain's
    # magnitudes |s·x| + |t| (not |s·x + t|, which cancels) and its two more roundings.
    torch.manual_seed(2)
    s, t = torch.rand(12) + 0.5, torch.randn(12) * 3
    lin = nn.Linear(12, 4)
    net = nn.Sequential(Affine(s, t), lin)
    x = torch.randn(8, 12)
    w, b = _w(lin)
    sx = (x.double() * s.double()).numpy()
    t64 = t.double().numpy()
    chain = np.abs(sx) + np.abs(t64)
    expected = (_gamma(2 + 12 + 1) * (chain @ np.abs(w).T + np.abs(b))  # the Gemm, over the whole chain
                + (_gamma(1) * np.abs(sx) + _gamma(2) * chain) @ np.abs(w).T)  # the Mul and the Add, through W
    np.testing.assert_allclose(rounding.forward_bound(net, x).bound, expected, rtol=CLOSED_FORM_RTOL)


def _spec(name: str, input_shape, classes: int, activation: str = "lambda_gelu", **model) -> dict:
    tokens = name == "gpt"  # token ids have no mean and std
    return {"model": asdict(ModelConfig(name=name, **model)), "activation": activation, "gate": asdict(GateConfig()),
            "input_shape": list(input_shape), "num_classes": classes, "mean": [] if tokens else [0.5],
            "std": [] if tokens else [0.25]}


def _models():
    torch.manual_seed(3)
    images = torch.rand(48, 1, 8, 8)
    rgb = torch.rand(16, 3, 16, 16)
    tokens = torch.randint(0, 11, (8, 12))
    models = {
        "mlp-lambda_gelu-deep": (_spec("mlp", (1, 8, 8), 10, hidden=[64] * 6), images),
        "cnn-silu": (_spec("cnn", (1, 8, 8), 10, "silu", channels=[8, 16], cnn_hidden=32), images),
        "resnet18-lambda_gelu": (_spec("resnet18_cifar", (3, 16, 16), 10, resnet_width=4), rgb),
        "deit-lambda_gelu": (_spec("deit_tiny", (1, 8, 8), 10, dim=16, depth=2, heads=2, patch_size=4), images),
        "gpt-gelu": (_spec("gpt", (12,), 11, "gelu", dim=16, depth=2, heads=2), tokens),
    }
    out = {name: (build_model(spec).eval(), x) for name, (spec, x) in models.items()}
    for m in out["resnet18-lambda_gelu"][0].modules():  # BatchNorm with running statistics of its own, not 0 and 1
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    out["vit-multihead_attention"] = (TinyViT().eval(), images.reshape(48, 64))
    ln = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 3)).eval()
    with torch.no_grad():
        ln[0].bias.fill_(20.0)  # LayerNorm inputs far from 0: a one-pass variance cancels there
    out["layernorm-offset"] = (ln, torch.randn(32, 8))
    return out


MODELS = _models()
# Float32 itself is poor there (onnxruntime's one-pass variance cancels), so the bound is rightly large
LOOSE = {"layernorm-offset"}


@pytest.mark.parametrize("name", list(MODELS))
def test_pytorch_and_onnxruntime_float32_stay_within_the_bound(name, tmp_path):
    net, x = MODELS[name]
    proto, _ = ex.to_onnx(net, x[:2], 20)
    ex.save(proto, tmp_path / "m.onnx")
    check = ex.compare(tmp_path / "m.onnx", net, x)  # raises where onnxruntime leaves the bound
    assert check["ort_bound_ratio"] <= 1 and check["torch_bound_ratio"] <= 1, check
    assert check["unmodelled_ops"] == {}, check["unmodelled_ops"]
    if name not in LOOSE:
        assert check["bound_max"] <= BOUND_MAX_RELATIVE * check["max_abs_logit"], check


def test_a_sequence_model_bounds_an_even_subsample_of_its_outputs():
    net, x = MODELS["gpt-gelu"]  # 12 positions x 11 tokens = 132 outputs per sequence
    b = rounding.forward_bound(net, x, max_outputs=40)
    assert b.reference.shape == (8, 12, 11) and b.bound.shape == (8, 40)
    assert b.index[0] == 0 and b.index[-1] == 131 and len(set(b.index)) == 40


def test_an_op_without_a_rule_is_named_and_still_bounded():
    class Cumulative(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, dim=-1)

    b = rounding.forward_bound(nn.Sequential(nn.Linear(4, 6), Cumulative()), torch.randn(5, 4))
    assert b.unmodelled == {"cumsum": 1} and (b.bound > 0).all()
