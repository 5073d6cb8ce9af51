"""Standalone smooth activations' relaxations (`analysis.verification.ops.smooth`), by dense sampling in float64 and against
mpmath: each function's float64 evaluation within the slack, each line sound on its interval for any slope (hypothesis
over all-negative, all-positive, crossing, degenerate, narrow and very wide intervals), each side apart, tight up to the
sampling grid, CROWN's choices on convex/concave pieces equal the closed-form secant and middle tangent."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.verification.ops.gates import G_REL_ERROR, TINY
from analysis.verification.ops.smooth import (KINDS, SELU_ALPHA, SELU_GAMMA, Smooth, function, intercepts, lines,
                                              slope_range)

mpmath.mp.dps = 40
# the slack must exceed the measured relative error of each computed f by this factor
SLACK_MARGIN = 8.0
GRID_POINTS = 4001
# a line's own float64 evaluation a·y + b at a sample: a few ulps of its terms
EVAL_ULPS = 8 * np.finfo(np.float64).eps
# how far above the sampled extremum an intercept may lie: the extremum between grid points, |f'| ≤ 2 (selu: 1.76)
TIGHT_REL = 1e-6

PARAMS = {"elu": (0.7, 1.0), "selu": (SELU_ALPHA, SELU_GAMMA)}
EXTRA = [("elu", 1.9, 1.0)]  # elu with alpha > 1: f' jumps down at 0 (not convex)
CASES = [(k, *PARAMS.get(k, (1.0, 1.0))) for k in KINDS] + EXTRA


def _exact(kind: str, alpha: float, gamma: float, y: float) -> mpmath.mpf:
    y = mpmath.mpf(y)
    if kind == "sigmoid":
        return 1 / (1 + mpmath.exp(-y))
    if kind == "tanh":
        return mpmath.tanh(y)
    if kind == "softsign":
        return y / (1 + abs(y))
    if kind == "erf":
        return mpmath.erf(y)
    if kind == "softplus":
        return mpmath.log1p(mpmath.exp(y))
    return gamma * (y if y > 0 else alpha * mpmath.expm1(y))


POINTS = np.concatenate([-np.logspace(-4, np.log10(740), 300), [0.0], np.logspace(-4, np.log10(740), 300)])


@pytest.mark.parametrize("kind,alpha,gamma", CASES)
def test_slack_covers_the_measured_error_of_each_function(kind, alpha, gamma):
    fn = function(kind, alpha, gamma)
    got = fn.f(torch.as_tensor(POINTS, dtype=torch.float64)).tolist()
    worst = 0.0
    for y, v in zip(POINTS, got):
        ex = _exact(kind, alpha, gamma, y)
        if abs(ex) < mpmath.mpf(2.3e-308):
            assert abs(mpmath.mpf(v) - ex) < TINY
            continue
        worst = max(worst, float(abs((mpmath.mpf(v) - ex) / ex)))
    assert worst * SLACK_MARGIN < G_REL_ERROR, (kind, worst)


@pytest.mark.parametrize("kind,alpha,gamma", CASES)
def test_derivative_and_pieces_match_finite_differences(kind, alpha, gamma):
    """f' against a central difference, and f' monotone in the stated direction on each piece (a dense scan)."""
    fn = function(kind, alpha, gamma)
    y = torch.linspace(-12, 12, 24001, dtype=torch.float64)
    y = y[(y - 0).abs() > 1e-3]
    h = 1e-6
    fd = (fn.f(y + h) - fn.f(y - h)) / (2 * h)
    assert torch.allclose(fn.df(y), fd, rtol=1e-6, atol=1e-9)
    edges = (-math.inf, *fn.breaks, math.inf)
    for i, rising in enumerate(fn.rising):
        piece = y[(y > edges[i]) & (y < edges[i + 1])]
        d = torch.diff(fn.df(piece))
        assert bool((d >= -1e-15).all()) if rising else bool((d <= 1e-15).all()), (kind, i)


def _check(fn, l: float, u: float, al, bl, au, bu):
    y = torch.linspace(l, u, GRID_POINTS, dtype=torch.float64) if u > l else torch.tensor([l], dtype=torch.float64)
    f = fn.f(y)
    low, up = al * y + bl, au * y + bu
    tol = EVAL_ULPS * ((al * y).abs() + abs(bl) + f.abs()) + 1e-300
    assert bool((f >= low - tol).all()), ("lower", fn.name, l, u, float((low - f).max()))
    tol = EVAL_ULPS * ((au * y).abs() + abs(bu) + f.abs()) + 1e-300
    assert bool((f <= up + tol).all()), ("upper", fn.name, l, u, float((f - up).max()))
    return y, f


interval = st.one_of(
    st.tuples(st.floats(-40, 40), st.floats(0, 60)),  # crossing, one-sided, wide
    st.tuples(st.floats(-40, 40), st.floats(0, 1e-6)),  # narrow, degenerate
    st.tuples(st.floats(-1e4, 1e4), st.floats(0, 2e4)),  # very wide
).map(lambda t: (t[0], t[0] + t[1]))


@pytest.mark.parametrize("kind,alpha,gamma", CASES)
@settings(max_examples=60, deadline=None)
@given(iv=interval, t=st.floats(-0.5, 1.5), t2=st.floats(-0.5, 1.5))
def test_lines_hold_for_any_slope_each_side(kind, alpha, gamma, iv, t, t2):
    """CROWN's lines and lines of arbitrary slopes (within the slope range and beyond it) hold at every sample."""
    fn = function(kind, alpha, gamma)
    l, u = iv
    L, Uu = torch.tensor([l], dtype=torch.float64), torch.tensor([u], dtype=torch.float64)
    al, bl, au, bu = (float(v) for v in lines(fn, L, Uu))
    y, f = _check(fn, l, u, al, bl, au, bu)
    lo, hi = slope_range(fn, L, Uu)
    s1, s2 = float(lo + t * (hi - lo)), float(lo + t2 * (hi - lo))
    al, bl, au, bu = (float(v) for v in lines(fn, L, Uu, (torch.tensor([s1], dtype=torch.float64),
                                                             torch.tensor([s2], dtype=torch.float64))))
    assert (al, au) == (s1, s2)
    _check(fn, l, u, al, bl, au, bu)
    # tight: each intercept within the grid's resolution of the sampled extremum of f − a·y
    step = (u - l) / (GRID_POINTS - 1)
    slack = TIGHT_REL * (1 + f.abs().max().item() + abs(s1 * u) + abs(s1 * l)) + 2.5 * step * (2 + abs(s1))
    assert bl >= float((f - s1 * y).min()) - slack
    slack = TIGHT_REL * (1 + f.abs().max().item() + abs(s2 * u) + abs(s2 * l)) + 2.5 * step * (2 + abs(s2))
    assert bu <= float((f - s2 * y).max()) + slack


@pytest.mark.parametrize("kind,alpha,gamma", CASES)
def test_vectorised_lines_hold_on_a_batch_of_intervals(kind, alpha, gamma):
    """Many intervals at once (all-negative, all-positive, crossing, l = u, huge, and ±∞ ends), each checked densely."""
    fn = function(kind, alpha, gamma)
    ends = [(-5.0, -1.0), (0.5, 3.0), (-2.0, 7.0), (1.5, 1.5), (0.0, 0.0), (-800.0, 800.0), (-30.0, -29.999999),
            (-1e-9, 1e-9), (-3e5, 2.0), (2.0, 2.0 + 1e-13)]
    l = torch.tensor([e[0] for e in ends], dtype=torch.float64)
    u = torch.tensor([e[1] for e in ends], dtype=torch.float64)
    al, bl, au, bu = lines(fn, l, u)
    for i, (lo, hi) in enumerate(ends):
        _check(fn, lo, hi, float(al[i]), float(bl[i]), float(au[i]), float(bu[i]))
    inf = torch.tensor([-math.inf, 0.0, -math.inf], dtype=torch.float64), torch.tensor([1.0, math.inf, math.inf], dtype=torch.float64)
    al, bl, au, bu = lines(fn, *inf)
    assert bool((al == 0).all() and (au == 0).all())
    assert float(bl[0]) <= fn.limits[0] and float(bu[0]) >= float(fn.f(torch.tensor(1.0, dtype=torch.float64)))
    assert float(bu[2]) >= fn.limits[1]


def test_crown_slopes_on_convex_and_concave_pieces_are_secant_and_middle_tangent():
    """On sigmoid's concave side the lower line is the secant and the upper the tangent at the middle (auto_LiRPA's
    BoundSigmoid on a stable positive interval); on its convex side the reverse; softplus is convex everywhere."""
    fn = function("sigmoid")
    l, u = torch.tensor([0.5], dtype=torch.float64), torch.tensor([3.0], dtype=torch.float64)
    al, bl, au, bu = lines(fn, l, u)
    sec = (torch.sigmoid(u) - torch.sigmoid(l)) / (u - l)
    assert torch.allclose(al, sec, rtol=1e-14)
    assert torch.allclose(bl, torch.sigmoid(l) - sec * l, rtol=0, atol=1e-10)
    mid = torch.tensor([1.75], dtype=torch.float64)
    d = torch.sigmoid(mid) * torch.sigmoid(-mid)
    assert torch.allclose(au, d, rtol=1e-14)
    assert torch.allclose(bu, torch.sigmoid(mid) - d * mid, rtol=0, atol=1e-10)
    al, bl, au, bu = lines(fn, -u, -l)
    assert torch.allclose(au, sec, rtol=1e-14) and torch.allclose(al, d, rtol=1e-14)
    sp = function("softplus")
    al, _, au, _ = lines(sp, torch.tensor([-2.0], dtype=torch.float64), torch.tensor([4.0], dtype=torch.float64))
    assert torch.allclose(al, torch.sigmoid(torch.tensor([1.0], dtype=torch.float64)), rtol=1e-14)
    assert torch.allclose(au, (sp.f(torch.tensor([4.0], dtype=torch.float64)) - sp.f(torch.tensor([-2.0], dtype=torch.float64))) / 6,
                          rtol=1e-14)


def test_intercept_gradient_is_minus_the_extremum():
    """d/da of the upper intercept max(f − a·y) is −y* (the envelope theorem): a finite difference agrees."""
    fn = function("tanh")
    L, U = torch.tensor([-1.0], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64)
    a = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    _, hi = intercepts(fn, L, U, a)
    hi.sum().backward()
    h = 1e-6
    fd = (intercepts(fn, L, U, a.detach() + h)[1] - intercepts(fn, L, U, a.detach() - h)[1]) / (2 * h)
    assert torch.allclose(a.grad, fd, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("kind,alpha,gamma", CASES)
def test_op_interval_and_gap_hold(kind, alpha, gamma):
    op = Smooth(5, kind, alpha, gamma)
    l = torch.tensor([-3.0, 0.2, -1.0, 4.0, -50.0], dtype=torch.float64)
    u = torch.tensor([-1.0, 0.9, 2.0, 4.0, 60.0], dtype=torch.float64)
    lo, hi = op.interval(l, u)
    d = torch.full_like(l, 0.25)
    gap = op.gap(l, u, d)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        z = l + (u - l) * torch.rand(5, generator=g, dtype=torch.float64)
        zz = z + d * (2 * torch.rand(5, generator=g, dtype=torch.float64) - 1)
        v = op.forward(z)
        assert bool(((lo <= v) & (v <= hi)).all())
        assert bool(((op.forward(zz) - v).abs() <= gap).all())


def test_unknown_kind_is_refused_in_one_line():
    from analysis.verification.ops.base import UnsupportedModel

    with pytest.raises(UnsupportedModel, match="unknown smooth activation 'swoosh'; known: sigmoid"):
        Smooth(3, "swoosh")


# ---------------------------------------------------------------------------------------------
# reading: every smooth activation anywhere in a graph; its network's bounds hold at sampled points, each side apart

ACTS = {"sigmoid": ("Smooth", "sigmoid"), "tanh": ("Smooth", "tanh"), "softplus": ("Smooth", "softplus"),
        "elu": ("Smooth", "elu"), "selu": ("Smooth", "selu"), "gelu_erf": ("Gate", "phi"), "silu": ("Gate", "sigmoid"),
        "mish": ("Gate", "mish")}
# float32 onnxruntime against the float64 graph on the same float32 weights
ORT_TOL = 1e-5
SAMPLES = 2000


def _module(name: str):
    from torch import nn

    return {"sigmoid": nn.Sigmoid(), "tanh": nn.Tanh(), "softplus": nn.Softplus(), "elu": nn.ELU(0.7), "selu": nn.SELU(),
            "gelu_erf": nn.GELU(), "silu": nn.SiLU(), "mish": nn.Mish()}[name]


def _export(name: str, path, opset: int):
    from torch import nn

    torch.manual_seed(1)
    a = _module(name)
    net = nn.Sequential(nn.Linear(3, 12), a, nn.Linear(12, 10), a, nn.Linear(10, 2))
    torch.onnx.export(net, torch.zeros(1, 3), str(path), opset_version=opset, dynamo=False)
    return net


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("name", list(ACTS))
def test_torch_exports_read_as_their_activation_and_bounds_hold(name, opset, tmp_path):
    import onnx
    import onnxruntime as ort

    from analysis.verification.bounds import Bounder, Spec
    from analysis.verification.readers import read

    path = tmp_path / "net.onnx"
    _export(name, path, opset)
    g = read(onnx.load(str(path)))
    kinds = {(type(n.op).__name__, getattr(n.op, "kind", None)) for n in g.nodes[1:]}
    assert ACTS[name] in kinds and not any(k[0] == "Product" for k in kinds), kinds
    x = np.random.default_rng(0).uniform(-1, 1, size=(SAMPLES, 3)).astype(np.float32)
    sess = ort.InferenceSession(str(path))
    ref = np.concatenate([sess.run(None, {sess.get_inputs()[0].name: x[i:i + 1]})[0] for i in range(50)])
    assert np.abs(g.forward(torch.as_tensor(x[:50], dtype=torch.float64)).numpy() - ref).max() < ORT_TOL
    lb, ub = torch.full((3,), -1.0, dtype=torch.float64), torch.full((3,), 1.0, dtype=torch.float64)
    b = Bounder(g, lb, ub)
    b.crown()
    out = g.forward(torch.as_tensor(x, dtype=torch.float64))
    C = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
    low = b.spec_bounds(Spec(C, torch.zeros(4)))
    vals = out @ C.T
    assert bool((vals >= low).all()), (name, float((low - vals).max()))
    for s, k in enumerate(b.sites):  # every site's input interval holds too
        v = b.net.values(torch.as_tensor(x, dtype=torch.float64))[b.net.nodes[k].inputs[0]]
        lo, hi = b.pre[s]
        assert bool(((v >= lo) & (v <= hi)).all()), (name, s)


@pytest.mark.parametrize("op,attrs,ref", [
    ("Softsign", {}, lambda v: v / (1 + np.abs(v))),
    ("Elu", {"alpha": 0.3}, lambda v: np.where(v > 0, v, float(np.float32(0.3)) * np.expm1(np.minimum(v, 0)))),  # a float attribute
    ("Selu", {"alpha": 1.5, "gamma": 1.25}, lambda v: 1.25 * np.where(v > 0, v, 1.5 * np.expm1(np.minimum(v, 0)))),
    ("Mish", {}, lambda v: v * np.tanh(np.log1p(np.exp(v)))),
    ("Erf", {}, None), ("Softplus", {}, lambda v: np.log1p(np.exp(v)))])
def test_onnx_activation_nodes_read_with_their_attributes(op, attrs, ref):
    import onnx
    from onnx import TensorProto, helper

    from analysis.verification.readers import read

    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="act", **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7])])
    g = read(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    v = np.linspace(-3, 3, 7)
    got = g.forward(torch.as_tensor(v[None], dtype=torch.float64))[0].numpy()
    want = np.array([math.erf(t) for t in v]) if ref is None else ref(v)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-14)


def test_a_gate_chain_read_by_another_op_is_its_activations():
    """σ(x) into a Gemm is a sigmoid layer; softplus then erf with no Mul by x is two activations (SERF's chain)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from analysis.verification.readers import read

    W = numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")
    nodes = [helper.make_node("Softplus", ["x"], ["s"]), helper.make_node("Erf", ["s"], ["e"]),
             helper.make_node("Sigmoid", ["e"], ["g"], name="sig"), helper.make_node("Gemm", ["g", "W"], ["y"], name="gemm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [W])
    g = read(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [getattr(n.op, "kind", None) for n in g.nodes[1:4]] == ["softplus", "erf", "sigmoid"]
    v = torch.tensor([[-2.0, 0.0, 1.0, 5.0]], dtype=torch.float64)
    want = torch.sigmoid(torch.erf(torch.nn.functional.softplus(v)))
    assert torch.allclose(g.forward(v), want, rtol=1e-13)
