"""The verifiers' form (`quantize.verifier_form`, written by `export_for_verifiers` into a run's verify/onnx/), by node
and attribute counts: no BatchNormalization `training_mode`, no constant below its variable's rank, no Constant node,
opset 17, the input normalization folded into an unpadded first Conv or made a 1×1 Conv, a BatchNorm after its Conv
folded. Each rewrite keeps the function (onnxruntime against float64 torch) and our reader's bounds. Which other
tools read the form is a benchmark with a committed record (benchmarks/peers/readers.py): their venvs are not CI's."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from _modules import Affine
from _onnx import make_model
from analysis.verification.bounds import Bounder, Spec
from analysis.verification.readers import from_onnx
from pipeline.opset import VERIFIERS_OPSET
from quantize import verifier_form
from quantize.export import ExportError, export_for_verifiers, save, to_onnx, verifier_model

pytestmark = pytest.mark.usefixtures("one_thread")

# onnxruntime float32 against the float64 torch model on inputs in [0, 1] (logits of order 1)
FLOAT32_ATOL = 1e-5
# our CROWN bounds on the old and new form of one network: the same function up to float32 weight rounding
BOUND_ATOL = 1e-5


class PreAct(nn.Module):
    """Normalize → padded stem Conv → a pre-activation block (BN → ReLU → Conv → BN → ReLU → Conv, + skip) →
    BN → ReLU → Conv → BN (folded into that Conv) → global average pool → Linear: every BatchNorm placement of
    the built-in residual networks."""

    def __init__(self, c: int = 2):
        super().__init__()
        self.norm = Affine(torch.tensor([4.0, 2.0])[:c].reshape(c, 1, 1), torch.tensor([-2.0, -0.5])[:c].reshape(c, 1, 1))
        self.stem = nn.Conv2d(c, 4, 3, padding=1, bias=False)
        self.bn1, self.conv1, self.bn2, self.conv2 = nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3, padding=1)
        self.bn3, self.conv3, self.bn4 = nn.BatchNorm2d(4), nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = self.stem(self.norm(x))
        h = h + self.conv2(torch.relu(self.bn2(self.conv1(torch.relu(self.bn1(h))))))
        h = self.bn4(self.conv3(torch.relu(self.bn3(h))))
        return self.head(h.mean((2, 3)))


class Patches(nn.Module):
    """Normalize → an unpadded strided (grouped) Conv, a ViT's patch embedding → ReLU → Linear."""

    def __init__(self, groups: int = 1):
        super().__init__()
        self.norm = Affine(torch.tensor([4.0, 2.0]).reshape(2, 1, 1), torch.tensor([-2.0, -0.5]).reshape(2, 1, 1))
        self.patch = nn.Conv2d(2, 4, 4, stride=4, groups=groups)
        self.head = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        return self.head(torch.relu(self.patch(self.norm(x))).flatten(1))


def _randomize_batchnorm(model: nn.Module) -> nn.Module:
    gen = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=gen) * 0.2)
            m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=gen) * 0.2)
    return model.eval()


def _export(model: nn.Module, tmp_path, name: str) -> tuple[onnx.ModelProto, dict, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.rand(16, 2, 8, 8)
    facts = export_for_verifiers(model, (2, 8, 8), tmp_path / f"{name}.onnx", x)
    return onnx.load(str(tmp_path / f"{name}.onnx")), facts, x


def _ops(proto: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in proto.graph.node)


def _agrees_with_float64(path, model: nn.Module, x: torch.Tensor) -> None:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = np.concatenate([sess.run(None, {"input": x[i:i + 1].numpy()})[0] for i in range(len(x))])
    with torch.no_grad():
        ref = model.double()(x.double()).numpy()
    model.float()
    np.testing.assert_allclose(got, ref, rtol=0, atol=FLOAT32_ATOL)


def _ranks(proto: onnx.ModelProto) -> list[tuple[str, int, int]]:
    """(op, constant's rank, variable's rank) of every elementwise op with one constant operand."""
    inferred = onnx.shape_inference.infer_shapes(proto)
    rank = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in [*inferred.graph.value_info, *inferred.graph.input]}
    init = {t.name: len(t.dims) for t in proto.graph.initializer}
    out = []
    for n in proto.graph.node:
        if n.op_type in verifier_form.ELEMENTWISE:
            consts = [i for i in n.input if i in init]
            vars_ = [i for i in n.input if i not in init]
            if len(consts) == 1 and len(vars_) == 1:
                out.append((n.op_type, init[consts[0]], rank[vars_[0]]))
    return out


def test_a_residual_network_has_no_training_mode_no_free_constant_and_folded_batchnorms(tmp_path):
    model = _randomize_batchnorm(PreAct())
    proto, facts, x = _export(model, tmp_path, "preact")
    ops = _ops(proto)
    # bn2 and bn4 follow their Conv alone and fold into it; bn1 and bn3 read a residual stream (the stem's output,
    # the block's sum) and stay, without the attribute onnx2pytorch refuses
    assert ops["BatchNormalization"] == 2 and facts["verifier_form"]["training_mode_dropped"] == 2
    assert not any(a.name == "training_mode" for n in proto.graph.node for a in n.attribute)
    # the normalization under a padded stem: one 1x1 Conv of weight diag(scale), bias shift, reading the input
    first = next(n for n in proto.graph.node if "input" in n.input)
    assert first.op_type == "Conv" and facts["verifier_form"]["normalization"] == "conv1x1"
    w = numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == first.input[1]))
    np.testing.assert_array_equal(w[:, :, 0, 0], np.diag([4.0, 2.0]).astype(np.float32))
    assert ops["Conv"] == 1 + 4 and ops["Mul"] == 0 and ops["Constant"] == 0
    assert all(c == v for _, c, v in _ranks(proto)), _ranks(proto)
    assert proto.opset_import[0].version == VERIFIERS_OPSET
    _agrees_with_float64(tmp_path / "preact.onnx", model, x)


@pytest.mark.parametrize("groups", [1, 2])
def test_the_normalization_folds_into_an_unpadded_first_conv(tmp_path, groups):
    model = Patches(groups).eval()
    proto, facts, x = _export(model, tmp_path, f"patches{groups}")
    assert facts["verifier_form"]["normalization"] == "folded"
    assert next(n for n in proto.graph.node if "input" in n.input).op_type == "Conv"
    assert _ops(proto)["Conv"] == 1 and _ops(proto)["Mul"] == 0 and _ops(proto)["Add"] == 0
    _agrees_with_float64(tmp_path / f"patches{groups}.onnx", model, x)


def _crown_output_bounds(path, lb: np.ndarray, ub: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    net = from_onnx(path)
    b = Bounder(net, lb, ub)
    b.crown()
    eye = torch.eye(net.num_outputs, dtype=torch.float64)
    return b.spec_bounds(Spec(eye, torch.zeros(net.num_outputs))).numpy(), -b.spec_bounds(Spec(-eye, torch.zeros(net.num_outputs))).numpy()


@pytest.mark.parametrize("make", [lambda: _randomize_batchnorm(PreAct()), lambda: Patches(2).eval()], ids=["padded", "unpadded"])
def test_our_reader_bounds_the_new_form_as_it_bounds_the_old(tmp_path, make):
    # the old form: what export_for_verifiers wrote before the verifiers' form (opset 20, Mul/Add, training_mode)
    model = make()
    proto, _, x = _export(model, tmp_path, "new")
    old, _ = to_onnx(verifier_model(model, (2, 8, 8)), x[:1], 20, simplify=True, dynamic_batch=False)
    save(old, tmp_path / "old.onnx")
    assert _ops(old)["Mul"] == 1 and _ops(proto)["Mul"] == 0
    x0 = x[0].numpy().reshape(-1).astype(np.float64)
    lb, ub = np.clip(x0 - 0.01, 0, 1), np.clip(x0 + 0.01, 0, 1)
    lo_old, hi_old = _crown_output_bounds(tmp_path / "old.onnx", lb, ub)
    lo_new, hi_new = _crown_output_bounds(tmp_path / "new.onnx", lb, ub)
    assert np.all(hi_old - lo_old > 1e-3)  # a box wide enough that the bounds are not the point itself
    np.testing.assert_allclose(lo_new, lo_old, rtol=0, atol=BOUND_ATOL)
    np.testing.assert_allclose(hi_new, hi_old, rtol=0, atol=BOUND_ATOL)


def _graph(nodes, inits, in_shape, out_shape, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits.items()])
    return make_model(graph, opset)


def _run(proto, x):
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


def test_constants_become_initializers_at_their_variables_rank():
    # a Constant scalar shared by a 4-D and a 3-D product, a per-pixel normalization (not foldable: stays Mul/Add)
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
             helper.make_node("Mul", ["input", "s"], ["a"]), helper.make_node("Add", ["a", "t"], ["b"]),
             helper.make_node("Mul", ["b", "k"], ["c"]), helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("Reshape", ["d", "shape"], ["e"]), helper.make_node("Mul", ["e", "k"], ["logits"])]
    inits = {"s": rng.uniform(1, 2, (1, 3, 3)), "t": rng.normal(size=(1, 3, 3))}
    proto = _graph(nodes, inits, [1, 1, 3, 3], [1, 3, 3])
    proto.graph.initializer.append(numpy_helper.from_array(np.array([1, 3, 3], np.int64), "shape"))
    x = rng.uniform(0, 1, (1, 1, 3, 3)).astype(np.float32)
    out, facts = verifier_form.to_verifier_form(proto, (1, 3, 3))
    onnx.checker.check_model(out, full_check=True)
    assert _ops(out)["Constant"] == 0 and facts["constants_to_initializers"] == 1
    assert facts["normalization"] is None  # a scale per pixel has no single weight per channel
    assert sorted(_ranks(out)) == [("Add", 4, 4), ("Mul", 3, 3), ("Mul", 4, 4), ("Mul", 4, 4)]
    np.testing.assert_array_equal(_run(out, x), _run(proto, x))


def test_a_batchnorm_in_training_mode_is_refused():
    nodes = [helper.make_node("BatchNormalization", ["input", "g", "b", "m", "v"], ["logits"], training_mode=1)]
    proto = _graph(nodes, {"g": np.ones(2), "b": np.zeros(2), "m": np.zeros(2), "v": np.ones(2)}, [1, 2, 2, 2], [1, 2, 2, 2])
    with pytest.raises(ExportError, match="training mode; export the model in eval mode"):
        verifier_form.to_verifier_form(proto, (2, 2, 2))


def test_the_signature_follows_the_form_not_the_weights(tmp_path):
    a, _, _ = _export(_randomize_batchnorm(PreAct()), tmp_path, "a")
    torch.manual_seed(5)
    b, _, _ = _export(_randomize_batchnorm(PreAct()), tmp_path, "b")
    old, _ = to_onnx(verifier_model(PreAct().eval(), (2, 8, 8)), torch.rand(1, 2, 8, 8), 20, simplify=True, dynamic_batch=False)
    assert verifier_form.signature(a) == verifier_form.signature(b) != verifier_form.signature(old)


def test_a_transformers_layer_norms_and_qkv_split_are_written_in_primitive_ops(tmp_path):
    """The tiny deit (`coverage.TINY`): LayerNormalization written as ReduceMean/Sub/Mul/ReduceMean/Add/Sqrt/Div and
    Mul γ, Add β (α,β-CROWN's loader has no LayerNormalization), the q/k/v Split and Squeeze as Slices of the qkv
    projection (auto_LiRPA miscounts a traced split and refuses to squeeze axis 0); onnxruntime still computes the
    float64 torch model, and our reader fuses each LayerNorm back, so its bounds are those of the old form."""
    from analysis.robustness import coverage

    model, shape, x = coverage._build("deit_tiny", "relu")
    facts = export_for_verifiers(model, shape, tmp_path / "new.onnx", x)
    new = onnx.load(str(tmp_path / "new.onnx"))
    ops = _ops(new)
    assert facts["verifier_form"]["layer_norms_written_out"] == 3 and facts["verifier_form"]["splits_as_slices"] == 1
    assert not ops & Counter({"LayerNormalization": 1, "Split": 1, "Squeeze": 1}) and ops["Sqrt"] == 3 and ops["Slice"] == 3
    _agrees_with_float64(tmp_path / "new.onnx", model, x)
    old, _ = to_onnx(verifier_model(model, shape), x[:1], 20, simplify=True, dynamic_batch=False)
    save(old, tmp_path / "old.onnx")
    assert _ops(old)["LayerNormalization"] == 3
    net = from_onnx(tmp_path / "new.onnx")
    assert sum(type(n.op).__name__ == "Variance" for n in net.nodes) == 3  # each LayerNorm read as the op
    x0 = x[0].numpy().reshape(-1).astype(np.float64)
    lb, ub = x0 - 0.002, x0 + 0.002
    lo_old, hi_old = _crown_output_bounds(tmp_path / "old.onnx", lb, ub)
    lo_new, hi_new = _crown_output_bounds(tmp_path / "new.onnx", lb, ub)
    np.testing.assert_allclose(lo_new, lo_old, rtol=0, atol=BOUND_ATOL)
    np.testing.assert_allclose(hi_new, hi_old, rtol=0, atol=BOUND_ATOL)


def test_a_layer_norm_exported_as_its_ops_is_read_as_the_op(tmp_path):
    """nn.LayerNorm exported at opset 16 (ReduceMean, Sub, Pow 2, ReduceMean, Add ε, Sqrt, Div, Mul γ, Add β) is read
    as one LayerNorm (its `Variance` node), with the bounds of the opset-17 LayerNormalization op, which hold at 2000
    points of the box in onnxruntime."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 4), nn.LayerNorm(4), nn.ReLU(), nn.Linear(4, 3)).eval()
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.5, 0.5)
    paths = {}
    for opset in (16, 17):
        proto, _ = to_onnx(model, torch.zeros(1, 6), opset, simplify=True, dynamic_batch=False)
        paths[opset] = tmp_path / f"ln{opset}.onnx"
        save(proto, paths[opset])
    assert _ops(onnx.load(str(paths[16])))["LayerNormalization"] == 0 and _ops(onnx.load(str(paths[17])))["LayerNormalization"] == 1
    assert sum(type(n.op).__name__ == "Variance" for n in from_onnx(paths[16]).nodes) == 1
    x0 = np.random.default_rng(0).uniform(-1, 1, 6)
    lb, ub = x0 - 0.2, x0 + 0.2
    lo16, hi16 = _crown_output_bounds(paths[16], lb, ub)
    lo17, hi17 = _crown_output_bounds(paths[17], lb, ub)
    np.testing.assert_allclose(lo16, lo17, rtol=0, atol=BOUND_ATOL)
    np.testing.assert_allclose(hi16, hi17, rtol=0, atol=BOUND_ATOL)
    xs = (lb + (ub - lb) * np.random.default_rng(1).uniform(size=(2000, 6))).astype(np.float32)
    sess = ort.InferenceSession(str(paths[16]), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    ys = np.concatenate([sess.run(None, {name: xs[i:i + 1]})[0] for i in range(len(xs))])
    assert (ys >= lo16 - FLOAT32_ATOL).all() and (ys <= hi16 + FLOAT32_ATOL).all()
