"""The λ-HardSwish family x·hardsigmoid(λx), hardsigmoid(y) = clip(y/6 + 1/2, 0, 1): its constants against closed
forms and dense float64 sampling, the layer's gradients against finite differences, its conversion from torch's and
timm's HardSwish (squeeze-excite Hardsigmoids kept), the float32 certificate across its kinks (its remainder rule on
dense samples), and its ONNX export read back by the verifier (bounds that hold at onnxruntime's outputs), as a user's
own x·hardsigmoid(λx) module's is.

Closed forms, with u = λx and both tails (1/2 − u/6)₊: a = ∫|H − g(λx)| dx·λ = 2∫₀³(1/2 − u/6) du = 3/2;
b = ∫|ReLU − f|·λ² = 2∫₀³u(1/2 − u/6) du = 3/2; c = sup|ReLU − f|·λ = max u(1/2 − u/6) = 3/8 at u = 3/2; min f·λ = −3/8
at u = −3/2; sup|f'| = 3/2 (as u → 3⁻, not attained), inf f' = −1/2 (as u → −3⁺)."""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pipeline import Hardener, gates, swap_report, to_gates, to_relu
from pipeline.activations import ACTIVATIONS, GateContext, LambdaHardSwish, lambda_from_s
from pipeline.config import GateConfig

NAME = "hardsigmoid"
A, B, C, MIN_U, LIP, MIN_SLOPE = 1.5, 1.5, 0.375, -1.5, 1.5, -0.5
SAMPLE_STEP = 1e-5  # dense float64 grid in u = λx
QUAD_RTOL = 1e-6  # a Riemann sum on that grid against the closed forms (the integrands are piecewise quadratic)
SUP_RTOL = 1e-9  # the grid's largest gap against c (the grid holds u = 3/2 to float64 rounding)
FD_ATOL = 1e-6  # central differences (h = 1e-6) in float64 against autograd, away from the kinks u = ±3
SOUND_TOL = 1e-5  # onnxruntime's float32 outputs against CROWN's float64 bound


def _f(x: np.ndarray, lam: float) -> np.ndarray:
    return x * np.clip(lam * x / 6 + 0.5, 0.0, 1.0)  # numpy's, independent of the module under test


@settings(max_examples=10, deadline=None)
@given(lam=st.floats(0.5, 500.0))
def test_constants_are_the_closed_forms_and_hold_on_dense_samples(lam):
    b = gates.gate_bounds(NAME)
    assert (b.gate_l1, b.act_l1) == (A, B)
    assert C <= b.sup <= C * (1 + 2 * gates.PEAK_NUDGE)
    u = np.arange(-6.0, 6.0 + SAMPLE_STEP / 2, SAMPLE_STEP)
    x = u / lam
    dx = SAMPLE_STEP / lam
    gate = np.clip(lam * x / 6 + 0.5, 0.0, 1.0)
    f = _f(x, lam)
    relu = np.maximum(x, 0.0)
    assert np.sum(np.abs((x > 0) - gate)) * dx == pytest.approx(A / lam, rel=QUAD_RTOL)
    assert np.sum(np.abs(relu - f)) * dx == pytest.approx(B / lam**2, rel=QUAD_RTOL)
    gap = np.abs(relu - f).max()
    assert gap <= b.sup / lam and gap == pytest.approx(C / lam, rel=SUP_RTOL)
    assert f.min() == pytest.approx(-C / lam, rel=SUP_RTOL) and x[f.argmin()] == pytest.approx(MIN_U / lam, rel=1e-6)
    slope = np.diff(f) / np.diff(x)
    assert slope.max() <= LIP and slope.min() >= MIN_SLOPE
    assert slope.max() == pytest.approx(LIP, abs=1e-4) and slope.min() == pytest.approx(MIN_SLOPE, abs=1e-4)


def test_symbolic_derivations_are_the_closed_forms():
    import sympy as sp

    from analysis.theory import symbolic as S

    out = S.gate_summary(NAME)
    assert sp.simplify(S.gate_l1_bound(NAME) - sp.Rational(3, 2) / S.LAM) == 0
    assert sp.simplify(S.act_l1_bound(NAME) - sp.Rational(3, 2) / S.LAM**2) == 0
    assert (out["sup"]["c"], out["sup"]["u"]) == (C, 1.5)
    assert (out["minimum"]["u"], out["minimum"]["value_times_lambda"]) == (MIN_U, -C)
    assert (out["lipschitz"]["expr"], out["lipschitz"]["u_star"], out["lipschitz"]["min_slope"]) == ("3/2", 3.0, MIN_SLOPE)
    assert out["lambda_target"]["gate_l1"] == pytest.approx(A / 5e-3, rel=1e-12)
    # the family's declared kinks are its piecewise gate's breakpoints
    assert sorted({float(p) for p, _ in S._edges(S._gate(NAME).sym(S.U), S.U)}) == sorted(gates.family(NAME).kinks)


def _layer(lam: float | None = None, channels: int = 0) -> LambdaHardSwish:
    """One λ (channels = 0) or one per channel."""
    cfg = GateConfig(granularity="channel") if channels else GateConfig()
    g = ACTIVATIONS["lambda_hardswish"].build(GateContext(channels or 1, 0, 1, cfg, {}))
    if lam is not None:
        g.freeze(torch.tensor([lam]))
    return g.double()


def test_the_layer_is_x_hardsigmoid_lambda_x_with_lambda_from_s():
    g = _layer()
    lam = float(lambda_from_s(g.s.detach(), g.temperature))
    x = torch.linspace(-8, 8, 4001, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(g(x), torch.from_numpy(_f(x.numpy(), lam)))
        assert torch.allclose(_layer(1.0)(x), nn.functional.hardswish(x), rtol=0, atol=1e-15)  # nn.Hardswish at λ = 1


def test_gradients_match_finite_differences_away_from_the_kinks():
    g = _layer()
    x = torch.linspace(-5, 5, 401, dtype=torch.float64)
    lam = float(lambda_from_s(g.s.detach(), g.temperature))
    x = x[((lam * x).abs() - 3).abs() > 1e-3]  # f is not differentiable at u = ±3
    x.requires_grad_(True)
    y = g(x)
    dx, ds = torch.autograd.grad(y.sum(), [x, g.s])
    h = 1e-6
    with torch.no_grad():
        fd_x = (g(x + h) - g(x - h)) / (2 * h)
        g.s += h
        up = g(x).sum()
        g.s -= 2 * h
        down = g(x).sum()
        g.s += h
    assert torch.allclose(dx, fd_x, rtol=0, atol=FD_ATOL)
    assert float(ds) == pytest.approx(float((up - down) / (2 * h)), abs=FD_ATOL * len(x))


class SqueezeExcite(nn.Module):
    """MobileNetV3's squeeze-excite: a Hardsigmoid gate that scales the features, not an activation."""

    def __init__(self, c: int):
        super().__init__()
        self.fc, self.gate = nn.Linear(c, c), nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc(x))


def _tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Hardswish(), SqueezeExcite(16), nn.Linear(16, 16), nn.Hardswish(),
                         nn.Linear(16, 3))


def _data(n: int = 256):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()


def test_to_gates_converts_hardswish_keeps_the_se_hardsigmoid_and_the_swap_leaves_no_hardswish():
    model, report = to_gates(_tiny())
    assert [(s.fqn, s.source, s.target) for s in report.converted] == [("1", "nn.Hardswish", "lambda_hardswish"),
                                                                        ("4", "nn.Hardswish", "lambda_hardswish")]
    assert [s.fqn for s in report.not_gates] == ["2.gate"] and not report.left
    x, y = _data()
    hardener = Hardener(model, epochs=4)
    opt = torch.optim.Adam(hardener.param_groups(lr=1e-2, weight_decay=0.0), lr=1e-2)
    for epoch in range(1, 5):
        hardener.start_epoch(epoch)
        for i in range(0, len(x), 64):
            loss = nn.functional.cross_entropy(model(x[i:i + 64]), y[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert hardener.hardened()
    lam = gates.lambda_target(5e-3, gate=NAME)
    assert lam == pytest.approx(A / 5e-3) and all(float(m.lam) == pytest.approx(lam, rel=1e-6)
                                                  for m in model.modules() if isinstance(m, LambdaHardSwish))
    out = swap_report(model, (x, y))
    assert out["swapped"] == 2 and out["kept"] == ["1 Hardsigmoid kept: squeeze-excite gates, not activations"]
    relu = to_relu(copy.deepcopy(model), x[:2])
    kinds = [type(m) for m in relu.modules() if isinstance(m, (nn.ReLU, nn.Hardswish, nn.Hardsigmoid, LambdaHardSwish))]
    assert kinds == [nn.ReLU, nn.Hardsigmoid, nn.ReLU]
    calls = []
    with torch.no_grad(), _Watch(calls):
        relu(x)
    assert not any("hardswish" in c for c in calls), calls
    # the swap changes each unit by at most c/λ_target
    with torch.no_grad():
        a = model[1](model[0](x))
        b = relu[1](relu[0](x))
    assert float((a - b).abs().max()) <= gates.sup_constant(NAME) / lam * (1 + 1e-6)


class _Watch(torch.overrides.TorchFunctionMode):
    def __init__(self, calls: list[str]):
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_timms_own_hardswish_class_is_recognized_and_converted():
    from pipeline.extras import import_timm

    try:
        timm = import_timm()
    except ImportError as exc:
        pytest.skip(str(exc))
    act = timm.layers.activations.HardSwish()  # x·relu6(x + 3)/6, a class no registry names
    model, report = to_gates(nn.Sequential(nn.Linear(4, 8), act, nn.Linear(8, 2)))
    (site,) = report.converted
    assert site.target == "lambda_hardswish" and site.match_lambda == pytest.approx(1.0, abs=1e-6)


def test_the_curvature_envelope_bounds_f2_on_the_pieces_and_names_the_kinks():
    cv = gates.curvature(NAME)
    step = gates.CURVATURE_STEP
    assert cv.kinks == (-3.0, 3.0) and cv.slope_range >= LIP - MIN_SLOPE
    # F'' = 1/3 on |y| < 3 and 0 beyond: the envelope over |y| ≥ i·step holds 1/3 until the kink, 0 after it
    assert (cv.envelope[:int(3 / step)] >= 1 / 3).all() and (cv.envelope[int(3 / step) + 1:] == 0).all()


@pytest.mark.parametrize("lam", [1.0, 20.0, 300.0])
def test_the_float32_certificate_holds_at_and_around_the_kinks(lam):
    """Inputs placed so that many first-layer pre-activations sit exactly at or within rounding distance of u = ±3,
    where F' jumps, and at u = −3/2 (the minimum): the float32 error bound holds against float64 at every sample."""
    from analysis.theory.certificate import chain32

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), _layer(lam).float(), nn.Linear(32, 32), _layer(lam).float(),
                        nn.Linear(32, 4)).eval()
    x = torch.randn(400, 8)
    with torch.no_grad():
        u = net[0](x)
        targets = torch.tensor([3.0, -3.0, -1.5, 3.0 + 1e-6, -3.0 - 1e-6]) / lam
        net[0].bias -= u[0] - targets.repeat(7)[:32]  # sample 0's units on the kinks, the others spread around them
        x[1:200] = x[0] + 1e-4 * torch.randn(199, 8)  # near sample 0: pre-activations within a rounding of the kinks
    bound = chain32.rounding_bound(net, x)
    with torch.no_grad():
        err = (net(x).double() - copy.deepcopy(net).double()(x.double())).abs()
    assert bool((err <= bound).all()), float((err - bound).max())
    assert float(bound.detach().max()) < 1e-2  # not vacuous


def _slopes(x: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """f's one-sided slopes at x (left, right), closed form: f'(x) = g(λx) + λx·g'(λx), g' = 1/6 inside (−3, 3)."""
    y = lam * x
    g = np.clip(y / 6 + 0.5, 0.0, 1.0)
    return g + y * np.where((y > -3) & (y <= 3), 1 / 6, 0.0), g + y * np.where((y >= -3) & (y < 3), 1 / 6, 0.0)


@pytest.mark.parametrize("lam", [1.0, 20.0, 300.0])
def test_the_float32_certificates_remainder_holds_across_a_kink_on_dense_samples(lam):
    """chain32's remainder bound q̄ (what a gate adds to the error beyond the slope D·e) against the exact remainder
    |f(u + δ) − f(u) − D·δ| in float64 on a dense grid of δ ∈ [−ē, ē], D either one-sided slope, at pre-activations u on
    the kinks λu = ±3, just beside them, at the minimum and away from them, for errors ē from 1e-9 to 1e-3 of 1/λ.
    Across a kink f' jumps by 1/2, so the remainder is ~|δ|/2, far above the second-order term ½·λ·sup|F''|·ē²
    (= λē²/6) that holds on one piece: a bound that ignored the kinks fails here."""
    from analysis.theory.certificate import chain32

    cv = gates.curvature(NAME)
    u = np.array([3.0, -3.0, 3.0 + 1e-7, 3.0 - 1e-7, -3.0 + 1e-7, -1.5, 0.0, 1.0, 4.5, -5.0]) / lam
    ebar = np.array([1e-9, 1e-7, 1e-5, 1e-3]) / lam
    U, E = np.meshgrid(u, ebar, indexing="ij")
    U, E = U.reshape(1, -1), E.reshape(1, -1)
    qbar = chain32.gate_remainder(cv, torch.tensor([[lam]], dtype=torch.float64), torch.from_numpy(U),
                                  torch.from_numpy(E)).numpy()[0]
    t = np.linspace(-1.0, 1.0, 2001) * (1 - 1e-6)  # inside [−ē, ē] after u + δ's rounding
    v = U[0][:, None] + E[0][:, None] * t[None, :]  # [points, grid]
    delta = v - U[0][:, None]  # exact (Sterbenz): the δ that v is
    fu, fv = _f(U[0], lam)[:, None], _f(v, lam)
    for slope in _slopes(U[0], lam):
        rem = np.abs(fv - fu - slope[:, None] * delta)
        # float64's own rounding: of g(λx) = λx/6 + 1/2 (its two terms, times x) and of the remainder's terms (the
        # bound is attained at δ = ±ē off the kinks)
        x = np.abs(U[0][:, None]) + np.abs(v)
        noise = 8 * np.finfo(np.float64).eps * (x * (1 + lam * x / 6) + np.abs(slope[:, None] * delta) + qbar[:, None])
        assert (rem <= qbar[:, None] + noise).all(), float((rem - qbar[:, None] - noise).max())
    holds = np.abs(np.abs(lam * U[0]) - 3) <= lam * E[0]  # [u − ē, u + ē] holds a kink
    assert holds.sum() >= 8 and (qbar[holds] >= 0.5 * E[0][holds]).all()  # the jump of f' is covered ...
    off = np.abs(np.abs(lam * U[0]) - 3) > 2 * lam * E[0]  # clear of a kink (not at a rounding of its edge)
    assert (qbar[off] < 0.5 * E[0][off]).all()  # ... and only there (off a kink the remainder is O(ē²))


def _read_and_bound(path, lb: np.ndarray, ub: np.ndarray, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(onnxruntime's outputs at xs, CROWN's lower bounds of [y, −y] over the box) of an exported file, after checking
    that the verifier's read graph computes what onnxruntime does and that every output lies in the bounds."""
    from analysis.verification.bounds import Bounder, Spec
    from analysis.verification.readers import from_onnx

    graph = from_onnx(str(path))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: xs.astype(np.float32)})[0]
    ours = graph.forward(torch.tensor(xs, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(ours, ref, rtol=0, atol=SOUND_TOL * max(1.0, np.abs(ref).max()))
    b = Bounder(graph, torch.tensor(lb), torch.tensor(ub))
    b.crown()
    k = ref.shape[1]
    eye = torch.eye(k, dtype=torch.float64)
    lower = b.spec_bounds(Spec(torch.cat([eye, -eye]), torch.zeros(2 * k))).numpy()
    vals = np.concatenate([ref, -ref], 1)
    assert (vals >= lower - SOUND_TOL).all(), (vals - lower).min()
    assert np.isfinite(lower).all()
    return ref, lower


def test_the_export_is_hardswish_and_the_verifier_bounds_hold_at_onnxruntime_outputs(tmp_path):
    from analysis import api

    torch.manual_seed(2)
    layer = _layer(channels=16)
    with torch.no_grad():
        layer.s.copy_(torch.linspace(-0.3, 0.5, 16, dtype=torch.float64))  # a λ per channel
    net = nn.Sequential(nn.Linear(4, 16), layer.float(), nn.Linear(16, 3)).eval()
    x = torch.randn(64, 4)
    out = api.export_onnx(net, x[:2], tmp_path / "hs.onnx", check_inputs=x)
    assert out["ops"].get("HardSwish") == 1 and "HardSigmoid" not in out["ops"], out["ops"]
    rng = np.random.default_rng(0)
    center = rng.uniform(-1, 1, 4)
    xs = (center - 0.8 + 1.6 * rng.uniform(size=(2000, 4))).astype(np.float32)
    ref, lower = _read_and_bound(tmp_path / "hs.onnx", center - 0.8, center + 0.8, xs)
    assert (np.concatenate([ref, -ref], 1).min(0) - lower).max() < 50  # not vacuous


class _OwnHardSwish(nn.Module):
    """A user's own λ-HardSwish written with torch's hardsigmoid, not the registry's layer: it exports as
    Mul → HardSigmoid → Mul, which the verifier reads as a clamp and a product of two variables."""

    def __init__(self, lam: float):
        super().__init__()
        self.lam = lam

    def forward(self, x):
        return x * torch.nn.functional.hardsigmoid(self.lam * x)


@pytest.mark.parametrize("lam", [1.0, 8.0])
def test_a_users_own_x_hardsigmoid_export_reads_and_its_bounds_hold_at_onnxruntime_outputs(lam, tmp_path):
    from analysis import api

    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(4, 16), _OwnHardSwish(lam), nn.Linear(16, 3)).eval()
    x = torch.randn(64, 4)
    out = api.export_onnx(net, x[:2], tmp_path / "own.onnx", check_inputs=x)
    assert out["ops"].get("HardSigmoid") == 1 and "HardSwish" not in out["ops"], out["ops"]
    rng = np.random.default_rng(1)
    center = rng.uniform(-1, 1, 4)
    lb, ub = center - 0.5, center + 0.5
    xs = np.concatenate([rng.uniform(lb, ub, (2000, 4)), np.where(rng.random((500, 4)) < 0.5, lb, ub)])
    ref, lower = _read_and_bound(tmp_path / "own.onnx", lb, ub, xs)
    width = -lower[3:] - lower[:3]
    assert (width < 20 * (ref.max(0) - ref.min(0))).all(), width  # not vacuous
