"""MaxPool in the verification engine (`readers.pooling.maxpool`): each window's max as a tree of max(a, b) = a + ReLU(b − a).

- the graph read from ONNX computes what onnxruntime computes, for every form read (kernel, stride, symmetric and
  asymmetric pads, dilation, GlobalMaxPool, a 1×1 window), and a torch module's nn.MaxPool2d through `from_torch`;
- interval arithmetic through the tree is the exact range of a max over a box (`ops.PairMax`), CROWN's bounds contain
  it and equal it where every window's winner is decided;
- a conv net with MaxPool exported by the project's export path: CROWN's output bounds contain onnxruntime's outputs
  at dense samples of each box, the lower side and the upper side checked apart;
- branch and bound and the MILP decide properties as an exhaustive enumeration of the windows' winners does;
- its int8 model (the int8 stage's recipe, Q/DQ around the MaxPool) read, and sound by sampling;
- the swap gap through the pool holds by sampling the smooth and ReLU networks;
- the forms not read are refused in one line naming the form and the fix.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper

from analysis.verification import milp
from analysis.verification.bab import Settings, bab
from analysis.verification.bounds import Bounder, Spec
from analysis.verification.gap import swap_gap
from analysis.verification.ops.base import UnsupportedModel
from analysis.verification.ops.pooling import PairMax, Pool
from analysis.verification.ops.relu import ReLU
from analysis.verification.readers import from_onnx, from_torch, supported_ops
from analysis.verification.vnnlib import robustness_spec
from pipeline.config import Config
from quantize import ort as ort_util
from quantize.export import export_for_verifiers, save, to_onnx
from quantize.int8 import quantize_file
from _onnx import make_model

FLOAT32_ATOL = 1e-5  # onnxruntime in float32 vs the float64 graph read from the same file
SUM_TOL = 1e-9  # float64 summation slack of the bounds themselves (values here are O(1))
EXACT_TOL = 1e-12  # bounds that equal an exact range, up to float64 rounding
ENUM_TOL = 1e-7  # properties whose true margin is this close to 0 are skipped (either verdict is right)
SAMPLES = 1000


def _maxpool_model(tmp: Path, shape: tuple[int, ...], op: str = "MaxPool", **attrs) -> Path:
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp / f"{op}.onnx"
    onnx.save(make_model(graph, 20), path)
    return path


FORMS = [
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[0, 1, 2, 0]),  # asymmetric: top 0, left 1, bottom 2, right 0
    dict(kernel_shape=[2, 2], strides=[1, 1], dilations=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[1, 1], strides=[2, 2]),
    dict(kernel_shape=[3, 3], auto_pad="VALID"),
]


@pytest.mark.parametrize("attrs", FORMS, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()))
def test_every_form_read_computes_what_onnxruntime_computes(tmp_path, attrs):
    path = _maxpool_model(tmp_path, (1, 2, 7, 6), **attrs)
    net = from_onnx(path)
    x = np.random.default_rng(0).normal(size=(64, 2, 7, 6)).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0].reshape(1, -1) for i in range(len(x))])
    got = net.forward(x.reshape(64, -1).astype(np.float64)).numpy()
    np.testing.assert_allclose(got, ref, atol=FLOAT32_ATOL)
    levels = int(np.ceil(np.log2(np.prod(attrs["kernel_shape"]))))
    assert sum(isinstance(n.op, ReLU) for n in net.nodes) == levels  # ⌈log2 k²⌉ levels of ReLUs


def test_global_max_pool_and_a_torch_module_are_read():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1), nn.Conv2d(3, 3, 3),
                          nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(3, 2)).eval()
    net = from_torch(model, (1, 9, 9))
    x = torch.randn(32, 1, 9, 9, dtype=torch.float64)
    with torch.no_grad():
        ref = model.double()(x).numpy()
    np.testing.assert_allclose(net.forward(x.reshape(32, -1)).numpy(), ref, atol=1e-12)
    assert "MaxPool" in supported_ops() and "GlobalMaxPool" in supported_ops()


def _pool_bounds(net, lb, ub):
    b = Bounder(net, lb, ub)
    b.crown()
    eye = torch.eye(net.num_outputs, dtype=torch.float64)
    lo = b.spec_bounds(Spec(eye, torch.zeros(net.num_outputs))).numpy()
    hi = -b.spec_bounds(Spec(-eye, torch.zeros(net.num_outputs))).numpy()
    return b, lo, hi


@pytest.mark.parametrize("width", [0.01, 0.3, 2.0])
def test_interval_arithmetic_is_the_exact_range_and_crown_contains_it(width):
    """On the pool alone: [maxpool(lb), maxpool(ub)] is the exact range over the box. IBP gives it (`PairMax` reads the
    max, a + ReLU(b − a) by plain interval arithmetic is 3× as wide); CROWN contains it, and equals it where every
    pair's winner is decided (the narrow box)."""
    net = from_torch(nn.MaxPool2d(3, 2, 1), (2, 5, 5))
    rng = np.random.default_rng(0)
    c = rng.permutation(50) * 0.1  # centres 0.1 apart: on the narrow box every pair's winner is decided
    lb, ub = c - width * rng.random(50), c + width * rng.random(50)
    pool = lambda v: F.max_pool2d(torch.tensor(v).reshape(1, 2, 5, 5), 3, 2, 1).reshape(-1).numpy()  # noqa: E731
    exact_lo, exact_hi = pool(lb), pool(ub)
    b, lo, hi = _pool_bounds(net, lb, ub)
    ibp_lo, ibp_hi = (t.numpy() for t in b.ibp_out)
    np.testing.assert_allclose(ibp_lo, exact_lo, atol=EXACT_TOL)
    np.testing.assert_allclose(ibp_hi, exact_hi, atol=EXACT_TOL)
    assert np.all(lo <= exact_lo + EXACT_TOL) and np.all(hi >= exact_hi - EXACT_TOL)
    if sum(b.result().unstable()) == 0:
        np.testing.assert_allclose(lo, exact_lo, atol=EXACT_TOL)
        np.testing.assert_allclose(hi, exact_hi, atol=EXACT_TOL)
    assert width > 0.1 or sum(b.result().unstable()) == 0  # the narrow box is the decided case


def _conv_pool_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                         nn.Linear(16, 3)).eval()


def _contains(sess, lo, hi, lb, ub, x0, rng, shape):
    n = lb.size
    pts = np.concatenate([rng.uniform(lb, ub, (SAMPLES, n)), np.where(rng.random((SAMPLES, n)) < 0.5, lb, ub), x0[None]])
    y = ort_util.infer(sess, pts.reshape(-1, *shape).astype(np.float32)).astype(np.float64)
    below, above = float((lo - y).max()), float((y - hi).max())
    assert below <= SUM_TOL, f"an output below CROWN's lower bound by {below:.3g}"
    assert above <= SUM_TOL, f"an output above CROWN's upper bound by {above:.3g}"


@pytest.mark.parametrize("eps", [0.002, 0.05, 0.5])
def test_crown_bounds_of_an_exported_conv_net_contain_onnxruntime(tmp_path, eps):
    model = _conv_pool_net()
    path = tmp_path / "net.onnx"
    facts = export_for_verifiers(model, (1, 8, 8), path, torch.rand(8, 1, 8, 8))
    assert facts["ops"]["MaxPool"] == 2
    net = from_onnx(path)
    sess = ort_util.session(path)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x0 = rng.uniform(0, 1, 64)
        lb, ub = x0 - eps, x0 + eps
        _, lo, hi = _pool_bounds(net, lb, ub)
        _contains(sess, lo, hi, lb, ub, x0, rng, (1, 8, 8))


def test_the_int8_model_is_read_with_exact_requantization_around_the_pool_and_is_sound(tmp_path):
    model = _conv_pool_net(1)
    fp32, int8 = tmp_path / "f.onnx", tmp_path / "q.onnx"
    proto, _ = to_onnx(model, torch.zeros(1, 1, 8, 8), opset=20, simplify=True, dynamic_batch=True)
    save(proto, fp32)
    calib = np.random.default_rng(0).uniform(0, 1, (128, 1, 8, 8)).astype(np.float32)
    quantize_file(fp32, int8, calib, Config().quantize, tmp_path)
    ops = [n.op_type for n in onnx.load(str(int8)).graph.node]
    pools = [i for i, op in enumerate(ops) if op == "MaxPool"]
    assert len(pools) == 2 and all(ops[i - 1] == "DequantizeLinear" and ops[i + 1] == "QuantizeLinear" for i in pools)
    net = from_onnx(int8)
    # the requantization after each MaxPool is on its input's grid: exact, so no rounding reads the pool's output
    assert not any(type(n.op).__name__ == "Rounding" and isinstance(net.nodes[n.inputs[0]].op, PairMax) for n in net.nodes[1:])
    sess = ort_util.session(int8)
    rng = np.random.default_rng(2)
    for eps in (0.002, 0.02, 0.2):
        x0 = rng.uniform(0, 1, 64)
        lb, ub = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
        _, lo, hi = _pool_bounds(net, lb, ub)
        _contains(sess, lo, hi, lb, ub, x0, rng, (1, 8, 8))


def _enumerate_min(W: np.ndarray, b: np.ndarray, windows: list[list[int]], c: np.ndarray, lb, ub) -> float:
    """min over the box of c·maxpool(W x + b) (W x + b per unit, windows of those units), exactly: one LP per choice
    of each window's winner (its unit ≥ the window's others)."""
    from scipy.optimize import linprog

    best = np.inf
    for winners in itertools.product(*windows):
        obj = sum(c[j] * W[w] for j, w in enumerate(winners))
        const = sum(c[j] * b[w] for j, w in enumerate(winners))
        rows = [W[o] - W[w] for win, w in zip(windows, winners) for o in win if o != w]  # unit o ≤ winner w
        rhs = [b[w] - b[o] for win, w in zip(windows, winners) for o in win if o != w]
        res = linprog(obj, A_ub=np.array(rows) if rows else None, b_ub=np.array(rhs) if rows else None,
                      bounds=list(zip(lb, ub)), method="highs")
        if res.status == 0:
            best = min(best, float(res.fun + const))
    return best


@pytest.mark.parametrize("method", ["bab", "milp"])
@pytest.mark.parametrize("seed", range(4))
def test_complete_methods_match_an_enumeration_of_the_windows_winners(seed, method):
    """A 1×1 conv (3 channels) on a 1×2×2 input, a 2×2 MaxPool, a Linear: the margin's true minimum over a box is an
    LP per choice of the windows' winners (3 windows of 4). Branch and bound (from interval bounds only, so it must split
    the tree's ReLUs) and the MILP give the verdict the enumeration gives."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = nn.Sequential(nn.Conv2d(1, 3, 1), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3, 3)).eval()
    net = from_torch(model, (1, 2, 2))
    w = model[0].weight.detach().double().numpy().reshape(3)
    W = np.kron(w[:, None], np.eye(4))  # unit (channel k, pixel p) = w_k·x_p + b_k
    b0 = np.repeat(model[0].bias.detach().double().numpy(), 4)
    windows = [list(range(4 * k, 4 * k + 4)) for k in range(3)]
    L, Lb = model[3].weight.detach().double().numpy(), model[3].bias.detach().double().numpy()
    seen = set()
    for eps in (0.05, 0.2, 0.5, 1.0):
        x0 = rng.uniform(0, 1, 4)
        label = int(np.argmax(net.forward(x0).numpy()))
        spec = robustness_spec(x0, eps, -1.0, 2.0, label, 3)
        mins = [_enumerate_min(W, b0, windows, A[0] @ L, spec.lb, spec.ub) + float(A[0] @ Lb) - float(bb[0])
                for A, bb in spec.disjuncts]
        if min(abs(v) for v in mins) < ENUM_TOL:
            continue
        truth = "unsat" if min(mins) > 0 else "sat"
        bounder = Bounder(net, spec.lb, spec.ub)  # interval bounds only: the complete method decides by itself
        if method == "milp":
            status, x, _ = milp.solve(bounder.net, spec, bounder.pre, list(range(len(spec.disjuncts))), lambda: 30.0,
                                      lp_first=False)
        else:
            status, x, _, _ = bab(bounder, spec, list(range(len(spec.disjuncts))), lambda: False, lambda: 30.0,
                                  Settings(batch=4, steps=5))
        assert status == truth, (seed, eps, mins, status)
        if status == "sat":
            assert spec.in_box(x, 1e-9) and spec.violation(net.forward(x).numpy()) <= 0
        seen.add(truth)
    assert seen


def test_the_swap_gap_through_a_max_pool_holds_by_sampling(monkeypatch):
    """GELU before the pool in the smooth network, a ReLU in its swapped twin: |smooth − relu| at sampled points stays
    within `swap_gap`, which through a window's max is the max of its elements' gaps (`PairMax`), tighter than
    a + ReLU(b − a) carried by |M|·δ."""
    from pipeline.activations import GELU

    torch.manual_seed(0)
    smooth = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), GELU(), nn.MaxPool2d(3, 2, 1), nn.Flatten(),
                           nn.Linear(3 * 16, 3)).eval()
    net = from_torch(smooth, (1, 8, 8))
    relu = net.relu_version()
    rng = np.random.default_rng(0)
    x0 = rng.uniform(0, 1, 64)
    lb, ub = x0 - 0.05, x0 + 0.05
    b = Bounder(relu, lb, ub)
    b.crown()
    gap = swap_gap(net, b.pre).numpy()
    xs = rng.uniform(lb, ub, (SAMPLES, 64))
    diff = np.abs(net.forward(xs).numpy() - relu.forward(xs).numpy()).max(0)
    assert np.all(diff <= gap + SUM_TOL), (diff, gap)
    monkeypatch.setattr(PairMax, "abs_forward", Pool.abs_forward)
    assert np.all(gap < swap_gap(net, b.pre).numpy())


def _refused(tmp_path, shape=(1, 2, 6, 6), outputs=("y",), **attrs):
    node = helper.make_node("MaxPool", ["x"], list(outputs), name="pool", **attrs)
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT if o == "y" else TensorProto.INT64, None) for o in outputs]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))], outs[:1])
    if len(outputs) > 1:  # the Indices output read by the graph's output instead
        graph = helper.make_graph([node, helper.make_node("Cast", [outputs[1]], ["z"], to=TensorProto.FLOAT)], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                                  [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    path = tmp_path / "bad.onnx"
    onnx.save(make_model(graph, 20), path)
    with pytest.raises(UnsupportedModel) as e:
        from_onnx(path)
    msg = str(e.value)
    assert msg.startswith("MaxPool (node 'pool') is not read: ") and "\n" not in msg and e.value.op == "MaxPool"
    return e.value


def test_the_forms_not_read_are_refused_in_one_line_with_the_fix(tmp_path):
    e = _refused(tmp_path, kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    assert "ceil_mode=1" in str(e) and "ceil_mode=False" in e.fix
    e = _refused(tmp_path, kernel_shape=[3, 3], auto_pad="SAME_UPPER")
    assert "auto_pad=SAME_UPPER" in str(e) and "explicit pads" in e.fix
    e = _refused(tmp_path, outputs=("y", "idx"), kernel_shape=[2, 2], strides=[2, 2])
    assert "Indices" in str(e) and e.fix
    e = _refused(tmp_path, shape=(1, 2, 6), kernel_shape=[2], strides=[2])
    assert "2-d" in str(e)


def test_a_pool_with_entries_and_a_pair_max_back_substitute_as_their_matrix_transpose():
    """`Pool` with an index (any fixed fan-in, repeats included) and `PairMax`: forward = M x, back(A) = A M with M the
    op's own sparse matrix (what the MILP encodes), and PairMax's interval never wider than the Pool's."""
    rng = np.random.default_rng(0)
    ops = [Pool(rng.integers(0, 5, 30), rng.normal(size=30), 5, rng.integers(0, 9, 30), 9),
           PairMax.of([0, 2, 4, 7], [1, 3, -1, 8], 9)]
    for op in ops:
        (M,), c = op.sparse()
        M = torch.as_tensor(M.toarray())
        x = torch.randn(7, op.in_sizes()[0], dtype=torch.float64)
        np.testing.assert_allclose(op.forward(x).numpy(), (x @ M.T).numpy() + c, atol=EXACT_TOL)
        A = torch.randn(4, op.out_size, dtype=torch.float64)
        (back,), bias = op.back(A)
        np.testing.assert_allclose(back.numpy(), (A @ M).numpy(), atol=EXACT_TOL)
        assert np.allclose(bias.numpy(), 0.0)
    pm = ops[1]
    x = torch.randn(1, 9, dtype=torch.float64)
    relus = torch.relu(x[:, [1, 3, 8]] - x[:, [0, 2, 7]])  # the tree's ReLUs: r = ReLU(x[b] − x[a])
    both = torch.cat([x, relus], 1)
    lo, hi = both - 0.1, both + 0.1
    plain, tight = Pool.ibp(pm, (lo, hi)), pm.ibp((lo, hi))
    assert torch.all(tight[0] >= plain[0]) and torch.all(tight[1] <= plain[1])
    y = pm.forward(both)
    np.testing.assert_allclose(y.numpy(), torch.maximum(x[:, [0, 2, 4, 7]], x[:, [1, 3, 4, 8]]).numpy(), atol=EXACT_TOL)
    assert torch.all(tight[0] <= y) and torch.all(y <= tight[1])
