"""The piecewise-linear ONNX activations people export (LeakyRelu, PRelu, Abs, Max, Min, Clip with an upper bound only,
HardSigmoid, HardSwish): the graph read from each computes what onnxruntime computes, and CROWN's bounds through it
(Gemm → op → Gemm over a box) hold at onnxruntime's outputs on points sampled in the box, each side apart."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from _onnx import make_model
from analysis.verification.bounds import Bounder, Spec
from analysis.verification.readers import from_onnx

FLOAT32_ATOL = 1e-5  # onnxruntime computes in float32, the read graph in float64
SOUND_TOL = 1e-5  # the same float32 evaluation, against CROWN's float64 bound
N_IN, HIDDEN, N_OUT = 4, 6, 3


def _net(op: str, attrs: dict, extra: dict[str, np.ndarray], second: str | None = None, opset: int = 17):
    """x → Gemm → op → Gemm; `second` names a second input of the op ("h2": another Gemm of x, else an initializer)."""
    rng = np.random.default_rng(3)
    inits = {"W1": rng.normal(size=(HIDDEN, N_IN)).astype(np.float32) * 2,
             "W3": rng.normal(size=(HIDDEN, N_IN)).astype(np.float32),
             "W2": rng.normal(size=(N_OUT, HIDDEN)).astype(np.float32), **extra}
    nodes = [helper.make_node("Gemm", ["x", "W1"], ["h"], transB=1, name="first")]
    inputs = ["h"]
    if second == "h2":
        nodes.append(helper.make_node("Gemm", ["x", "W3"], ["h2"], transB=1, name="second"))
        inputs.append("h2")
    elif second:
        inputs.append(second)
    nodes += [helper.make_node(op, inputs, ["a"], name="act", **attrs),
              helper.make_node("Gemm", ["a", "W2"], ["y"], transB=1, name="last")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", N_IN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", N_OUT])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return make_model(graph, opset)


CASES = {
    "LeakyRelu": ("LeakyRelu", {"alpha": 0.1}, {}, None),
    "LeakyRelu, slope above 1": ("LeakyRelu", {"alpha": 1.7}, {}, None),
    "PRelu per unit": ("PRelu", {}, {"s": np.linspace(-0.5, 0.5, HIDDEN, dtype=np.float32)}, "s"),
    "PRelu scalar": ("PRelu", {}, {"s": np.array([0.25], dtype=np.float32)}, "s"),
    "Abs": ("Abs", {}, {}, None),
    "Max of two variables": ("Max", {}, {}, "h2"),
    "Min of two variables": ("Min", {}, {}, "h2"),
    "Max with a constant": ("Max", {}, {"c": np.full(HIDDEN, 0.3, dtype=np.float32)}, "c"),
    "Min with a constant": ("Min", {}, {"c": np.full(HIDDEN, -0.2, dtype=np.float32)}, "c"),
    "Clip, upper bound only": ("Clip", {}, {"hi": np.array(0.5, dtype=np.float32)}, None),
    "HardSigmoid (ONNX defaults)": ("HardSigmoid", {}, {}, None),
    "HardSigmoid (torch's 1/6)": ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, {}, None),
    "HardSwish": ("HardSwish", {}, {}, None),
}


def _model(case: str):
    op, attrs, extra, second = CASES[case]
    if case.startswith("Clip"):
        m = _net("Clip", {}, extra, None)
        act = next(n for n in m.graph.node if n.name == "act")
        act.input.extend(["", "hi"])  # Clip(h, min="", max=hi): no lower bound
        return m
    return _net(op, attrs, extra, second)


@pytest.mark.parametrize("case", list(CASES))
def test_read_and_bounded_like_onnxruntime(case):
    model = _model(case)
    net = from_onnx(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    center = rng.uniform(-1, 1, N_IN)
    lb, ub = torch.tensor(center - 0.6), torch.tensor(center + 0.6)
    xs = (center - 0.6 + 1.2 * rng.uniform(size=(2000, N_IN))).astype(np.float32)
    ref = sess.run(None, {"x": xs})[0]
    ours = net.forward(torch.tensor(xs, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(ours, ref, rtol=0, atol=FLOAT32_ATOL * max(1.0, np.abs(ref).max()))
    b = Bounder(net, lb, ub)
    b.crown()
    C = torch.cat([torch.eye(N_OUT, dtype=torch.float64), -torch.eye(N_OUT, dtype=torch.float64)])
    lower = b.spec_bounds(Spec(C, torch.zeros(2 * N_OUT))).numpy()
    vals = np.concatenate([ref, -ref], 1)
    assert (vals >= lower - SOUND_TOL).all(), (case, (vals - lower).min())
    # not vacuous: the bounds are finite and within a few widths of what is reached
    assert np.isfinite(lower).all() and (vals.min(0) - lower).max() < 50


def test_a_prelu_with_a_variable_slope_is_refused_naming_its_node():
    from analysis.verification.ops.base import UnsupportedModel

    with pytest.raises(UnsupportedModel, match="act"):
        from_onnx(_net("PRelu", {}, {}, "h2"))
