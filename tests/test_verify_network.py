"""The verifiers' network readers against the frameworks' own evaluation: torch modules (in
test_verify_bounds), ONNX graphs built in code (MatMul + Add, Sub/Div, Mul, Flatten, Reshape, Gemm with
alpha/beta, Conv, BatchNormalization) against onnxruntime, the verifier export of a CNN, and the one-line
errors for what they cannot read."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper

from analysis.verification.network import Conv, Linear, ReLU, Scale, UnsupportedModel, from_onnx, from_torch
from quantize.export import export_for_verifiers

# float32 onnxruntime vs the float64 network read from the same graph
FLOAT32_ATOL = 1e-5


def _save(tmp_path, nodes, inits, in_shape, out_shape, name="g.onnx"):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _agree(path, shape, n=16, seed=0):
    net = from_onnx(path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    for x in rng.uniform(-1, 1, (n, int(np.prod(shape)))):
        ref = sess.run(None, {"x": x.reshape(shape).astype(np.float32)})[0].ravel()
        np.testing.assert_allclose(net.forward(x.astype(np.float32).astype(np.float64)).numpy(), ref, rtol=0, atol=FLOAT32_ATOL)
    return net


def test_mlp_graph_with_normalization_matmul_and_gemm(tmp_path):
    rng = np.random.default_rng(3)
    f32 = np.float32
    inits = {"W1": rng.normal(size=(6, 5)).astype(f32), "b1": rng.normal(size=5).astype(f32),
             "W2": rng.normal(size=(5, 3)).astype(f32), "b2": rng.normal(size=(1, 3)).astype(f32),
             "mean": np.array([[[0.5]], [[0.25]]], dtype=f32), "std": np.array([[[2.0]], [[4.0]]], dtype=f32),
             "k": np.array([1.5], dtype=f32), "shape": np.array([1, -1], dtype=np.int64)}
    nodes = [helper.make_node("Sub", ["x", "mean"], ["s"]), helper.make_node("Div", ["s", "std"], ["d"]),
             helper.make_node("Flatten", ["d"], ["f"], axis=1), helper.make_node("MatMul", ["f", "W1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["a1"]), helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("Mul", ["k", "r1"], ["k1"]), helper.make_node("Reshape", ["k1", "shape"], ["rs"]),
             helper.make_node("Gemm", ["rs", "W2", "b2"], ["y"], alpha=0.5, beta=2.0)]
    net = _agree(_save(tmp_path, nodes, inits, [1, 2, 1, 3], [1, 3]), (1, 2, 1, 3))
    assert [type(l).__name__ for l in net.layers] == ["Scale", "Scale", "Linear", "ReLU", "Scale", "Linear"]
    assert net.input_shape == (2, 1, 3) and net.layers[3].source == "a1"  # Marabou's name for the ReLU's input


def test_conv_and_batchnorm_graph(tmp_path):
    rng = np.random.default_rng(4)
    f32 = np.float32
    inits = {"w": rng.normal(size=(3, 2, 3, 3)).astype(f32), "b": rng.normal(size=3).astype(f32),
             "g": rng.uniform(0.5, 1.5, 3).astype(f32), "beta": rng.normal(size=3).astype(f32),
             "mu": rng.normal(size=3).astype(f32), "var": rng.uniform(0.5, 2, 3).astype(f32),
             "W": rng.normal(size=(3 * 3 * 2, 4)).astype(f32), "c": rng.normal(size=4).astype(f32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g", "beta", "mu", "var"], ["bn"], epsilon=1e-3),
             helper.make_node("Relu", ["bn"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "W", "c"], ["y"])]
    net = _agree(_save(tmp_path, nodes, inits, [1, 2, 5, 4], [1, 4]), (1, 2, 5, 4))
    assert isinstance(net.layers[0], Conv) and net.layers[0].out_shape == (3, 3, 2)
    assert isinstance(net.merged().layers[0], Conv) and isinstance(net.merged().layers[1], ReLU)  # BN folded


def test_verifier_export_of_a_cnn_reads_back(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 10),
                          nn.ReLU(), nn.Linear(10, 3)).eval()
    x = torch.rand(8, 1, 8, 8)
    export_for_verifiers(model, (1, 8, 8), tmp_path / "cnn.onnx", x)
    net = from_onnx(tmp_path / "cnn.onnx")
    ref = from_torch(model, (1, 8, 8))
    xs = torch.rand(20, 64, dtype=torch.float64)
    np.testing.assert_allclose(net.forward(xs).numpy(), ref.forward(xs).numpy(), atol=1e-5)


@pytest.mark.parametrize("op", ["Erf", "Sigmoid", "Gelu"])
def test_unsupported_op_is_one_line_naming_it(tmp_path, op):
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="n3")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    with pytest.raises(UnsupportedModel) as e:
        from_onnx(path)
    msg = str(e.value)
    assert f"unsupported ONNX op {op} (node 'n3')" in msg and "\n" not in msg


def test_torch_reader_rejects_unknown_modules_in_one_line():
    with pytest.raises(UnsupportedModel, match="unsupported activation Tanh at 1"):
        from_torch(nn.Sequential(nn.Linear(2, 2), nn.Tanh()), (2,))
    with pytest.raises(UnsupportedModel, match="Linear takes 3 features"):
        from_torch(nn.Sequential(nn.Linear(3, 2)), (2,))


def test_merged_layers_compute_the_same_function():
    rng = np.random.default_rng(0)
    from analysis.verification.network import Network

    net = Network((4,), [Scale(rng.uniform(-2, 2, 4), rng.normal(size=4)), Linear(rng.normal(size=(5, 4)), rng.normal(size=5)),
                         Scale(rng.uniform(-2, 2, 5), rng.normal(size=5)), ReLU(5), Linear(rng.normal(size=(2, 5)), np.zeros(2))])
    merged = net.merged()
    assert [type(l).__name__ for l in merged.layers] == ["Linear", "ReLU", "Linear"]
    x = torch.as_tensor(rng.normal(size=(10, 4)))
    np.testing.assert_allclose(merged.forward(x).numpy(), net.forward(x).numpy(), atol=1e-12)
