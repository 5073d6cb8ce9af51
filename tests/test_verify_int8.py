"""The int8 QDQ graph as the verifier reads it (analysis/verification/quantized.py): the relaxation of the runtime's
rounding checked against onnxruntime's own integer execution (dense sampling, clamp ends, zero points ≠ 0 and ≠ 128),
the first quantization exact, the verdicts on a tiny quantized network against exhaustive enumeration of its integer
inputs, and every counterexample reproduced in onnxruntime."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

from analysis.verification.bounds import Bounder, Spec
from analysis.verification.graph import Graph, Node
from analysis.verification.ops.affine import Scale
from analysis.verification.ops.base import OutOfDomain, UnsupportedModel
from analysis.verification.ops.relu import ReLU
from analysis.verification.ops.rounding import QuantizedInput, Rounding
from analysis.verification.quantized import grid_index
from analysis.verification.readers import from_onnx
from analysis.verification.registry import get_verifier
from analysis.verification.vnnlib import robustness_spec, write_vnnlib
from pipeline.config import Config
from quantize import ort as ort_util
from quantize.int8 import quantize_file
from _onnx import make_model

SUM_TOL = 1e-9  # float64 summation slack of the bounds themselves (values here are O(1))
SAMPLES = 3000
WIDTH = 8


def _tiny(tmp: Path, act_type: str, reduce_range: bool = True, seed: int = 0, shift: float = 0.6) -> tuple[Path, torch.nn.Module]:
    """2 → 8 → 8 → 3 ReLU MLP, quantized by the int8 stage's own recipe; calibration inputs off centre so that the
    zero points are neither 0 nor 128."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(2, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                              torch.nn.Linear(WIDTH, 3))
    # a few steps on three blobs, so that the classes change inside the calibration range
    x = torch.randn(600, 2) * 0.35 + shift + torch.tensor([[-0.6, 0.0], [0.6, 0.0], [0.0, 0.6]]).repeat(200, 1)
    y = torch.arange(3).repeat(200)
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(100):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    net.eval()
    src = tmp / "fp32.onnx"
    torch.onnx.export(net, torch.zeros(1, 2), str(src), input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "b"}, "logits": {0: "b"}}, dynamo=False)
    cfg = Config()
    cfg.quantize.activation_type = act_type
    cfg.quantize.reduce_range = reduce_range
    calib = (np.random.default_rng(seed).uniform(-1, 1, (256, 2)) + shift).astype(np.float32)
    dst = tmp / f"int8-{act_type}-{int(reduce_range)}.onnx"
    quantize_file(src, dst, calib, cfg.quantize, tmp)
    return dst, net


@pytest.mark.parametrize("seed", range(4))
def test_grid_rounding_relaxation_holds_for_every_rounding_of_every_point(seed):
    """`ops.Rounding` on a grid: its interval and lines contain s·k for every k = round(t/s) that the runtime may
    compute (|t − x| ≤ E − s/2, ties both ways) at every x of the input interval. Dense sampling in float64 over
    intervals from inside one cell to many cells, ends on half steps (ties) included."""
    rng = np.random.default_rng(seed)
    n = 400
    s = rng.uniform(0.01, 0.3, n)
    inner = s * rng.choice([0.0, 0.01, 0.2], n)  # E − s/2: the arithmetic before the rounding
    op = Rounding(s / 2 + inner, s)
    centre = rng.integers(-20, 20, n) * s + rng.choice([0.0, 0.5, rng.uniform(-0.5, 0.5)], n) * s
    width = s * rng.choice([0.0, 0.3, 0.99, 1.0, 2.5, 9.0], n)
    l, u = torch.as_tensor(centre - width / 2), torch.as_tensor(centre + width / 2)
    lo, hi = op.interval(l, u)
    al, bl, au, bu = op.lines(l, u)
    for t in np.linspace(0, 1, 101):
        x = l + (u - l) * t
        for d in (-1.0, -0.5, 0.0, 0.5, 1.0):
            q = torch.as_tensor(s * (x.numpy() / s + d * inner / s))  # the value rounded, ties included
            for k in (torch.floor(q / torch.as_tensor(s) + 0.5), torch.ceil(q / torch.as_tensor(s) - 0.5)):  # both ways at a tie
                y = k * torch.as_tensor(s)
                assert bool(torch.all(y >= lo - SUM_TOL)) and bool(torch.all(y <= hi + SUM_TOL))
                assert bool(torch.all(y >= al * x + bl - SUM_TOL)) and bool(torch.all(y <= au * x + bu + SUM_TOL))
    # inside one grid cell (no half step within reach) the value is exact: a constant, and the lines say so
    S, I = torch.as_tensor(s), torch.as_tensor(inner)
    one = torch.floor((l - I) / S + 0.5 - 1e-6) == torch.floor((u + I) / S + 0.5 + 1e-6)
    assert bool(one.any())
    assert bool(torch.all((lo == hi)[one])) and bool(torch.all((al == 0)[one])) and bool(torch.all((au == 0)[one]))


def _feasible_extremes(x: np.ndarray, s: np.ndarray, E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The smallest and largest s·k with |s·k − x| ≤ E (every value the runtime may give at x, ties and the arithmetic
    before the rounding included), from the candidates around x/s, counted feasible up to a relative 1e-12 (so a
    value right at a corner is always in)."""
    base = np.floor(x / s)
    ks = base[..., None] + np.arange(-40, 41)
    y = ks * s[..., None]
    ok = np.abs(y - x[..., None]) <= E[..., None] * (1 + 1e-12)
    assert np.all(ok.any(-1)) and not np.any(ok[..., 0] | ok[..., -1])  # the candidates cover every feasible k
    return np.where(ok, y, np.inf).min(-1), np.where(ok, y, -np.inf).max(-1)


@pytest.mark.parametrize("seed", range(3))
def test_grid_rounding_hull_lines_hold_at_every_corner_and_beat_x_plus_minus_E(seed):
    """Every line α-CROWN may choose for `ops.Rounding` (`hull_lines` at slopes in `slope_range`: both ends, 1 and random
    ones between; and slopes beyond the range, which stay sound) is checked against every value the runtime may give
    (|s·k − x| ≤ E) at dense points, at each corner s·k ± E inside the interval and next to it, lower and upper side
    apart. On intervals of fewer than two cells whose first corner lies past the middle, the steepest line is tighter
    at the middle than both x ± E and the snapped end (what the hull adds)."""
    rng = np.random.default_rng(seed)
    n = 3000
    s = rng.uniform(0.01, 0.3, n)
    E = s / 2 + s * rng.choice([0.0, 1e-6, 0.01, 0.2, 0.45], n)
    op = Rounding(E, s)
    centre = rng.integers(-20, 20, n) * s + rng.uniform(-0.5, 0.5, n) * s
    width = s * np.concatenate([rng.uniform(0, 3.5, n - 200), np.full(100, 1e-7), rng.uniform(0.9, 1.1, 100)])
    l, u = centre - width / 2, centre + width / 2
    L, Uu = torch.as_tensor(l), torch.as_tensor(u)
    lo, hi = (t.numpy() for t in op.interval(L, Uu))
    (lo_a, lo_b), (up_a, up_b) = op.slope_range(L, Uu)
    xs = [l + (u - l) * t for t in np.linspace(0, 1, 401)]
    for k in range(-25, 26):  # the corners and their float64 neighbours, where they lie in the interval
        for c in (s * k - E, s * k + E):
            for x in (c, np.nextafter(c, -np.inf), np.nextafter(c, np.inf)):
                xs.append(np.clip(x, l, u))
    X = np.stack(xs, -1)  # [n, points]
    ymin, ymax = _feasible_extremes(X, s[:, None].repeat(X.shape[1], 1), E[:, None].repeat(X.shape[1], 1))
    assert np.all(lo[:, None] <= ymin + SUM_TOL) and np.all(hi[:, None] >= ymax - SUM_TOL)
    r = lambda: torch.as_tensor(rng.uniform(0, 1, n))  # noqa: E731
    choices = [(lo_a, up_a), (lo_b, up_b), (torch.ones(n, dtype=torch.float64),) * 2,
               (lo_a + r() * (lo_b - lo_a), up_a + r() * (up_b - up_a)), (torch.as_tensor(rng.uniform(0, 3, n)),) * 2,
               (lo_b * 1.5 + 0.2, up_b * 1.5 + 0.2)]
    for a_lo, a_up in choices:
        al, bl, au, bu = (t.numpy() for t in op.hull_lines(L, Uu, (a_lo, a_up)))
        assert np.all(al[:, None] * X + bl[:, None] <= ymin + SUM_TOL), "a lower line above a value the runtime may give"
        assert np.all(au[:, None] * X + bu[:, None] >= ymax - SUM_TOL), "an upper line below a value the runtime may give"
    # CROWN's own lines too
    al, bl, au, bu = (t.numpy() for t in op.lines(L, Uu))
    assert np.all(al[:, None] * X + bl[:, None] <= ymin + SUM_TOL) and np.all(au[:, None] * X + bu[:, None] >= ymax - SUM_TOL)
    # the steepest lines where the first corner lies past the middle: tighter at the middle than both other lines
    al, bl, au, bu = (t.numpy() for t in op.hull_lines(L, Uu, (lo_b, up_b)))
    mid = (l + u) / 2
    steep_u, steep_l = au > 1, al > 1
    assert steep_u.sum() > n // 10 and steep_l.sum() > n // 10, (steep_u.sum(), steep_l.sum())
    past_u = steep_u & ((np.floor((l + E) / s) + 1) * s - E > mid)
    past_l = steep_l & ((np.ceil((u - E) / s) - 1) * s + E < mid)
    assert past_u.sum() > n // 20 and past_l.sum() > n // 20
    assert np.all((au * mid + bu)[past_u] < np.minimum(mid + E, hi)[past_u])
    assert np.all((al * mid + bl)[past_l] > np.maximum(mid - E, lo)[past_l])


def _qdq_gemm(W_int: np.ndarray, w_scale: float, bias: np.ndarray, s_in: float, s_out: float, z_out: int) -> onnx.ModelProto:
    """input → Q → DQ → Gemm by DequantizeLinear(7-bit weights), float bias → Q → DQ: one requantized layer, its output
    the grid values the runtime computes (int8 activations, the input's zero point 0)."""
    init = [numpy_helper.from_array(np.array(s_in, dtype=np.float32), "si"), numpy_helper.from_array(np.array(0, dtype=np.int8), "zi"),
            numpy_helper.from_array(W_int.astype(np.int8), "w"), numpy_helper.from_array(np.array(w_scale, dtype=np.float32), "ws"),
            numpy_helper.from_array(np.array(0, dtype=np.int8), "wz"), numpy_helper.from_array(bias.astype(np.float32), "b"),
            numpy_helper.from_array(np.array(s_out, dtype=np.float32), "so"), numpy_helper.from_array(np.array(z_out, dtype=np.int8), "zo")]
    nodes = [helper.make_node("QuantizeLinear", ["input", "si", "zi"], ["q"]), helper.make_node("DequantizeLinear", ["q", "si", "zi"], ["x"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["W"]), helper.make_node("Gemm", ["x", "W", "b"], ["v"], transB=1),
             helper.make_node("QuantizeLinear", ["v", "so", "zo"], ["q2"]), helper.make_node("DequantizeLinear", ["q2", "so", "zo"], ["logits"])]
    g = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["b", W_int.shape[1]])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", W_int.shape[0]])], init)
    return make_model(g, 19)


def test_grid_rounding_lines_contain_onnxruntime_requantized_values(tmp_path):
    """One requantized Gemm run by onnxruntime: at dense points of small boxes (each unit's interval spanning a fraction
    of a cell to a few cells, where the hull's steep lines exist) the value the runtime computes lies above the
    `Rounding`'s lower line and below its upper line at the exact (float64) pre-rounding value, each side apart: CROWN's
    lines, the steepest hull lines and lines at random slopes of `slope_range`."""
    rng = np.random.default_rng(0)
    n_in, n_out = 6, 40
    W_int = rng.integers(-64, 65, (n_out, n_in))
    s_in, w_scale, s_out = 1 / 127, 0.004, 0.011
    model = _qdq_gemm(W_int, w_scale, rng.uniform(-0.1, 0.1, n_out), s_in, s_out, 3)
    path = tmp_path / "gemm.onnx"
    onnx.save(model, path)
    graph = from_onnx(path)
    ri = next(k for k, nd in enumerate(graph.nodes) if isinstance(nd.op, Rounding) and nd.op.step is not None)
    op, pre = graph.nodes[ri].op, graph.nodes[ri].inputs[0]
    sess = ort_util.session(path)
    used = {"lower": 0, "upper": 0}
    for radius in (0.3, 1.0, 2.0, 4.0):  # in input grid steps
        for _ in range(10):
            c = rng.uniform(-0.3, 0.3, n_in)  # |v| ≤ 0.6: inside the output grid's range, no clamp
            lb, ub = c - radius * s_in, c + radius * s_in
            b = Bounder(graph, lb, ub)
            b.crown()
            l, u = b.pre[b.site_of[ri]]
            (lo_a, lo_b), (up_a, up_b) = op.slope_range(l, u)
            t = torch.as_tensor(rng.uniform(0, 1, l.numel()))
            lines = [op.lines(l, u), op.hull_lines(l, u, (lo_b, up_b)), op.hull_lines(l, u, (lo_a + t * (lo_b - lo_a), up_a + t * (up_b - up_a)))]
            used["lower"] += int((lines[1][0] > 1).sum())
            used["upper"] += int((lines[1][2] > 1).sum())
            xs = np.vstack([rng.uniform(lb, ub, (2000, n_in)), lb, ub]).astype(np.float32)
            v = _node_value(graph, pre, xs)
            y = ort_util.infer(sess, xs).astype(np.float64)
            tol = 1e-6 * np.abs(y) + SUM_TOL  # the output DequantizeLinear's float32 product
            assert np.all(v >= l.numpy() - SUM_TOL) and np.all(v <= u.numpy() + SUM_TOL)
            for al, bl, au, bu in lines:
                assert np.all(y >= al.numpy() * v + bl.numpy() - tol), "onnxruntime below the lower line"
                assert np.all(y <= au.numpy() * v + bu.numpy() + tol), "onnxruntime above the upper line"
    assert used["lower"] > 20 and used["upper"] > 20, used


def test_alpha_crown_with_the_roundings_lines_optimized_contains_onnxruntime(tmp_path, monkeypatch):
    """α-CROWN optimizing the grid roundings' lines too (`Rounding.OPTIMIZE`): its output bounds on small boxes
    of the tiny int8 net (units spanning a few cells, where the slopes are free) contain onnxruntime's outputs at dense
    points, lower and upper side apart, and are no looser than CROWN's."""
    monkeypatch.setattr(Rounding, "OPTIMIZE", True)
    path, _ = _tiny(tmp_path, "int8")
    graph = from_onnx(path)
    sess = ort_util.session(path)
    rng = np.random.default_rng(5)
    eye = torch.eye(graph.num_outputs, dtype=torch.float64)
    free = 0
    for radius in (0.005, 0.02, 0.06):
        for _ in range(5):
            c = rng.uniform(-1.0, 2.0, 2)
            lb, ub = c - radius, c + radius
            b = Bounder(graph, lb, ub)
            b.crown()
            sites = [s for s in range(len(b.sites)) if isinstance(b.op(s), Rounding) and b.optimizable(s)]
            assert sites
            free += sum(int((op_r[1][1] > 0).sum()) for op_r in (b.op(s).slope_range(*b.pre[s]) for s in sites))
            rows = torch.cat([eye, -eye])
            crown = b.spec_bounds(Spec(rows, torch.zeros(len(rows))))
            alpha = b.alpha_spec(Spec(rows, torch.zeros(len(rows))), list(range(len(rows))), steps=20, lr=0.1)
            assert bool(torch.all(alpha >= crown - 1e-12))
            low, up = alpha[:graph.num_outputs].numpy(), -alpha[graph.num_outputs:].numpy()
            xs = np.vstack([rng.uniform(lb, ub, (SAMPLES, 2)), [lb, ub, [lb[0], ub[1]], [ub[0], lb[1]]]]).astype(np.float32)
            ys = ort_util.infer(sess, xs)
            assert np.all(ys >= low - SUM_TOL), "onnxruntime below α-CROWN's lower bound"
            assert np.all(ys <= up + SUM_TOL), "onnxruntime above α-CROWN's upper bound"
    assert free > 0


def _node_value(graph: Graph, node: int, xs: np.ndarray) -> np.ndarray:
    """The exact (float64) value of graph node `node` at inputs xs, the first quantization as the runtime computes it."""
    vals = [torch.as_tensor(xs, dtype=torch.float64)]
    for nd in graph.nodes[1:node + 1]:
        vals.append(nd.op.forward(*(vals[i] for i in nd.inputs)))
    return vals[node].detach().numpy()


def test_a_unit_below_the_first_half_step_is_dead_after_the_clamp():
    """x ∈ [−3s, 0.3s] on a grid of step s with the clamp at 0 (an absorbed ReLU): every value rounds to ≤ 0, so the
    clamp's ReLU is stable. The interval x ± E alone would leave it unstable."""
    s = 0.1
    net = Graph((1,), [Node(None, []), Node(Scale(torch.ones(1), torch.zeros(1)), [0]), Node(Rounding([s / 2 + 1e-4], [s]), [1]),
                       Node(ReLU(1), [2])], 3)
    b = Bounder(net, [-3 * s], [0.3 * s])
    b.crown()
    l, u = b.pre[-1]
    assert float(u[0]) <= 0.0 and float(l[0]) <= -3 * s + 1e-12


def _zero_points(path: Path) -> list[int]:
    m = onnx.load(str(path))
    return [int(v) for i in m.graph.initializer if i.name.endswith("zero_point") and "weight" not in i.name
            for v in numpy_helper.to_array(i).reshape(-1)]


def _output_bounds(graph, lb: np.ndarray, ub: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = Bounder(graph, lb, ub)
    b.crown()
    eye = torch.eye(graph.num_outputs, dtype=torch.float64)
    low = b.spec_bounds(Spec(eye, torch.zeros(graph.num_outputs)))
    up = -b.spec_bounds(Spec(-eye, torch.zeros(graph.num_outputs)))
    return low.numpy(), up.numpy()


@pytest.mark.parametrize("act_type", ["int8", "uint8", "int16"])
def test_relaxation_contains_onnxruntime_integer_outputs(tmp_path, act_type):
    path, _ = _tiny(tmp_path, act_type)
    zeros = _zero_points(path)
    assert any(z not in (0, 128, -128) for z in zeros), zeros
    # what is checked: the fused integer execution on 8-bit grids; on 16-bit ones, which no integer kernel takes, the
    # unfused float32 one
    assert ("QGemm" in ort_util.optimized_op_counts(path)) == (act_type != "int16")
    graph = from_onnx(path)
    sess = ort_util.session(path)
    rng = np.random.default_rng(1)
    for radius in [0.01, 0.05, 0.2, 1.0, 3.0]:  # the large boxes leave the calibration range: both clamp ends
        for _ in range(4):
            c = rng.uniform(-2.0, 2.0, 2)
            lb, ub = c - radius, c + radius
            low, up = _output_bounds(graph, lb, ub)
            xs = np.vstack([rng.uniform(lb, ub, (SAMPLES, 2)), [lb, ub, [lb[0], ub[1]], [ub[0], lb[1]]]]).astype(np.float32)
            ys = ort_util.infer(sess, xs)
            assert np.all(ys >= low - SUM_TOL) and np.all(ys <= up + SUM_TOL), (radius, c, ys.min(0), low, ys.max(0), up)
    # the output grid's ends were reached: the saturated values are inside the bounds too
    out_scale, out_zero, qmin, qmax = _output_grid(path)
    grid_lo, grid_hi = out_scale * (qmin - out_zero), out_scale * (qmax - out_zero)
    ys = ort_util.infer(sess, rng.uniform(-40, 40, (20000, 2)).astype(np.float32))
    assert np.isclose(ys.min(), grid_lo, rtol=1e-6) and np.isclose(ys.max(), grid_hi, rtol=1e-6)
    low, up = _output_bounds(graph, np.full(2, -40.0), np.full(2, 40.0))
    assert np.all(ys >= low - SUM_TOL) and np.all(ys <= up + SUM_TOL)


def _output_grid(path: Path) -> tuple[float, float, int, int]:
    m = onnx.load(str(path))
    init = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    z = init["logits_zero_point"]
    qmin, qmax = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255), np.dtype(np.int16): (-32768, 32767)}[z.dtype]
    return float(init["logits_scale"]), float(z), qmin, qmax


def _qdq_model(scale: float, zero: int, dtype: int) -> onnx.ModelProto:
    """input → QuantizeLinear → DequantizeLinear, one per-tensor grid."""
    zp = numpy_helper.from_array(np.array(zero, dtype={TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8,
                                                       TensorProto.INT16: np.int16}[dtype]), "z")
    s = numpy_helper.from_array(np.array(scale, dtype=np.float32), "s")
    g = helper.make_graph([helper.make_node("QuantizeLinear", ["input", "s", "z"], ["q"]),
                           helper.make_node("DequantizeLinear", ["q", "s", "z"], ["logits"])], "qdq",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["b", 4])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 4])], [s, zp])
    return make_model(g, 21 if dtype == TensorProto.INT16 else 19)  # 16-bit QuantizeLinear: opset 21


@pytest.mark.parametrize("scale,zero,dtype", [(1 / 255, -128, TensorProto.INT8), (0.0173, 37, TensorProto.UINT8),
                                              (0.0091, -50, TensorProto.INT8), (0.0000731, -1200, TensorProto.INT16)])
def test_first_quantization_is_exact(tmp_path, scale, zero, dtype):
    path = tmp_path / "qdq.onnx"
    onnx.save(_qdq_model(scale, zero, dtype), str(path))
    graph = from_onnx(path)
    assert isinstance(graph.nodes[graph.output].op, QuantizedInput)
    sess = ort_util.session(path)
    rng = np.random.default_rng(0)
    # points on and next to the grid's half steps, where a rounding rule would show, and beyond both clamp ends
    k = rng.integers(-300, 300, 4000)
    s32 = np.float32(scale)
    xs = np.concatenate([(k + 0.5) * s32, np.nextafter(((k + 0.5) * s32).astype(np.float32), np.float32(np.inf)),
                         rng.uniform(-4, 4, 4000)]).astype(np.float32).reshape(-1, 4)
    assert np.array_equal(graph.forward(xs.astype(np.float64)).numpy(), ort_util.infer(sess, xs).astype(np.float64))
    for _ in range(50):  # the interval is the exact range of the runtime's values over a box
        c, r = rng.uniform(-3, 3, 4), rng.uniform(0, 0.2, 4)
        lo, hi = graph.nodes[graph.output].op.interval(torch.as_tensor(c - r), torch.as_tensor(c + r))
        dense = np.linspace(c - r, c + r, 2001).astype(np.float32)
        y = ort_util.infer(sess, dense)
        assert np.array_equal(lo.numpy(), y.min(0).astype(np.float64)) and np.array_equal(hi.numpy(), y.max(0).astype(np.float64))
        assert np.array_equal(grid_index(c - r, np.full(4, scale), np.full(4, zero), -1000, 1000, "low"),
                              grid_index(c - r, np.full(4, scale), np.full(4, zero), -1000, 1000, "high"))


def _vnnlib(tmp: Path, name: str, x0: np.ndarray, eps: float, label: int) -> Path:
    return write_vnnlib(tmp / f"{name}.vnnlib", robustness_spec(x0, eps, -4.0, 4.0, label, 3))


def test_verdicts_match_exhaustive_enumeration_and_counterexamples_reproduce(tmp_path):
    """On a 2-input quantized net every input after the first quantization can be enumerated: the int8 model is robust on
    a box iff none of those grid points (each moved into the box) is misclassified by onnxruntime."""
    path, _ = _tiny(tmp_path, "int8")
    sess = ort_util.session(path)
    graph = from_onnx(path)
    qin = graph.nodes[1].op
    assert isinstance(qin, QuantizedInput)
    verifier, exact = get_verifier("auto"), get_verifier("milp")
    rng = np.random.default_rng(3)
    verdicts = {"sat": 0, "unsat": 0}
    milp_decided = 0
    # half the centres next to a decision boundary (a class change within 0.1), so that both verdicts occur
    cand = rng.uniform(-1, 2, (4000, 2)).astype(np.float32)
    near = cand[ort_util.infer(sess, cand).argmax(1) != ort_util.infer(sess, cand + np.float32(0.1)).argmax(1)]
    assert len(near) >= 10
    centres = np.vstack([near[:10], rng.uniform(-1, 2, (10, 2))])
    for i, x0 in enumerate(centres.astype(np.float64)):
        eps = float(rng.choice([0.01, 0.05, 0.2]))
        label = int(np.argmax(ort_util.forward_flat(sess, x0.astype(np.float32))))
        vnn = _vnnlib(tmp_path, f"p{i}", x0, eps, label)
        lb, ub = np.maximum(x0 - eps, -4.0), np.minimum(x0 + eps, 4.0)
        qlo = grid_index(lb, qin.scale.numpy(), qin.zero.numpy(), qin.qmin, qin.qmax, "low")
        qhi = grid_index(ub, qin.scale.numpy(), qin.zero.numpy(), qin.qmin, qin.qmax, "high")
        grid = np.stack(np.meshgrid(*[np.arange(a, b + 1) for a, b in zip(qlo, qhi)], indexing="ij"), -1).reshape(-1, 2)
        pts = np.clip(qin.scale.numpy() * (grid - qin.zero.numpy()), lb, ub).astype(np.float32)
        ys = ort_util.infer(sess, pts)
        others = np.delete(ys, label, axis=1)
        unsafe = bool(np.any(others.max(1) >= ys[:, label]))
        res = verifier.verify(path, vnn, timeout_s=20.0)
        assert res.status in ("sat", "unsat", "timeout", "unknown"), res.message
        # the MILP encodes every rounding with an integer (y = s·k, |y − x| ≤ E): it decides, and agrees
        by_milp = exact.verify(path, vnn, timeout_s=20.0)
        assert by_milp.status == ("sat" if unsafe else "unsat") or by_milp.status in ("timeout", "unknown"), by_milp.message
        milp_decided += by_milp.status in ("sat", "unsat")
        if res.status == "unsat":
            assert not unsafe, f"property {i}: unsat, but enumeration finds a misclassified grid point"
        if res.status == "sat":
            assert unsafe, f"property {i}: sat, but no grid point is misclassified"
            x = res.counterexample.astype(np.float32)
            assert np.all(x >= lb - 1e-12) and np.all(x <= ub + 1e-12)
            y = ort_util.forward_flat(sess, x)
            assert np.max(np.delete(y, label)) > y[label], "the witness must be strictly misclassified in onnxruntime"
        if res.status in verdicts:
            verdicts[res.status] += 1
    assert verdicts["sat"] >= 1 and verdicts["unsat"] >= 1, verdicts
    assert verdicts["sat"] + verdicts["unsat"] >= 16, verdicts  # decided, not only sound
    assert milp_decided >= 19, milp_decided


def test_8bit_weights_are_refused_with_the_fix(tmp_path):
    path, _ = _tiny(tmp_path, "int8", reduce_range=False)
    with pytest.raises(UnsupportedModel, match="reduce_range=true"):
        from_onnx(path)


def test_unpaired_dequantize_is_refused(tmp_path):
    m = _qdq_model(0.01, 3, TensorProto.UINT8)
    m.graph.node[1].input[1] = "s2"  # another scale than its QuantizeLinear's
    m.graph.initializer.append(numpy_helper.from_array(np.array(0.02, dtype=np.float32), "s2"))
    with pytest.raises(UnsupportedModel, match="differs from its QuantizeLinear"):
        from_onnx(m)


def _qdq_matmul(w_int: np.ndarray) -> onnx.ModelProto:
    """input → Q → DQ → MatMul by DequantizeLinear(int8 weights) → Q → DQ: a MatMul the way a QDQ quantizer writes it."""
    s, z = numpy_helper.from_array(np.array(0.01, dtype=np.float32), "s"), numpy_helper.from_array(np.array(0, dtype=np.int8), "z")
    w = numpy_helper.from_array(w_int.astype(np.int8), "w")
    ws, wz = numpy_helper.from_array(np.array(0.02, dtype=np.float32), "ws"), numpy_helper.from_array(np.array(0, dtype=np.int8), "wz")
    nodes = [helper.make_node("QuantizeLinear", ["input", "s", "z"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "z"], ["x"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["W"]), helper.make_node("MatMul", ["x", "W"], ["v"]),
             helper.make_node("QuantizeLinear", ["v", "s", "z"], ["q2"]), helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["logits"])]
    g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["b", 3])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 2])], [s, z, w, ws, wz])
    return make_model(g, 19)


def test_a_matmul_on_dequantized_weights_is_read_and_8bit_ones_refused_with_the_fix(tmp_path):
    narrow = np.array([[10, -64], [64, 3], [-20, 7]])
    path = tmp_path / "mm.onnx"
    onnx.save(_qdq_matmul(narrow), str(path))
    graph = from_onnx(path)
    rng = np.random.default_rng(0)
    lb, ub = np.full(3, -0.3), np.full(3, 0.4)
    low, up = _output_bounds(graph, lb, ub)
    ys = ort_util.infer(ort_util.session(path), rng.uniform(lb, ub, (SAMPLES, 3)).astype(np.float32))
    assert np.all(ys >= low - SUM_TOL) and np.all(ys <= up + SUM_TOL)
    with pytest.raises(UnsupportedModel, match="reduce_range=true"):
        from_onnx(_qdq_matmul(np.array([[100, -64], [64, 3], [-20, 7]])))


INT8_BUDGET_S = 8.0
STAGE_SLACK_S = 5.0  # worker start-up and the last round's answer after the budget's end (measured ≤ 2 s here)


def test_the_verify_stage_has_int8_rows_a_chain_and_their_own_budget(tmp_path):
    """The int8 stage's file of a digits ReLU MLP through the verify stage: `<variant>-int8` rows in their own results.csv
    category, the file beside the float one, a chain row per property, the int8 part within its own budget, every int8
    witness misclassified by onnxruntime on the int8 model, and the report's int8 line."""
    import csv as csv_
    import json

    from _digits import make_run, trained
    from analysis.robustness.properties import read_rows
    from analysis.verification.vnncomp import read_results
    from pipeline.config import ConfigError, apply_overrides
    from pipeline.stages import export as export_stage, int8 as int8_stage
    from pipeline.stages.verify import run_verify, validate_config
    from pipeline.stages.verify_report import report_section

    run = make_run(tmp_path, {"relu": trained("relu")})
    export_stage.run_export(run.cfg, run)
    int8_stage.run_int8(run.cfg, run)
    v = run.cfg.verify
    v.samples, v.epsilons, v.smooth, v.budget_s, v.int8_budget_s = 3, [0.01, 0.2], False, 30.0, INT8_BUDGET_S
    run_verify(run.cfg, run)
    out = run.file("verify")
    rows = read_rows(out / "details.csv")
    int8 = [r for r in rows if r["variant"] == "relu-int8"]
    assert len(int8) == 6 and len(rows) == 12
    assert {r["category"] for r in read_results(out / "results.csv")} == {"relu", "relu-int8"}
    assert (out / "onnx" / "relu-int8.onnx").is_file()
    s = json.loads((out / "summary.json").read_text())
    assert s["int8_budget_s"] == INT8_BUDGET_S and 0 < s["int8_solve_seconds"] <= INT8_BUDGET_S + STAGE_SLACK_S
    assert s["decided"]["int8"]["properties"] == 6
    assert {r["result"] for r in int8} == {"sat", "unsat"}  # both verdicts occur (ε 0.01 proves, 0.2 falsifies)
    # the ReLUs branch and bound can split: the clamp's two per requantized unit (64 + 32 hidden, 10 logits), not the
    # roundings, whose units are never counted unstable
    assert {int(r["relus"]) for r in int8} == {2 * (64 + 32 + 10)} and {int(r["relus"]) for r in rows if r not in int8} == {64 + 32}
    sess = ort_util.session(out / "onnx" / "relu-int8.onnx")
    for r in int8:
        if r["result"] == "sat" and r["stage"] != "clean":
            text = (out / r["witness"]).read_text().replace("(", "\n(")
            x = np.asarray([float(t.split()[1].rstrip(")")) for t in text.splitlines() if t.startswith("(X_")], dtype=np.float32)
            y = ort_util.forward_flat(sess, x)
            assert np.max(np.delete(y, int(r["label"]))) > y[int(r["label"])], "an int8 witness is misclassified in onnxruntime"
    with open(out / "chain.csv") as f:
        chain = list(csv_.DictReader(f))
    assert len(chain) == 6 and {c["int8"] for c in chain} <= {"unsat", "sat", "timeout", "unknown", "error"}
    assert all(c["carries_over"] for c in chain)
    md = report_section(run.cfg, run)
    assert "int8 models:" in md and f"own budget of {INT8_BUDGET_S:g} s" in md
    # the report says why the int8 rows count more ReLU units than the float rows: the clamps' two per unit
    assert "two ReLUs per requantized unit" in md and "| 212 |" in md and "| 96 |" in md
    from PIL import Image

    with Image.open(run.file("report", "verify_fractions.png")) as im:  # the figure: float ReLU and int8 panels
        assert im.size[0] > 2 * im.size[1]
    with pytest.raises(ConfigError, match="int8_budget_s"):
        validate_config(apply_overrides(run.cfg, ["verify.int8_budget_s=0"]))


# -- the int8 graphs the export makes beyond MLPs: normalization, residual adds, BatchNorm, transformers ------------

def _builtin_int8(tmp: Path, name: str, seed: int = 0, act_type: str = "int8", **model) -> tuple[Path, Path]:
    """A built-in model (random weights, digits' shapes, ReLU) exported and quantized by the int8 stage's recipe
    (activations on `act_type` grids)."""
    import dataclasses

    from pipeline.config import GateConfig, ModelConfig
    from pipeline.models import build_model
    from quantize.export import save, to_onnx

    torch.manual_seed(seed)
    spec = {"model": dataclasses.asdict(ModelConfig(name=name, **model)), "activation": "relu",
            "gate": dataclasses.asdict(GateConfig()), "input_shape": [1, 8, 8], "num_classes": 10, "mean": [0.3], "std": [0.4]}
    m = build_model(spec).eval()
    fp32 = tmp / f"{name}.onnx"
    proto, _ = to_onnx(m, torch.zeros(1, 1, 8, 8), opset=20, simplify=True, dynamic_batch=True)
    save(proto, fp32)
    calib = np.random.default_rng(seed).uniform(0, 1, (128, 1, 8, 8)).astype(np.float32)
    int8 = tmp / f"{name}.{act_type}.onnx"
    cfg = Config()
    cfg.quantize.activation_type = act_type
    quantize_file(fp32, int8, calib, cfg.quantize, tmp)
    return fp32, int8


@pytest.mark.parametrize("name,model,act_type", [("cnn", {"channels": [4, 8], "cnn_hidden": 16}, "int8"),
                                                 ("preact_resnet", {"channels": [2, 4]}, "int8"),
                                                 ("resnet18_cifar", {"resnet_width": 2}, "int8"),
                                                 ("deit_tiny", {"dim": 8, "depth": 1, "heads": 2, "patch_size": 4, "mlp_ratio": 2}, "int8"),
                                                 ("preact_resnet", {"channels": [2, 4]}, "int16"),
                                                 ("cnn", {"channels": [4, 8], "cnn_hidden": 16}, "int16")])
def test_int8_graphs_of_the_builtin_models_read_and_their_bounds_contain_onnxruntime(tmp_path, name, model, act_type):
    """The QuantizeLinear after the input's normalization (exact), after a residual Add, a BatchNorm, a LayerNorm, a
    Softmax, a MatMul of two tensors: read, and CROWN's output bounds over boxes contain what onnxruntime computes at
    sampled points (uniform and corners) of each box; with 16-bit activation grids (w8a16, run unfused) too."""
    _, int8 = _builtin_int8(tmp_path, name, act_type=act_type, **model)
    graph = from_onnx(int8)
    sess = ort_util.session(int8)
    rng = np.random.default_rng(1)
    for eps in (0.002, 0.02):
        x0 = rng.uniform(0, 1, 64)
        lb, ub = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
        try:
            lo, hi = _output_bounds(graph, lb, ub)
        except OutOfDomain:  # a LayerNorm whose variance may vanish on the wider box: no bound, and it says so
            assert name == "deit_tiny" and eps > 0.002
            continue
        pts = np.concatenate([rng.uniform(lb, ub, (400, 64)), np.where(rng.random((400, 64)) < 0.5, lb, ub), x0[None]])
        y = sess.run(None, {sess.get_inputs()[0].name: pts.reshape(-1, 1, 8, 8).astype(np.float32)})[0]
        assert np.all(y >= lo - SUM_TOL) and np.all(y <= hi + SUM_TOL), (name, eps, float((lo - y).max()), float((y - hi).max()))


def test_the_input_normalization_folds_into_an_exact_first_quantization(tmp_path):
    """A CNN's Mul/Add before its first QuantizeLinear: the quantized values onnxruntime computes at sampled points of a
    box lie in `QuantizedInput`'s range for the box, and that range is attained (its ends are values the runtime takes)."""
    _, int8 = _builtin_int8(tmp_path, "cnn", channels=[2], cnn_hidden=4)
    model = onnx.load(str(int8))
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("/norm/"))
    model.graph.output.append(helper.make_tensor_value_info(dq.output[0], TensorProto.FLOAT, None))
    probe = tmp_path / "probe.onnx"
    onnx.save(model, probe)
    graph = from_onnx(int8)
    q = next(n.op for n in graph.nodes if isinstance(n.op, QuantizedInput))
    assert q.pre_scale is not None and q.pre_ops == 2
    sess = ort_util.session(probe)
    rng = np.random.default_rng(0)
    for eps in (0.0, 0.003, 0.05):
        x0 = rng.uniform(0, 1, 64)
        lb, ub = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
        lo, hi = q.interval(torch.as_tensor(lb), torch.as_tensor(ub))
        pts = np.concatenate([rng.uniform(lb, ub, (300, 64)), lb[None], ub[None]])
        got = sess.run(None, {"input": pts.reshape(-1, 1, 8, 8).astype(np.float32)})[1].reshape(len(pts), -1)
        assert np.all(got >= lo.numpy()) and np.all(got <= hi.numpy())
        np.testing.assert_array_equal(np.minimum(got[-2], got[-1]), lo.numpy())  # the box's ends give the range's ends
        np.testing.assert_array_equal(np.maximum(got[-2], got[-1]), hi.numpy())


def _ln_model(N: int) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    g, b = rng.normal(size=N).astype(np.float32), rng.normal(size=N).astype(np.float32)
    graph = helper.make_graph([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)], "ln",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, N])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, N])],
                              [numpy_helper.from_array(g, "g"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), g, b


@pytest.mark.parametrize("N", [4, 16, 64])
def test_layer_norm_rounding_bounds_onnxruntime_float32_layer_norm_on_ill_conditioned_rows(tmp_path, N):
    """|onnxruntime's LayerNorm − the exact one| ≤ `layer_norm_rounding` per unit, on rows whose mean dwarfs their spread
    (the one-pass E[x²] − E[x]² loses digits there), given the exact variance of each row as the box's lower bound."""
    from analysis.verification.quantized import layer_norm_rounding

    model, g, b = _ln_model(N)
    path = tmp_path / "ln.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(N)
    rows = []
    for mean, spread in [(0, 1), (3, 0.1), (10, 0.01), (30, 0.003), (5, 1e-3), (0, 1e-3), (20, 1.0)]:
        rows.append(mean + spread * rng.standard_normal((200, N)))
    x = np.concatenate(rows).astype(np.float32)
    y = ort_util.session(path).run(None, {"x": x})[0].astype(np.float64)
    xd = x.astype(np.float64)
    var = xd.var(1)
    exact = (xd - xd.mean(1, keepdims=True)) / np.sqrt(var + 1e-5)[:, None] * g + b
    A = np.abs(xd)
    E = layer_norm_rounding((torch.as_tensor(A.mean(1)), torch.as_tensor((A * A).mean(1)), torch.as_tensor(A.max(1))),
                            torch.as_tensor(var + 1e-5), torch.zeros(len(x), dtype=torch.float64),
                            torch.as_tensor(g, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), N, 1e-5).numpy()
    err = np.abs(y - exact)
    assert np.all(err <= E), float((err - E).max())
    # not vacuous where the mean is at most 30 spreads (groups 0, 1, 5, 6): finite, and within 1e6 times the largest
    # error measured there (measured up to 1.2e5 times at N = 64; the γ_{N+2} terms are worst cases of aligned
    # roundings); where the mean is 1e3-1e4 spreads the one-pass variance may lose every digit and E is ∞
    good = np.r_[0:400, 1000:1400]
    assert np.all(np.isfinite(E[good])) and E[good].max() < 1e6 * max(err[good].max(), 1e-7)


def test_softmax_kernel_error_stays_within_its_measured_constant(tmp_path):
    """`quantized.SOFTMAX_K` is 8× the largest K with |p̃ − p| ≤ K·u·(T + W + 4)·p measured on onnxruntime's Softmax:
    re-measured here (rows of widths 2–197, scales 0.01–80), it must stay below an eighth of the constant."""
    from analysis.verification.quantized import SOFTMAX_K, U

    worst = 0.0
    rng = np.random.default_rng(0)
    for T in (2, 5, 17, 64, 197):
        graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "sm",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, T])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, T])])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), tmp_path / "sm.onnx")
        sess = ort_util.session(tmp_path / "sm.onnx")
        for scale in (0.01, 1, 10, 80):
            x = (rng.standard_normal((2000, T)) * scale).astype(np.float32)
            y = sess.run(None, {"x": x})[0].astype(np.float64)
            xd = x.astype(np.float64)
            e = np.exp(xd - xd.max(1, keepdims=True))
            p = e / e.sum(1, keepdims=True)
            W = xd.max(1, keepdims=True) - xd.min(1, keepdims=True)
            ok = p > 1e-30
            worst = max(worst, float((np.abs(y - p) / (p * U * (T + W + 4)))[ok].max()))
    assert worst * 8 <= SOFTMAX_K, worst


def test_an_int8_layer_norm_without_an_error_bound_is_named_and_the_requantization_after_it_bounds_it(tmp_path):
    """An int8 ViT (the coverage table's tiny deit) on boxes so wide that LayerNorm rows may be constant: those
    LayerNorms' float32 error has no bound there, and `why_unbounded` names them and their rows; the QuantizeLinear
    after each saturates whatever it gets, so interval arithmetic through its clamp keeps every later value in its
    grid's range: the softmax cannot overflow, the pass finishes, and the margin bound is finite, no lower than the
    logits' grid range allows."""
    from analysis.robustness import coverage
    from analysis.verification.problem import Budget, Problem
    from pipeline.onnx_io import to_onnx
    from quantize import export as export_mod

    relu, shape, x = coverage._build("deit_tiny", "relu")
    proto, _ = to_onnx(export_mod.fold_normalization(relu, shape) or relu, x[:2], 20, True, None)
    export_mod.save(proto, tmp_path / "fp32.onnx")
    quantize_file(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", x.numpy(), Config().quantize, tmp_path)
    net = from_onnx(tmp_path / "int8.onnx")
    x0 = x[0].numpy().reshape(-1).astype(np.float64)
    label = int(np.argmax(ort_util.forward_flat(ort_util.session(tmp_path / "int8.onnx"), x0.astype(np.float32))))
    for eps, named in ((0.2, ("ln1/LayerNormalization has no float32 error bound on", "/net/ln/")),
                       (0.02, ("/net/ln/LayerNormalization has no float32 error bound on 1 of 5 rows",))):
        b = Bounder(net, np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1))
        b.crown()  # finishes: no OutOfDomain
        why = b.why_unbounded()
        assert all(n in why for n in named), (eps, why)
        lo, hi = b.ibp_out
        res = get_verifier("crown").run(Problem([robustness_spec(x0, eps, 0.0, 1.0, label, 10)], network=net), Budget(20.0))
        assert res.status == "unknown" and "OutOfDomain" not in res.message and "unbounded" not in res.message, res.message
        assert -float(hi.max() - lo.min()) <= res.info["margin_lb"] < 0, (eps, res.info)


INT16_WIDTH = 1.25  # a 16-bit graph's output bound width against the float graph's (measured 1.06 here; int8: 10.7)


def test_sixteen_bit_activations_give_grids_257_times_finer_and_the_float_graphs_bounds(tmp_path):
    """`quantize.activation_type` "int16" (w8a16): every activation grid's step is the int8 one's × 255/65535 (the same
    calibrated ranges over 65535 steps instead of 255), the graph runs unfused (no integer kernel takes a 16-bit input),
    8-bit weights are read there (the int16 pair saturation of the fused u8s8 kernels cannot occur), and CROWN's output
    bounds come within a few percent of the float graph's, where the int8 graph's are several times wider."""
    fp32, q8 = _builtin_int8(tmp_path, "preact_resnet", channels=[2, 4])
    _, q16 = _builtin_int8(tmp_path, "preact_resnet", channels=[2, 4], act_type="int16")
    steps = {}
    for name, path in (("int8", q8), ("int16", q16)):
        g = from_onnx(path)
        steps[name] = [n.op.step for n in g.nodes[1:] if isinstance(n.op, Rounding) and n.op.step is not None]
        assert steps[name], "no grid rounding read"
    assert len(steps["int8"]) == len(steps["int16"])
    for s8, s16 in zip(steps["int8"], steps["int16"]):
        assert torch.allclose(s16, s8 * 255 / 65535, rtol=1e-5)
    assert "QLinearConv" not in ort_util.optimized_op_counts(q16)
    x0 = np.random.default_rng(2).uniform(0, 1, 64)
    lb, ub = np.clip(x0 - 0.002, 0, 1), np.clip(x0 + 0.002, 0, 1)
    width = {k: float(np.max(np.subtract(*_output_bounds(from_onnx(p), lb, ub)[::-1])))
             for k, p in (("float", fp32), ("int8", q8), ("int16", q16))}
    assert width["int16"] <= INT16_WIDTH * width["float"] and width["int8"] >= 3 * width["int16"], width
    # 8-bit weights: refused on 8-bit grids (the fused kernels' saturation), read on 16-bit ones
    cfg = Config()
    cfg.quantize.activation_type, cfg.quantize.reduce_range = "int16", False
    wide = tmp_path / "wide16.onnx"
    quantize_file(fp32, wide, np.random.default_rng(0).uniform(0, 1, (128, 1, 8, 8)).astype(np.float32), cfg.quantize, tmp_path)
    from_onnx(wide)


def test_a_transformer_matmul_on_quantized_weights_in_a_16_bit_graph_is_refused_with_the_fix(tmp_path, monkeypatch):
    """On a 16-bit graph onnxruntime rewrites DequantizeLinear → MatMul (a transformer's Linear on 3-d tokens) as
    MatMulNBits, which by default requantizes its input to int8 per block: its outputs then leave the float32 bound
    (measured on this deit: up to 4.5e-4 outside CROWN's output bounds at ε 0.002). The reader refuses it, naming the
    fix, rather than certify an execution it does not bound."""
    import quantize.int8 as q8

    monkeypatch.setattr(q8, "_gemm_weights_transposed", lambda path: 0)  # the file as onnxruntime's quantizer makes it
    _, q16 = _builtin_int8(tmp_path, "deit_tiny", act_type="int16", dim=8, depth=1, heads=2, patch_size=4, mlp_ratio=2)
    assert "MatMulNBits" in ort_util.optimized_op_counts(q16)
    with pytest.raises(UnsupportedModel, match="MatMulNBits.*quantize.activation_type int8"):
        from_onnx(q16)


def test_a_transformer_quantized_with_16_bit_activations_keeps_float32_gemms_and_is_read(tmp_path):
    """The int8 stage stores a 16-bit graph's token Linear weights transposed (transB=1, the same function), which
    onnxruntime runs as float32 Gemms, not MatMulNBits: the deit is read, and CROWN's output bounds contain what
    onnxruntime computes, each side apart."""
    from quantize.int8 import _gemm_weights_transposed

    _, q16 = _builtin_int8(tmp_path, "deit_tiny", act_type="int16", dim=8, depth=1, heads=2, patch_size=4, mlp_ratio=2)
    counts = ort_util.optimized_op_counts(q16)
    assert "MatMulNBits" not in counts and counts.get("Gemm", 0) >= 5
    graph = from_onnx(q16)
    sess = ort_util.session(q16)
    rng = np.random.default_rng(3)
    x0 = rng.uniform(0, 1, 64)
    lb, ub = np.clip(x0 - 0.002, 0, 1), np.clip(x0 + 0.002, 0, 1)
    lo, hi = _output_bounds(graph, lb, ub)
    pts = np.concatenate([rng.uniform(lb, ub, (400, 64)), np.where(rng.random((400, 64)) < 0.5, lb, ub), x0[None]])
    y = sess.run(None, {sess.get_inputs()[0].name: pts.reshape(-1, 1, 8, 8).astype(np.float32)})[0]
    assert np.all(y >= lo - SUM_TOL) and np.all(y <= hi + SUM_TOL)
    # the rewrite keeps the function: the fp32 file with its Gemms transposed gives the same outputs
    fp32 = tmp_path / "deit_tiny.onnx"
    t = tmp_path / "transposed.onnx"
    t.write_bytes(fp32.read_bytes())
    assert _gemm_weights_transposed(t) == 4
    xs = pts.reshape(-1, 1, 8, 8).astype(np.float32)
    a, b = (ort_util.session(f).run(None, {"input": xs})[0] for f in (fp32, t))
    assert np.allclose(a, b, rtol=0, atol=GEMM_T_ATOL)


GEMM_T_ATOL = 1e-5  # float32 Gemm with the weight transposed: another summation order at most


def _counted_pass(graph, lb, ub, monkeypatch) -> tuple[int, list, tuple[np.ndarray, np.ndarray]]:
    """(units CROWN queried, per ReLU site its (dead, active) masks, the output bounds) of one CROWN pass."""
    from analysis.verification import crown

    queried = [0]
    rows = crown.CrownPass._rows

    def counting(self, j, idx, n, *a, **k):
        queried[0] += idx.numel()
        return rows(self, j, idx, n, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(crown.CrownPass, "_rows", counting)
        b = Bounder(graph, lb, ub)
        b.crown()
        states = [(u <= 0, l >= 0) for (l, u), k in zip(b.pre, b.sites) if isinstance(b.net.nodes[k].op, ReLU)]
        return queried[0], states, _output_bounds(graph, lb, ub)


@pytest.mark.parametrize("skip", ["dead clamps", "first quantization"])
def test_units_read_only_by_dead_clamps_are_not_queried_and_the_bounds_do_not_move(tmp_path, monkeypatch, skip):
    """Two queries CROWN skips because they cannot change a bound: a rounding's unit whose clamp ReLU is dead on the
    interval it gets has coefficient 0 in every back-substitution (`CrownPass._not_worth_querying`; its own interval
    stays interval arithmetic's), and the first conv after the input's quantization, whose constant lines make CROWN's
    bound of it interval arithmetic's (`_exact_by_ibp`, `flat_lines`). Every ReLU's stable and unstable units and the
    output bounds equal those of the pass that queries them (the reference: the same pass with that skip turned off;
    both with `Rounding.LOOSE_STEPS` infinite, so that only these skips differ)."""
    from analysis.verification import crown

    _, int8 = _builtin_int8(tmp_path, "cnn", channels=[4, 8], cnn_hidden=16)
    graph = from_onnx(int8)
    monkeypatch.setattr(Rounding, "LOOSE_STEPS", math.inf)
    rng = np.random.default_rng(3)
    skipped = 0
    for eps in (0.002, 0.02, 0.1):
        x0 = rng.uniform(0, 1, 64)
        lb, ub = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
        n, states, bounds = _counted_pass(graph, lb, ub, monkeypatch)
        with monkeypatch.context() as m:
            if skip == "dead clamps":
                m.setattr(crown.CrownPass, "_not_worth_querying", lambda self, s: None)
            else:
                m.setattr(QuantizedInput, "flat_lines", False)
            n0, states0, bounds0 = _counted_pass(graph, lb, ub, monkeypatch)
        assert n <= n0
        skipped += n0 - n
        for (dead, active), (dead0, active0) in zip(states, states0):
            assert torch.equal(dead, dead0) and torch.equal(active, active0), eps
        for a, c in zip(bounds, bounds0):
            assert np.allclose(a, c, atol=SUM_TOL, rtol=0), eps
    assert skipped > 0  # the skip had something to skip on some box


def test_rounding_units_over_many_steps_with_a_stable_clamp_are_not_queried_and_the_bounds_contain_onnxruntime(
        tmp_path, monkeypatch):
    """A grid rounding's unit whose interval spans more than `Rounding.LOOSE_STEPS` steps and whose clamp ReLUs are
    stable there keeps its lines x ± E whatever CROWN would say, so it is not queried (`_not_worth_querying`): the pass
    queries fewer units than with LOOSE_STEPS infinite on some box, and its output bounds, each side apart, still
    contain what onnxruntime's int8 model computes at sampled points (uniform and corners) of each box."""
    _, int8 = _builtin_int8(tmp_path, "cnn", channels=[4, 8], cnn_hidden=16)
    graph = from_onnx(int8)
    sess = ort_util.session(int8)
    rng = np.random.default_rng(5)
    skipped = 0
    for eps in (0.01, 0.05, 0.1):
        x0 = rng.uniform(0, 1, 64)
        lb, ub = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
        n, _, (lo, hi) = _counted_pass(graph, lb, ub, monkeypatch)
        with monkeypatch.context() as m:
            m.setattr(Rounding, "LOOSE_STEPS", math.inf)
            n0, _, _ = _counted_pass(graph, lb, ub, monkeypatch)
        skipped += n0 - n
        pts = np.concatenate([rng.uniform(lb, ub, (400, 64)), np.where(rng.random((400, 64)) < 0.5, lb, ub), x0[None]])
        y = sess.run(None, {sess.get_inputs()[0].name: pts.reshape(-1, 1, 8, 8).astype(np.float32)})[0]
        assert np.all(y >= lo - SUM_TOL), (eps, float((lo - y).max()))
        assert np.all(y <= hi + SUM_TOL), (eps, float((y - hi).max()))
    assert skipped > 0


LOCAL_TOL = 1e-9  # relative: the same sums of products in another order (float64)


@pytest.mark.parametrize("quantized", [True, False])
def test_query_rows_carried_on_their_receptive_field_give_the_full_rows_bounds(tmp_path, monkeypatch, quantized):
    """CROWN's query rows of a conv's units carried through the per-unit ops behind it on the units they reach alone
    (`CrownPass._local_back`): every site's interval and the output bounds equal those of the full rows' pass (the
    reference: the same pass with `_local_back` off), on the int8 CNN and on its float model, over three boxes."""
    from analysis.verification import crown

    fp32, int8 = _builtin_int8(tmp_path, "cnn", channels=[4, 8], cnn_hidden=16)
    graph = from_onnx(int8 if quantized else fp32)
    rng = np.random.default_rng(7)
    used = 0
    local = crown.CrownPass._local_back

    def counting(self, idx, j):
        nonlocal used
        out = local(self, idx, j)
        used += out is not None
        return out

    for eps in (0.002, 0.02, 0.1):
        x0 = rng.uniform(0, 1, 64)
        lb, ub = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
        passes = []
        for on in (True, False):
            with monkeypatch.context() as m:
                m.setattr(crown.CrownPass, "_local_back", counting if on else (lambda self, idx, j: None))
                b = Bounder(graph, lb, ub)
                b.crown()
                passes.append((b.pre, _output_bounds(graph, lb, ub)))
        for (l, u), (l0, u0) in zip(passes[0][0], passes[1][0]):
            assert torch.allclose(l, l0, rtol=LOCAL_TOL, atol=LOCAL_TOL) and torch.allclose(u, u0, rtol=LOCAL_TOL, atol=LOCAL_TOL), eps
        for a, c in zip(passes[0][1], passes[1][1]):
            assert np.allclose(a, c, rtol=LOCAL_TOL, atol=LOCAL_TOL), eps
    assert used > 0  # some query went the local way


BACK_TOL = 1e-12  # float64 sums of at most 9·6 products of unit-scale values, in another order than torch's


@pytest.mark.parametrize("stride,padding,dilation", [((1, 1), (1, 1), (1, 1)), ((2, 1), (1, 0), (1, 2)), ((2, 2), (0, 0), (1, 1))])
@pytest.mark.parametrize("cin,cout,groups", [(3, 4, 1), (4, 4, 4), (4, 6, 2)])  # plain, depthwise, grouped ×3
def test_a_convs_unit_rows_are_its_transposed_convolution_of_one_hot_rows(stride, padding, dilation, cin, cout, groups):
    """`Conv.unit_rows` (each unit's kernel placed on its window, a grouped conv's on its group's channels) equals
    the units' one-hot rows through torch's transposed convolution exactly, taps in the padding included."""
    from analysis.verification.ops.affine import Conv

    g = torch.Generator().manual_seed(0)
    conv = Conv(torch.randn(cout, cin // groups, 3, 3, generator=g, dtype=torch.float64),
                torch.randn(cout, generator=g, dtype=torch.float64), (cin, 9, 7), stride, padding, dilation, groups)
    units = torch.arange(conv.out_size)
    E = torch.eye(conv.out_size, dtype=torch.float64)
    rows0 = F.conv_transpose2d(E.reshape(-1, *conv.out_shape), conv.weight, None, conv.stride, conv.padding,
                               tuple(conv._output_padding()), groups, conv.dilation).reshape(conv.out_size, -1)
    c0 = E.reshape(-1, *conv.out_shape).sum(dim=(2, 3)) @ conv.bias
    rows, c = conv.unit_rows(units)
    assert torch.equal(rows, rows0) and torch.equal(c, c0)
    # and `back` of dense rows (its grouped and depthwise products on maps too large for its dense matrix)
    A = torch.randn(5, conv.out_size, generator=g, dtype=torch.float64)
    (back,), _ = conv.back(A)
    ref = F.conv_transpose2d(A.reshape(-1, *conv.out_shape), conv.weight, None, conv.stride, conv.padding,
                             tuple(conv._output_padding()), groups, conv.dilation).reshape(5, -1)
    assert torch.allclose(back, ref, rtol=BACK_TOL, atol=BACK_TOL)
