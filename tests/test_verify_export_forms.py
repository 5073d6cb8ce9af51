"""The graph forms people export, read against onnxruntime (float32) on sampled inputs: Pad in every opset's form and
mode (a Pad of nothing disappears), Slice with attributes (opset 9) and inputs, ConstantOfShape and constant shape
chains, ConvTranspose, asymmetric and auto_pad Conv padding, Resize and Upsample in nearest mode, standalone
BatchNormalization, opset-11 Softmax; and a refusal names the node that fails, not the one before it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from _onnx import make_model
from analysis.verification.ops.base import UnsupportedModel
from analysis.verification.ops.shape import Select
from analysis.verification.readers import from_onnx

# float32 onnxruntime vs the float64 graph read from the same model
FLOAT32_ATOL = 1e-5


def _model(nodes, inits, in_shape, opset, out_shape=None):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()])
    model = make_model(graph, opset)
    onnx.checker.check_model(model) if out_shape is not None else None
    return model


def _agree(model, shape, n=8, seed=0):
    """The graph read from `model` against onnxruntime on `n` uniform inputs in [-1, 1]; returns the graph."""
    net = from_onnx(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    for x in rng.uniform(-1, 1, (n, int(np.prod(shape)))).astype(np.float32):
        ref = sess.run(None, {"x": x.reshape(shape)})[0].ravel()
        np.testing.assert_allclose(net.forward(x.astype(np.float64)).numpy(), ref, rtol=0, atol=FLOAT32_ATOL)
    return net


def _conv_pad_pool(opset: int, pads: list[int] | None) -> onnx.ModelProto:
    """What torch.onnx writes for Conv → ReLU → ZeroPad2d → AvgPool → Flatten, the Pad in this opset's form (None:
    no Pad)."""
    rng = np.random.default_rng(1)
    inits = {"w": rng.normal(size=(4, 2, 3, 3)).astype(np.float32), "b": rng.normal(size=4).astype(np.float32)}
    if pads is None:
        pad = helper.make_node("Identity", ["r"], ["p"])
    elif opset < 11:
        pad = helper.make_node("Pad", ["r"], ["p"], name="Pad_2", pads=pads, mode="constant", value=0.0)
    else:
        inits["pads"] = np.array(pads, np.int64)
        pad = helper.make_node("Pad", ["r", "pads"], ["p"], name="Pad_2", mode="constant")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]), pad,
             helper.make_node("AveragePool", ["p"], ["a"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["a"], ["y"])]
    return _model(nodes, inits, [1, 2, 4, 4], opset)


@pytest.mark.parametrize("opset", [9, 11, 13, 18])
def test_a_pad_of_nothing_disappears(opset):
    """A no-op Pad before average pooling (PyTorch's export of a conv net) is read as if it were not there: the same
    ops as the net without it, and onnxruntime's values."""
    net = _agree(_conv_pad_pool(opset, [0] * 8), (1, 2, 4, 4))
    without = from_onnx(_conv_pad_pool(opset, None))
    assert [type(n.op).__name__ for n in net.nodes] == [type(n.op).__name__ for n in without.nodes]


@pytest.mark.parametrize("opset", [9, 11, 18])
@pytest.mark.parametrize("pads", [[0, 0, 1, 0, 0, 0, 0, 1], [0, 0, 1, 1, 0, 0, 1, 1], [0, 0, -1, 0, 0, 0, 1, -1]])
def test_constant_pads_are_read_at_every_opset(opset, pads):
    net = _agree(_conv_pad_pool(opset, pads), (1, 2, 4, 4))
    assert any(isinstance(n.op, Select) for n in net.nodes)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes_and_axes(mode):
    """Opset 19: a nonzero constant value, the axes input, and the modes that pick units of the input."""
    inits = {"pads": np.array([1, 2, 2, 1], np.int64), "v": np.array(0.75, np.float32), "axes": np.array([2, 3], np.int64)}
    node = helper.make_node("Pad", ["x", "pads", "v" if mode == "constant" else "", "axes"], ["y"], mode=mode)
    _agree(_model([node], inits, [1, 2, 3, 4], 19), (1, 2, 3, 4))


@pytest.mark.parametrize("opset", [9, 10, 13])
def test_slice_of_every_opset_and_a_constant_of_shape(opset):
    """The ViT export's opset-9 form: Slice with starts/ends/axes attributes on a variable and on a Shape (folded),
    ConstantOfShape of a folded shape chain (Shape → Gather → Unsqueeze → Concat) added to a class token."""
    rng = np.random.default_rng(2)
    inits = {"zero": np.array(0, np.int64), "one": np.array([1], np.int64), "tok": rng.normal(size=(1, 1, 5)).astype(np.float32),
             "minus": np.array([-1], np.int64)}
    if opset < 10:
        sl = helper.make_node("Slice", ["x"], ["s"], starts=[1], ends=[3], axes=[1])
        shp = helper.make_node("Slice", ["sh"], ["sh2"], starts=[0], ends=[2], axes=[0])
        unsq = helper.make_node("Unsqueeze", ["g"], ["u"], axes=[0])
    else:
        inits.update({"st": np.array([1, -1], np.int64), "en": np.array([3, -6], np.int64), "ax": np.array([1, 2], np.int64),
                      "sp": np.array([1, -2], np.int64), "s0": np.array([0], np.int64), "e2": np.array([2], np.int64)})
        sl = helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"])  # rows 1..2, columns 4, 2 (reversed)
        shp = helper.make_node("Slice", ["sh", "s0", "e2", "s0"], ["sh2"])
        unsq = (helper.make_node("Unsqueeze", ["g", "s0"], ["u"]) if opset >= 13
                else helper.make_node("Unsqueeze", ["g"], ["u"], axes=[0]))
    width = 5 if opset < 10 else 3  # the sliced tensor's last axis: the class token's width
    inits["tok"], inits["w"] = inits["tok"][..., :width], np.array([width], np.int64)
    nodes = [sl, helper.make_node("Shape", ["s"], ["sh"]), shp, helper.make_node("Gather", ["sh", "zero"], ["g"]), unsq,
             helper.make_node("Concat", ["u", "one", "w"], ["cs"], axis=0),
             helper.make_node("ConstantOfShape", ["cs"], ["z"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0])),
             helper.make_node("Add", ["z", "tok"], ["cls"]), helper.make_node("Concat", ["cls", "s"], ["y"], axis=1)]
    _agree(_model(nodes, inits, [1, 4, 5], opset), (1, 4, 5))


@pytest.mark.parametrize("kw", [dict(strides=[2, 2]), dict(strides=[2, 2], pads=[1, 0, 1, 1], output_padding=[1, 0]),
                                dict(strides=[1, 2], dilations=[2, 1], group=2),
                                dict(strides=[2, 2], auto_pad="SAME_UPPER"), dict(strides=[3, 2], output_shape=[8, 7])])
def test_conv_transpose(kw):
    rng = np.random.default_rng(3)
    g = kw.get("group", 1)
    inits = {"w": rng.normal(size=(4, 3, 3, 2)).astype(np.float32), "b": rng.normal(size=3 * g).astype(np.float32)}
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **kw)
    _agree(_model([node], inits, [1, 4, 3, 3], 17), (1, 4, 3, 3))


@pytest.mark.parametrize("kw", [dict(pads=[0, 1, 1, 0]), dict(auto_pad="SAME_UPPER", strides=[2, 2]),
                                dict(auto_pad="SAME_LOWER"), dict(auto_pad="VALID")])
def test_conv_asymmetric_and_auto_padding(kw):
    rng = np.random.default_rng(4)
    inits = {"w": rng.normal(size=(3, 2, 2, 3)).astype(np.float32)}
    _agree(_model([helper.make_node("Conv", ["x", "w"], ["y"], **kw)], inits, [1, 2, 5, 5], 17), (1, 2, 5, 5))


@pytest.mark.parametrize("opset,kw,scales,sizes", [
    (11, dict(mode="nearest"), [1, 1, 2, 2], None),
    (13, dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"), [1, 1, 1.5, 2.5], None),
    (13, dict(mode="nearest", coordinate_transformation_mode="align_corners", nearest_mode="round_prefer_ceil"), None, [1, 2, 5, 7]),
    (19, dict(mode="nearest", coordinate_transformation_mode="half_pixel_symmetric", nearest_mode="ceil"), [1, 1, 0.6, 1.4], None),
])
def test_resize_nearest(opset, kw, scales, sizes):
    inits = {"roi": np.zeros(0, np.float32)}
    names = ["x", "roi"]
    if scales is not None:
        inits["scales"] = np.array(scales, np.float32)
        names.append("scales")
    else:
        inits["sizes"] = np.array(sizes, np.int64)
        names += ["", "sizes"]
    _agree(_model([helper.make_node("Resize", names, ["y"], **kw)], inits, [1, 2, 3, 4], opset), (1, 2, 3, 4))


def test_upsample_nearest_opset9():
    inits = {"scales": np.array([1, 1, 2, 3], np.float32)}
    _agree(_model([helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")], inits, [1, 2, 2, 3], 9), (1, 2, 2, 3))


def test_resize_linear_is_refused_naming_its_node():
    inits = {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)}
    model = _model([helper.make_node("Resize", ["x", "roi", "scales"], ["y"], name="up", mode="linear")], inits, [1, 2, 3, 4], 13)
    with pytest.raises(UnsupportedModel) as e:
        from_onnx(model)
    assert str(e.value).startswith("Resize (node 'up') is not read: mode 'linear'") and "nearest" in str(e.value)


@pytest.mark.parametrize("opset", [9, 15])
def test_batchnorm_standalone_on_tokens_and_images(opset):
    """BatchNorm1d on tokens (the ViT's [1, C, T]) and BatchNorm2d on an image, each alone in its graph."""
    rng = np.random.default_rng(5)
    for shape in ([1, 3, 4], [1, 3, 2, 2]):
        inits = {"g": rng.uniform(0.5, 1.5, 3), "b": rng.normal(size=3), "m": rng.normal(size=3), "v": rng.uniform(0.5, 2, 3)}
        inits = {k: v.astype(np.float32) for k, v in inits.items()}
        node = helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], epsilon=1e-3)
        _agree(_model([node], inits, shape, opset), tuple(shape))


@pytest.mark.parametrize("axis", [1, 2])
def test_softmax_before_opset13_flattens_the_axes_from_axis_on(axis):
    _agree(_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], {}, [1, 2, 3, 2], 11), (1, 2, 3, 2))


def test_refusal_names_the_node_that_fails_not_its_input():
    """A sigmoid MLP is read (onnxruntime's values); with a second Gemm the reader does not take (its input
    transposed), the refusal names that Gemm, not the Sigmoid before it."""
    rng = np.random.default_rng(6)
    inits = {"W1": rng.normal(size=(3, 4)).astype(np.float32), "W2": rng.normal(size=(2, 3)).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "W1"], ["h"], name="Gemm_5", transB=1),
             helper.make_node("Sigmoid", ["h"], ["s"], name="Sigmoid_6"),
             helper.make_node("Gemm", ["s", "W2"], ["y"], name="Gemm_7", transB=1)]
    _agree(_model(nodes, inits, [1, 4], 13), (1, 4))
    nodes[2] = helper.make_node("Gemm", ["s", "W2"], ["y"], name="Gemm_7", transA=1, transB=1)
    with pytest.raises(UnsupportedModel) as e:
        from_onnx(_model(nodes, {**inits, "W2": inits["W2"][:, :1]}, [1, 4], 13))
    assert str(e.value).startswith("Gemm (node 'Gemm_7') is not read: ") and e.value.node == "Gemm_7"
    assert "\n" not in str(e.value)


# -- every op of ONNX opsets 9–21, older and newer forms: read, or refused in one line naming the node ------------

def _attribute(attr):
    """A value for a required attribute, by its type (None: a type built here no value for, a graph)."""
    t = onnx.defs.OpSchema.AttrType
    return {t.INT: 1, t.INTS: [1], t.FLOAT: 1.0, t.FLOATS: [1.0], t.STRING: "", t.STRINGS: [""],
            t.TENSOR: numpy_helper.from_array(np.ones(1, np.float32))}.get(attr.type)


def _second_input(formal, k: int) -> np.ndarray:
    """A constant for input k of the op: a float tensor of x's shape where floats are taken, else int64 ones."""
    types = set(formal.types)
    if "tensor(float)" in types or not types:
        return np.random.default_rng(k).uniform(0.5, 1.5, (1, 3, 4, 4)).astype(np.float32)
    if "tensor(int64)" in types:
        return np.ones(1, np.int64)
    if "tensor(bool)" in types:
        return np.ones((1, 3, 4, 4), bool)
    return np.ones(1, np.int32)


def _forms():
    """(op, opset, variant) for every op of the default domain in every version from opset 9 to 21."""
    out = []
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain not in ("", "ai.onnx") or s.since_version > 21:
            continue
        opset = max(9, s.since_version)
        try:
            if onnx.defs.get_schema(s.name, opset).since_version != s.since_version:
                continue  # superseded before opset 9
        except onnx.defs.SchemaError:
            continue
        out += [(s.name, opset, v) for v in ("constants", "variable", "alone")]
    return sorted(out)


def _one_node(op: str, opset: int, variant: str) -> onnx.ModelProto:
    """Op `op` at `opset` on the float input x [1, 3, 4, 4]; its other required inputs constants of their types
    ("constants"), x itself ("variable"), or left out ("alone")."""
    schema = onnx.defs.get_schema(op, opset)
    formals = schema.inputs
    names, inits = [], {}
    for k, f in enumerate(formals):
        optional = f.option == onnx.defs.OpSchema.FormalParameterOption.Optional
        count = 2 if f.option == onnx.defs.OpSchema.FormalParameterOption.Variadic else 1
        for j in range(count):
            if k == 0 and j == 0:
                names.append("x")
            elif optional or variant == "alone":
                break
            elif variant == "variable":
                names.append("x")
            else:
                names.append(f"c{k}_{j}")
                inits[f"c{k}_{j}"] = _second_input(f, k)
    attrs = {name: v for name, a in schema.attributes.items() if a.required and (v := _attribute(a)) is not None}
    outs = ["y"] + [f"o{k}" for k in range(1, max(1, schema.min_output))]
    node = helper.make_node(op, names, outs, name=f"node_{op}", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


FORMS = _forms()


def test_every_op_of_opsets_9_to_21_is_read_or_refused_in_one_line_naming_its_node():
    """No reader path raises anything but UnsupportedModel, and its one line names the node (here the only one)."""
    assert len({f[0] for f in FORMS}) > 150  # every op of the default domain, not a sample
    crashed = []
    for op, opset, variant in FORMS:
        try:
            from_onnx(_one_node(op, opset, variant))
        except UnsupportedModel as e:
            msg = str(e)
            if f"'node_{op}'" not in msg or "\n" in msg:
                crashed.append(f"{op}@{opset}/{variant}: refusal without its node: {msg[:160]}")
        except Exception as e:  # noqa: BLE001 - what is asserted is that nothing else escapes
            crashed.append(f"{op}@{opset}/{variant}: {type(e).__name__}: {str(e)[:160]}")
    assert not crashed, "\n".join(crashed)


SOUND_TOL = 1e-5  # onnxruntime's float32 outputs against CROWN's float64 bounds


def _bounds_hold(model, shape, radius=0.5, n=2000, seed=0):
    """The graph read from `model` equals onnxruntime on `n` points of a box, and CROWN's bounds over the box hold at
    them, each side apart (and are finite)."""
    import torch

    from analysis.verification.bounds import Bounder, Spec

    net = from_onnx(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    center = rng.uniform(-1, 1, size)
    xs = (center - radius + 2 * radius * rng.uniform(size=(n, size))).astype(np.float32)
    ref = np.stack([sess.run(None, {"x": x.reshape(shape)})[0].ravel() for x in xs])
    ours = net.forward(torch.tensor(xs, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(ours, ref, rtol=0, atol=FLOAT32_ATOL * max(1.0, np.abs(ref).max()))
    b = Bounder(net, torch.tensor(center - radius), torch.tensor(center + radius))
    b.crown()
    k = ref.shape[1]
    eye = torch.eye(k, dtype=torch.float64)
    lower = b.spec_bounds(Spec(torch.cat([eye, -eye]), torch.zeros(2 * k))).numpy()
    assert np.isfinite(lower).all()
    assert (ref >= lower[:k] - SOUND_TOL).all(), (ref - lower[:k]).min()  # lower bounds
    assert (-ref >= lower[k:] - SOUND_TOL).all(), (-ref - lower[k:]).min()  # upper bounds
    return net


@pytest.mark.parametrize("kw,out_len", [(dict(), 6), (dict(pads=[1, 2], strides=[2]), 5), (dict(dilations=[2], pads=[2, 2]), 8),
                                        (dict(auto_pad="SAME_UPPER", strides=[2]), 4), (dict(group=2), 6)])
def test_conv_1d_is_a_2d_conv_of_height_1(kw, out_len):
    """A 1-d Conv (nn4sys' pensieve nets), then a ReLU and a Gemm: read and bounded as a 2-d one over a height of 1."""
    rng = np.random.default_rng(5)
    w = rng.normal(size=(4, 4 // kw.get("group", 1), 3)).astype(np.float32)
    inits = {"w": w, "b": rng.normal(size=4).astype(np.float32), "W2": rng.normal(size=(3, 4 * out_len)).astype(np.float32),
             "shape": np.array([1, -1], dtype=np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv1d", **kw), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]), helper.make_node("Gemm", ["f", "W2"], ["y"], transB=1)]
    _bounds_hold(_model(nodes, inits, [1, 4, 8], 17), (1, 4, 8))


def test_pow_3_is_read_as_a_product_and_bounded():
    """x³ (nn4sys' pensieve_*_parallel nets) through Gemm → Pow 3 → Gemm, on a box across 0 (x³ changes curvature)."""
    rng = np.random.default_rng(6)
    inits = {"W1": rng.normal(size=(5, 3)).astype(np.float32), "W2": rng.normal(size=(2, 5)).astype(np.float32),
             "p": np.array(3.0, dtype=np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "W1"], ["h"], transB=1), helper.make_node("Pow", ["h", "p"], ["c"], name="cube"),
             helper.make_node("Gemm", ["c", "W2"], ["y"], transB=1)]
    _bounds_hold(_model(nodes, inits, [1, 3], 17), (1, 3), radius=0.8)


@pytest.mark.parametrize("shape", [[3], [3, 2]])
def test_a_constant_times_a_variable_is_read(shape):
    """W·x with W a constant (2021 nn4sys: MatMul(W, x) on a 1-d input), then ReLU and another W·x."""
    rng = np.random.default_rng(7)
    inits = {"W1": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=[4] + shape[1:]).astype(np.float32),
             "W2": rng.normal(size=(2, 4)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["W1", "x"], ["m"], name="wx"), helper.make_node("Add", ["m", "b"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["W2", "r"], ["y"])]
    _bounds_hold(_model(nodes, inits, shape, 17), tuple(shape))


# CROWN's interval of each output on a box of radius 0.3, at most this many times the spread of onnxruntime's outputs
# at 2000 points of it (measured: the tanh form read as its formula 1.29-1.52×, the exact GELU's gate 1.17-1.25×)
GELU_WIDTH_RATIO = 2.0


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_opset20_gelu_in_both_forms_is_read_and_bounded(approximate):
    """ONNX Gelu (opset 20) with approximate="tanh" (read as its formula: x³ as x·x², a sigmoid, a product) and "none"
    (the exact GELU gate) between two Gemms: equal to onnxruntime at 2000 points of a box across 0, CROWN's bounds hold
    there each side apart, and they are not vacuous."""
    import torch

    from analysis.verification.bounds import Bounder, Spec

    rng = np.random.default_rng(8)
    inits = {"W1": rng.normal(size=(6, 3)).astype(np.float32), "b1": rng.normal(size=6).astype(np.float32),
             "W2": rng.normal(size=(2, 6)).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"], transB=1),
             helper.make_node("Gelu", ["h"], ["g"], name="gelu", approximate=approximate),
             helper.make_node("Gemm", ["g", "W2"], ["y"], transB=1)]
    model = _model(nodes, inits, [1, 3], 20, [1, 2])
    net = _bounds_hold(model, (1, 3), radius=0.8)
    kinds = {type(node.op).__name__ for node in net.nodes}
    assert ("Product" in kinds and "Smooth" in kinds) if approximate == "tanh" else "Gate" in kinds
    # tightness on a small box, against onnxruntime's spread there
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    center, radius = rng.uniform(-1, 1, 3), 0.3
    xs = (center - radius + 2 * radius * rng.uniform(size=(2000, 3))).astype(np.float32)
    ref = np.stack([sess.run(None, {"x": x[None]})[0].ravel() for x in xs])
    b = Bounder(net, torch.tensor(center - radius), torch.tensor(center + radius))
    b.crown()
    eye = torch.eye(2, dtype=torch.float64)
    low = b.spec_bounds(Spec(torch.cat([eye, -eye]), torch.zeros(4))).numpy()
    width = -low[2:] - low[:2]
    assert (width <= GELU_WIDTH_RATIO * (ref.max(0) - ref.min(0))).all(), (width, ref.max(0) - ref.min(0))
