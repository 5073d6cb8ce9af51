"""Interval bound propagation: equality with a per-neuron reference, soundness by sampling,
and the network readers (torch, ONNX) against the frameworks' own evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from analysis.intervals import (Affine, ReLU, Scale, as_layers, canonical_layers, count_unstable, forward,
                                interval_bounds, layers_from_onnx, layers_from_torch)

# Same interval arithmetic summed in another order: float64 rounding only.
REFERENCE_ATOL = 1e-10
# Sampled activations vs bounds, float64 on both sides.
SOUNDNESS_TOL = 1e-9
# float32 framework outputs vs float64 layers.
FLOAT32_ATOL = 1e-5
# float64 torch vs float64 layers.
FLOAT64_ATOL = 1e-10


class Normalize(nn.Module):
    """y = x * scale + shift, the kind of input normalization the readers must recognize."""

    def __init__(self, scale, shift):
        super().__init__()
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))
        self.register_buffer("shift", torch.as_tensor(shift, dtype=torch.float32))

    def forward(self, x):
        return x * self.scale + self.shift


def random_layers(rng: np.random.Generator, widths: list[int], with_scale: bool) -> list:
    layers: list = []
    if with_scale:
        n = widths[0]
        layers.append(Scale(rng.uniform(-2, 2, n), rng.normal(0, 0.5, n)))  # negative scales too
    for k in range(len(widths) - 1):
        layers.append(Affine(rng.normal(0, 1 / np.sqrt(widths[k]), (widths[k + 1], widths[k])),
                             rng.normal(0, 0.3, widths[k + 1])))
        if k < len(widths) - 2:
            layers.append(ReLU())
    return layers


def reference_ibp(layers, lb, ub):
    """The textbook interval arithmetic, one neuron and one weight at a time."""
    lo, hi = [float(v) for v in lb], [float(v) for v in ub]
    pre = []
    for layer in layers:
        if isinstance(layer, Affine):
            new_lo, new_hi = [], []
            for i in range(layer.out_features):
                a = b = float(layer.b[i])
                for j in range(layer.in_features):
                    w = float(layer.W[i, j])
                    a += w * lo[j] if w >= 0 else w * hi[j]
                    b += w * hi[j] if w >= 0 else w * lo[j]
                new_lo.append(a)
                new_hi.append(b)
            lo, hi = new_lo, new_hi
        elif isinstance(layer, Scale):
            pairs = [sorted((lo[i] * s + t, hi[i] * s + t)) for i, (s, t) in enumerate(zip(layer.scale, layer.shift))]
            lo, hi = [p[0] for p in pairs], [p[1] for p in pairs]
        else:
            pre.append((list(lo), list(hi)))
            lo, hi = [max(v, 0.0) for v in lo], [max(v, 0.0) for v in hi]
    unstable = sum(1 for l, u in pre for a, b in zip(l, u) if a < 0 < b)
    return pre, (lo, hi), unstable


def random_box(rng, n, max_radius):
    center = rng.uniform(-1, 1, n)
    radius = rng.uniform(0, max_radius, n)
    return center - radius, center + radius


@pytest.mark.parametrize("seed", range(12))
def test_ibp_matches_per_neuron_reference(seed):
    rng = np.random.default_rng(seed)
    widths = [int(rng.integers(2, 7))] + [int(rng.integers(3, 12)) for _ in range(int(rng.integers(1, 4)))] + [3]
    layers = random_layers(rng, widths, with_scale=bool(seed % 2))
    lb, ub = random_box(rng, widths[0], max_radius=[0.01, 0.1, 1.0][seed % 3])
    got = interval_bounds(layers, lb, ub)
    ref_pre, ref_out, ref_unstable = reference_ibp(layers, lb, ub)
    assert len(got.pre_activation) == len(ref_pre) == len(widths) - 2
    for (l, u), (rl, ru) in zip(got.pre_activation, ref_pre):
        np.testing.assert_allclose(l, rl, rtol=0, atol=REFERENCE_ATOL)
        np.testing.assert_allclose(u, ru, rtol=0, atol=REFERENCE_ATOL)
        # counts agree only if no bound sits within rounding of zero; make that explicit
        assert np.all(np.abs(np.concatenate([rl, ru])) > REFERENCE_ATOL)
    np.testing.assert_allclose(got.output[0], ref_out[0], rtol=0, atol=REFERENCE_ATOL)
    np.testing.assert_allclose(got.output[1], ref_out[1], rtol=0, atol=REFERENCE_ATOL)
    assert got.num_unstable == ref_unstable == count_unstable(layers, lb, ub)
    assert got.num_relus == sum(widths[1:-1])


@pytest.mark.parametrize("seed", range(6))
def test_ibp_is_sound_by_sampling(seed):
    rng = np.random.default_rng(100 + seed)
    widths = [5, 16, 16, 4]
    layers = random_layers(rng, widths, with_scale=True)
    lb, ub = random_box(rng, widths[0], max_radius=0.5)
    bounds = interval_bounds(layers, lb, ub)
    # interior samples plus box corners (where extreme pre-activations of layer 1 are attained)
    xs = rng.uniform(lb, ub, (4000, widths[0]))
    corners = np.where(rng.integers(0, 2, (512, widths[0])).astype(bool), lb, ub)
    h = np.vstack([xs, corners])
    k = 0
    for layer in layers:
        if isinstance(layer, ReLU):
            lo, hi = bounds.pre_activation[k]
            assert np.all(h >= lo - SOUNDNESS_TOL), f"layer {k}: below lb by {np.max(lo - h):.3g}"
            assert np.all(h <= hi + SOUNDNESS_TOL), f"layer {k}: above ub by {np.max(h - hi):.3g}"
            k += 1
        h = forward([layer], h)
    assert np.all(h >= bounds.output[0] - SOUNDNESS_TOL) and np.all(h <= bounds.output[1] + SOUNDNESS_TOL)
    # a neuron that takes both signs on the samples must be counted unstable
    h = np.vstack([xs, corners])
    k = 0
    for layer in layers:
        if isinstance(layer, ReLU):
            seen_both = np.any(h < 0, axis=0) & np.any(h > 0, axis=0)
            assert np.all(bounds.pre_activation[k][0][seen_both] < 0)
            assert np.all(bounds.pre_activation[k][1][seen_both] > 0)
            k += 1
        h = forward([layer], h)


def test_point_box_has_no_unstable_relus_and_wide_box_has_some():
    rng = np.random.default_rng(7)
    layers = random_layers(rng, [4, 32, 32, 3], with_scale=False)
    x = rng.uniform(-1, 1, 4)
    assert count_unstable(layers, x, x) == 0
    assert count_unstable(layers, x - 10, x + 10) > 0


def make_torch_mlp(seed: int, in_shape=(2, 3, 3)) -> nn.Sequential:
    torch.manual_seed(seed)
    n = int(np.prod(in_shape))
    return nn.Sequential(
        Normalize(torch.tensor([0.5, -2.0]).reshape(2, 1, 1), torch.tensor([0.1, -0.3]).reshape(2, 1, 1)),
        nn.Flatten(), nn.Linear(n, 12), nn.ReLU(), nn.Dropout(0.1), nn.Sequential(nn.Linear(12, 10), nn.ReLU()),
        nn.Linear(10, 4)).eval()


def test_torch_reader_matches_torch_forward():
    model = make_torch_mlp(0).double()
    layers = layers_from_torch(model, (2, 3, 3))
    x = torch.rand(64, 2, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_allclose(forward(layers, x.reshape(64, -1).numpy()), ref, rtol=0, atol=FLOAT64_ATOL)
    # composing affine runs is exact in float64
    np.testing.assert_allclose(forward(canonical_layers(layers), x.reshape(64, -1).numpy()), ref,
                               rtol=0, atol=FLOAT64_ATOL)
    assert [type(l).__name__ for l in canonical_layers(layers)] == ["Affine", "ReLU", "Affine", "ReLU", "Affine"]
    # ibp accepts the module itself
    lb, ub = np.zeros(18), np.ones(18)
    assert interval_bounds(model, lb, ub, (2, 3, 3)).unstable_per_layer == \
        interval_bounds(layers, lb, ub).unstable_per_layer


def test_torch_reader_rejects_unknown_modules():
    with pytest.raises(TypeError, match="unsupported module GELU"):
        layers_from_torch(nn.Sequential(nn.Linear(2, 2), nn.GELU()))


def test_onnx_reader_matches_onnxruntime(tmp_path):
    """A graph built in code with MatMul + Add, Sub/Mul/Div by constants, Flatten and Reshape."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    W1 = rng.normal(size=(6, 5)).astype(np.float32)
    b1 = rng.normal(size=5).astype(np.float32)
    W2 = rng.normal(size=(5, 3)).astype(np.float32)
    b2 = rng.normal(size=(1, 3)).astype(np.float32)
    mean = np.array([[[0.5]], [[0.25]]], dtype=np.float32)  # (2, 1, 1) per channel
    std = np.array([[[2.0]], [[4.0]]], dtype=np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (W1, "W1"), (b1, "b1"), (W2, "W2"), (b2, "b2"), (mean, "mean"), (std, "std"),
        (np.array([1.5], dtype=np.float32), "k"), (np.array([1, -1], dtype=np.int64), "shape")]]
    nodes = [
        helper.make_node("Sub", ["x", "mean"], ["s"]),
        helper.make_node("Div", ["s", "std"], ["d"]),
        helper.make_node("Flatten", ["d"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "W1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("Mul", ["k", "r1"], ["k1"]),
        helper.make_node("Reshape", ["k1", "shape"], ["rs"]),
        helper.make_node("Gemm", ["rs", "W2", "b2"], ["y"], alpha=0.5, beta=2.0),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "g.onnx"
    onnx.save(model, path)
    layers = layers_from_onnx(path)
    assert as_layers(str(path))[0].__class__ is Scale
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for x in rng.uniform(-1, 1, (16, 6)):
        ref = sess.run(None, {"x": x.reshape(1, 2, 1, 3).astype(np.float32)})[0].ravel()
        np.testing.assert_allclose(forward(layers, x.astype(np.float32)), ref, rtol=0, atol=FLOAT32_ATOL)


def test_onnx_reader_names_unsupported_op(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Erf", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    path = tmp_path / "erf.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(NotImplementedError, match="Erf"):
        layers_from_onnx(path)
