"""The verification graph readers against the frameworks' own evaluation: ONNX graphs built in code (MatMul + Add,
Sub/Div, Mul, Flatten, Reshape, Gemm with alpha/beta, Conv, BatchNormalization, a residual Add, Concat, Transpose,
average pooling, Clip, Neg, the gates' export patterns) against onnxruntime; torch modules of any shape (a wrapper
class, a residual block, every registered gate) read through their ONNX export against torch in float64; and the
one-line errors, naming the op and the node or module path, for what they cannot read."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper

from _modules import Affine
from analysis.verification.graph import Graph
from analysis.verification.ops.affine import Conv, Linear, Scale, Sum
from analysis.verification.ops.base import UnsupportedModel
from analysis.verification.ops.gates import Gate
from analysis.verification.ops.relu import ReLU
from analysis.verification.ops.shape import Concat
from analysis.verification.readers import from_onnx, from_torch, module_path, supported_ops
from quantize.export import export_for_verifiers
from _onnx import make_model

# float32 onnxruntime vs the float64 graph read from the same file
FLOAT32_ATOL = 1e-5
# a torch module in float64 vs its graph (float32 weights; λ rounded to float32 by the export)
TORCH_F64_ATOL = 1e-6


def _save(tmp_path, nodes, inits, in_shape, out_shape, name="g.onnx", opset=20):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = make_model(graph, opset)
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _agree(path, shape, n=16, seed=0, low=-1.0):
    net = from_onnx(path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    for x in rng.uniform(low, 1, (n, int(np.prod(shape)))):
        ref = sess.run(None, {"x": x.reshape(shape).astype(np.float32)})[0].ravel()
        np.testing.assert_allclose(net.forward(x.astype(np.float32).astype(np.float64)).numpy(), ref, rtol=0, atol=FLOAT32_ATOL)
    return net


def _ops(net: Graph) -> list[str]:
    return [type(n.op).__name__ for n in net.nodes[1:]]


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
    assert _ops(net) == ["Scale", "Scale", "Linear", "Scale", "ReLU", "Scale", "Linear"]
    assert net.input_shape == (2, 1, 3) and net.nodes[5].op.source == "a1"  # Marabou's name for the ReLU's input
    assert _ops(net.merged()) == ["Linear", "ReLU", "Linear"]


def test_products_of_constants_fold_into_the_constants_they_are(tmp_path):
    # VNN-COMP 2024's LSNC controllers subtract the controller at its fixed point: a MatMul (and a Gemm) of two
    # constants, which the reader once skipped, so the Add reading it was refused as "not computed before it"
    rng = np.random.default_rng(4)
    f32 = np.float32
    inits = {"c": rng.normal(size=(1, 4)).astype(f32), "W": rng.normal(size=(4, 3)).astype(f32),
             "b": rng.normal(size=3).astype(f32), "V": rng.normal(size=(3, 4)).astype(f32),
             "e": rng.normal(size=(1, 3)).astype(f32), "X": rng.normal(size=(5, 3)).astype(f32)}
    nodes = [helper.make_node("MatMul", ["c", "W"], ["cw"]), helper.make_node("Add", ["b", "cw"], ["k"]),
             helper.make_node("Gemm", ["c", "V", "e"], ["g"], transB=1, alpha=0.5, beta=2.0),
             helper.make_node("MatMul", ["x", "X"], ["xw"]), helper.make_node("Sub", ["xw", "k"], ["s"]),
             helper.make_node("Add", ["s", "g"], ["y"])]
    net = _agree(_save(tmp_path, nodes, inits, [1, 5], [1, 3]), (1, 5))
    assert "MatMul" not in _ops(net) and len(net.nodes) <= 4  # the products are constants, only x·X is a variable


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
    assert isinstance(net.nodes[1].op, Conv) and net.nodes[1].op.out_shape == (3, 3, 2)
    assert _ops(net.merged()) == ["Conv", "ReLU", "Linear"]  # BatchNorm folded into the conv


def test_residual_concat_transpose_pool_and_clip_graph(tmp_path):
    """A DAG: conv -> relu -> conv, added to a 1x1-conv shortcut (a residual block), concatenated with its negation,
    transposed, average-pooled, clipped, then a global pool and a Gemm."""
    rng = np.random.default_rng(5)
    f32 = np.float32
    inits = {"w1": rng.normal(size=(4, 2, 3, 3)).astype(f32), "b1": rng.normal(size=4).astype(f32),
             "w2": rng.normal(size=(4, 4, 3, 3)).astype(f32), "b2": rng.normal(size=4).astype(f32),
             "ws": rng.normal(size=(4, 2, 1, 1)).astype(f32), "bs": np.zeros(4, f32),
             "lo": np.array(-0.5, f32), "hi": np.array(2.0, f32),
             "W": rng.normal(size=(8, 3)).astype(f32), "c": rng.normal(size=3).astype(f32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "ws", "bs"], ["sc"]), helper.make_node("Add", ["c2", "sc"], ["res"]),
             helper.make_node("Relu", ["res"], ["r2"]), helper.make_node("Neg", ["r2"], ["n2"]),
             helper.make_node("Concat", ["r2", "n2"], ["cat"], axis=1),
             helper.make_node("Transpose", ["cat"], ["t"], perm=[0, 1, 3, 2]),
             helper.make_node("AveragePool", ["t"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Clip", ["p", "lo", "hi"], ["cl"]), helper.make_node("GlobalAveragePool", ["cl"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]), helper.make_node("Gemm", ["f", "W", "c"], ["y"])]
    net = _agree(_save(tmp_path, nodes, inits, [1, 2, 6, 4], [1, 3]), (1, 2, 6, 4), n=32)
    ops = _ops(net)
    # one Sum, the residual Add: Clip reads as two nested ReLUs
    assert ops.count("Sum") == 1 and "Concat" in ops and "Permute" in ops and ops.count("ReLU") == 4
    assert sorted(len(n.inputs) for n in net.nodes if isinstance(n.op, (Sum, Concat))) == [2, 2]


@pytest.mark.parametrize("gate,kind", [("gelu", "phi"), ("sigmoid", "sigmoid"), ("serf", "serf")])
def test_gate_export_patterns_become_one_gate_with_its_lambda(tmp_path, gate, kind):
    """λ-GELU exports as Mul(λ) -> Gelu -> Div(λ), x·σ(λx) as Mul -> Sigmoid -> Mul, SERF as Mul -> Softplus -> Erf -> Mul:
    each is read back as one Gate with the per-channel λ."""
    rng = np.random.default_rng(6)
    f32 = np.float32
    lam = rng.uniform(1.0, 20.0, (1, 3)).astype(f32)
    inits = {"lam": lam, "W": rng.normal(size=(3, 2)).astype(f32)}
    if gate == "gelu":
        nodes = [helper.make_node("Mul", ["x", "lam"], ["z"]), helper.make_node("Gelu", ["z"], ["g"]),
                 helper.make_node("Div", ["g", "lam"], ["a"])]
    elif gate == "sigmoid":
        nodes = [helper.make_node("Mul", ["x", "lam"], ["z"]), helper.make_node("Sigmoid", ["z"], ["g"]),
                 helper.make_node("Mul", ["x", "g"], ["a"])]
    else:
        nodes = [helper.make_node("Mul", ["x", "lam"], ["z"]), helper.make_node("Softplus", ["z"], ["s"]),
                 helper.make_node("Erf", ["s"], ["g"]), helper.make_node("Mul", ["g", "x"], ["a"])]
    nodes.append(helper.make_node("MatMul", ["a", "W"], ["y"]))
    net = _agree(_save(tmp_path, nodes, inits, [1, 3], [1, 2]), (1, 3))
    gates = [n.op for n in net.nodes if isinstance(n.op, Gate)]
    assert _ops(net) == ["Gate", "Linear"] and gates[0].kind == kind
    np.testing.assert_array_equal(gates[0].lam.numpy(), lam.astype(np.float64).ravel())


def test_unregistered_torch_modules_and_residual_blocks_read_through_their_export():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)
            self.bn, self.act = nn.BatchNorm2d(2), nn.GELU()

        def forward(self, x):
            return self.act(x + self.bn(self.conv2(self.act(self.conv1(x)))))

    class Wrapper(nn.Module):  # not an nn.Sequential: what a user writes
        def __init__(self):
            super().__init__()
            self.norm = Affine(2.0, -1.0)
            self.block = Block()
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * 4 * 4, 3))

        def forward(self, x):
            return self.head(self.block(self.norm(x)))

    torch.manual_seed(0)
    model = Wrapper().eval()
    with torch.no_grad():
        model.block.bn.running_var.uniform_(0.5, 2.0)
        model.block.bn.running_mean.normal_()
    net = from_torch(model, (2, 4, 4))
    assert "Sum" in _ops(net) and sum(isinstance(n.op, Gate) for n in net.nodes) == 2
    x = torch.rand(20, 2, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        ref = model.double()(x).numpy()
    np.testing.assert_allclose(net.forward(x.reshape(20, -1)).numpy(), ref, rtol=0, atol=TORCH_F64_ATOL)


def test_every_registered_gate_model_reads_back(tmp_path):
    from types import SimpleNamespace

    from pipeline.config import GateConfig, ModelConfig
    from pipeline.models import build_model, make_spec

    info = SimpleNamespace(input_shape=(1, 6, 6), num_classes=3, mean=[0.5], std=[0.25])
    torch.manual_seed(1)
    for act in ("lambda_gelu", "gelu", "lambda_swish", "silu", "lambda_serf", "linked_gelu", "relu"):
        model = build_model(make_spec(ModelConfig(name="mlp", hidden=[8, 8]), act, GateConfig(granularity="channel"), info)).eval()
        net = from_torch(model, info.input_shape)
        x = torch.rand(10, 1, 6, 6, dtype=torch.float64)
        with torch.no_grad():
            ref = model.double()(x).numpy()
        np.testing.assert_allclose(net.forward(x.reshape(10, -1)).numpy(), ref, rtol=0, atol=TORCH_F64_ATOL, err_msg=act)


def test_verifier_export_of_a_cnn_reads_back(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 10),
                          nn.ReLU(), nn.Linear(10, 3)).eval()
    x = torch.rand(8, 1, 8, 8)
    export_for_verifiers(model, (1, 8, 8), tmp_path / "cnn.onnx", x)
    net = from_onnx(tmp_path / "cnn.onnx")
    xs = torch.rand(20, 1, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        ref = model.double()(xs).numpy()
    np.testing.assert_allclose(net.forward(xs.reshape(20, -1)).numpy(), ref, atol=1e-5)


def _one_node_model(tmp_path, op, **kw):
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="n3", **kw)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 1, 1])])
    path = tmp_path / "bad.onnx"
    onnx.save(make_model(graph, 20), path)
    return path


@pytest.mark.parametrize("op", ["Hardmax", "LpPool"])
def test_an_op_no_handler_reads_is_one_line_naming_it_and_what_is_read(tmp_path, op):
    path = _one_node_model(tmp_path, op, **({"kernel_shape": [1, 1]} if op == "LpPool" else {}))
    with pytest.raises(UnsupportedModel) as e:
        from_onnx(path)
    msg = str(e.value)
    assert f"unsupported ONNX op {op} (node 'n3')" in msg and "\n" not in msg and "Conv" in msg  # lists what it reads
    assert op not in supported_ops() and (e.value.node, e.value.op) == ("n3", op) and e.value.fix


def test_a_handled_op_in_a_form_it_does_not_read_names_the_form_not_a_contradiction(tmp_path):
    """Gelu is read in its exact and tanh forms only: the message says what was met, never "unsupported ONNX op Gelu"
    followed by a list that contains Gelu."""
    with pytest.raises(UnsupportedModel) as e:
        from_onnx(_one_node_model(tmp_path, "Gelu", approximate="fast"))
    msg = str(e.value)
    assert msg.startswith("Gelu (node 'n3') is not read: ") and "unsupported ONNX op" not in msg and "\n" not in msg
    assert "Gelu" in supported_ops() and e.value.op == "Gelu" and "fast" in e.value.what and e.value.fix


def test_torch_module_it_cannot_read_names_the_op_and_the_module_path():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4), nn.LogSoftmax(-1)))
            self.out = nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.body(x))

    with pytest.raises(UnsupportedModel) as e:
        from_torch(Net(), (2,))
    msg = str(e.value)
    assert "unsupported op LogSoftmax in module 'body.2.1'" in msg and msg.startswith("Net:") and "\n" not in msg


@pytest.mark.parametrize("name,path", [("/net/net.2/fc/Gemm", "net.2.fc"), ("/0/Gemm", "0"), ("/body/body.2/body.2.1/Tanh", "body.2.1"),
                                       ("/Add", "(the model itself)")])
def test_module_path_of_exported_node_names(name, path):
    assert module_path(name) == path


def test_merged_graph_computes_the_same_function_and_keeps_shared_nodes():
    rng = np.random.default_rng(0)
    # input -> Scale -> Linear -> Scale -> ReLU -> Linear ; and a second branch reading the first Linear's output
    nodes_ops = [Scale(rng.uniform(-2, 2, 4), rng.normal(size=4)), Linear(rng.normal(size=(5, 4)), rng.normal(size=5)),
                 Scale(rng.uniform(-2, 2, 5), rng.normal(size=5)), ReLU(5), Linear(rng.normal(size=(2, 5)), np.zeros(2))]
    chain = Graph.sequential((4,), nodes_ops)
    merged = chain.merged()
    assert _ops(merged) == ["Linear", "ReLU", "Linear"]
    x = torch.as_tensor(rng.normal(size=(10, 4)))
    np.testing.assert_allclose(merged.forward(x).numpy(), chain.forward(x).numpy(), atol=1e-12)
    from analysis.verification.graph import Node

    dag = Graph((4,), [Node(nodes_ops[0], (0,)), Node(nodes_ops[1], (1,)), Node(ReLU(5), (2,)),
                       Node(Linear(rng.normal(size=(5, 5)), np.zeros(5)), (3,)), Node(Sum(5), (4, 2))])
    m = dag.merged()  # node 2 feeds the ReLU and the Sum: it must survive, and Scale+Linear fuse into it
    assert _ops(m) == ["Linear", "ReLU", "Linear", "Sum"]
    np.testing.assert_allclose(m.forward(x).numpy(), dag.forward(x).numpy(), atol=1e-12)
