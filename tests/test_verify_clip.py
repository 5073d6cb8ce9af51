"""Clip (ReLU6, clamp) read as two nested ReLUs: interval arithmetic keeps its range, its CROWN lines hold at sampled
points on intervals straddling either kink or both, each side apart, and a MobileNetV2-style ReLU6 net's CROWN bounds
hold at onnxruntime's outputs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from _onnx import make_model
from analysis.verification.bounds import Bounder, Spec
from analysis.verification.readers import from_onnx, from_torch

LO, HI = 0.0, 6.0
N = 400  # units, one box each side of the kinks
EXACT_TOL = 1e-12  # float64 interval arithmetic of clamp on [l, u]: exact but for one rounding
LINE_TOL = 1e-9  # a relaxation line's float64 evaluation at a point, against the float64 clamp there
ORT_TOL = 1e-4  # onnxruntime's float32 forward of the ReLU6 net against CROWN's float64 bounds


def _clip_model(n: int):
    """x [1, n] → Clip(x, LO, HI) → y."""
    inits = [numpy_helper.from_array(np.array(LO, dtype=np.float32), "lo"),
             numpy_helper.from_array(np.array(HI, dtype=np.float32), "hi")]
    graph = helper.make_graph([helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="relu6")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    return make_model(graph, 17)


def _boxes(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Per unit an interval: a quarter each straddling 0 only, 6 only, both, and anywhere in [−10, 16]."""
    q = N // 4
    l = np.concatenate([rng.uniform(-5, 0, q), rng.uniform(0, 6, q), rng.uniform(-8, 0, q), rng.uniform(-10, 16, q)])
    u = np.concatenate([rng.uniform(0, 6, q), rng.uniform(6, 12, q), rng.uniform(6, 14, q), l[3 * q:] + rng.uniform(0, 8, q)])
    return torch.tensor(l), torch.tensor(u)


def test_interval_arithmetic_keeps_the_clip_range():
    l, u = _boxes(np.random.default_rng(0))
    b = Bounder(from_onnx(_clip_model(N)), l, u)
    lo, hi = b.ibp_out
    torch.testing.assert_close(lo, l.clamp(LO, HI), rtol=0, atol=EXACT_TOL)
    torch.testing.assert_close(hi, u.clamp(LO, HI), rtol=0, atol=EXACT_TOL)


@pytest.mark.parametrize("side", ["lower", "upper"])
def test_crown_lines_hold_at_sampled_points(side):
    rng = np.random.default_rng(1)
    l, u = _boxes(rng)
    b = Bounder(from_onnx(_clip_model(N)), l, u)
    b.crown()
    sign = 1.0 if side == "lower" else -1.0
    A = sign * torch.eye(N, dtype=torch.float64)
    got: list[torch.Tensor] = []
    bound = b.backward(A, b.net.output, inputs=got)  # lower bounds of sign·y_i, a line in x_i each
    A_in = got[0]
    assert torch.count_nonzero(A_in - torch.diag(torch.diagonal(A_in))) == 0  # unit i's line reads x_i only
    slope = torch.diagonal(A_in)
    const = bound - (slope.clamp(min=0) * l + slope.clamp(max=0) * u)
    x = l + (u - l) * torch.rand(2000, N, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x = torch.cat([x, l[None], u[None], torch.full_like(l, LO).clamp(l, u)[None], torch.full_like(l, HI).clamp(l, u)[None]])
    y = sign * x.clamp(LO, HI)
    gap = y - (slope * x + const)
    assert float(gap.min()) >= -LINE_TOL, (side, float(gap.min()))
    both = (l < LO) & (u > HI)
    assert int(both.sum()) >= N // 4  # the two-kink case is exercised
    if side == "upper":  # each unit's CROWN upper bound is at most max(u, HI) (the nested form's worst: u's chord)
        assert bool((-bound <= u.clamp(min=HI) + EXACT_TOL).all())
        # crossing both kinks with u ≥ 12, the second ReLU's lower line is 0: the flat line HI, exact
        far = both & (u >= 2 * HI)
        torch.testing.assert_close(-bound[far], torch.full_like(bound[far], HI), rtol=0, atol=EXACT_TOL)


@pytest.mark.slow
def test_mobilenet_relu6_crown_bounds_hold_in_onnxruntime(tmp_path):
    """The 12.9k-parameter MobileNetV2-style ReLU6 net (random weights) at ε 0.02, where its ReLU6 units cross both
    kinks: CROWN's bounds on every logit hold at 1,000 points of the box (vertices and uniform), run by onnxruntime."""
    from benchmarks.crown_time import BLOCKS_13K, mobilenet
    from analysis.verification.readers import OPSET
    from pipeline.onnx_io import to_onnx

    model = mobilenet(BLOCKS_13K)
    net = from_torch(model, (3, 32, 32))
    proto, _ = to_onnx(model, torch.zeros(1, 3, 32, 32), opset=OPSET, simplify=False, dynamic_batch=True)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(3)
    x0 = torch.rand(3 * 32 * 32, generator=gen, dtype=torch.float64)
    eps = 0.02
    lb, ub = (x0 - eps).clamp(0, 1), (x0 + eps).clamp(0, 1)
    b = Bounder(net, lb, ub)
    b.crown()
    crossing = sum(b.result().unstable())
    assert crossing > 100  # the ReLU6 units cross their kinks: the relaxations are exercised
    C = torch.cat([torch.eye(10, dtype=torch.float64), -torch.eye(10, dtype=torch.float64)])
    lower = b.spec_bounds(Spec(C, torch.zeros(20)))
    lo, hi = lower[:10], -lower[10:]
    u01 = torch.rand(500, x0.numel(), generator=gen, dtype=torch.float64)
    pts = torch.cat([lb + (ub - lb) * u01, torch.where(torch.rand(500, x0.numel(), generator=gen) < 0.5, lb, ub)])
    ys = torch.tensor(np.concatenate([sess.run(None, {sess.get_inputs()[0].name: c})[0] for c in
                                      pts.reshape(-1, 3, 32, 32).float().numpy().reshape(10, 100, 3, 32, 32)]),
                      dtype=torch.float64)
    assert float((ys - lo).min()) >= -ORT_TOL, float((ys - lo).min())
    assert float((hi - ys).min()) >= -ORT_TOL, float((hi - ys).min())
