"""The other seed systems: SERF, λ-Swish / λ-SERF, linked neurons, width matching, the pre-activation
ResNet, dead-unit counts, and the bounds of every gate (σ, SERF, Mish) with λ_target keyed by gate."""

from __future__ import annotations

import math
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from torch import nn

from analysis.theory import symbolic as S
from analysis.studies import PAPER_TABLE1, ZOO, zoo_markdown
from pipeline.activations import (
    activation_sites,
    ACTIVATIONS, RELU_FORMS, GateContext, LambdaSwish, Linked, hardenable_gates, lambda_serf, lambda_swish, serf,
    swapped_activation,
)
from pipeline.config import GateConfig, ModelConfig
from pipeline.data import DataInfo, Split
from pipeline.gates import CRITERIA, GATES, PEAK_NUDGE, gate_bounds, lambda_target, tail_peaks
from pipeline.models import build_model, make_spec, parameter_count
from pipeline.relu_swap import relu_spec, to_relu, unfold_linked_relu

# Tolerances
SERF64_RTOL, SERF64_ATOL = 1e-13, 1e-300  # float64 SERF vs 50-digit mpmath
SERF32_RTOL, SERF32_ATOL = 2e-6, 1e-30  # float32 SERF vs the same reference
# SERF' = erf(s) + x·erf'(s)·σ(x) is a sum of O(1) terms that cancel at its root x ≈ −1.19: an absolute
# floor of a few ulps of 1 on top of the relative tolerance
GRAD64_RTOL, GRAD64_ATOL = 1e-12, 1e-15
GRAD32_RTOL, GRAD32_ATOL = 1e-5, 1e-6
GRADCHECK_EPS, GRADCHECK_ATOL = 1e-6, 1e-7
SUP_TOL = 1e-12  # sampled sup |ReLU − f_λ| may exceed c/λ by float64 rounding only
TIGHT_REL = 1e-6  # a dense grid around the argmax gets within this fraction of c/λ
RIEMANN_REL = 1e-4  # 2e5-point midpoint sums vs the bounds
NUMERIC_REL = 1e-10  # gates.py's scipy constants (SERF, Mish) vs analysis' 45-digit mpmath
EXACT_REL = 1e-14  # gates.py's closed forms (Φ, σ) vs sympy's
UNFOLD_ATOL = 1e-13  # float64 logits, CReLU net vs its [W; −W] unfolding
N_SAMPLES = 200_000
LAMBDAS = (1.0, 2.0, 10.0, 160.0)


def _info(shape=(1, 8, 8)) -> DataInfo:
    return DataInfo("toy", shape, 3, [0.5], [0.25], 0.0, 1.0)


# ---------------------------------------------------------------------------------------------
# SERF: values and gradients against mpmath, finite at |x| = 1e4


def _serf_mp(x: float) -> tuple[float, float]:
    """(SERF(x), SERF'(x)) at 50 digits: x·erf(sp(x)) and erf(sp) + x·(2/√π)·e^{−sp²}·σ(x)."""
    with mpmath.workdps(50):
        x = mpmath.mpf(x)
        s = mpmath.log1p(mpmath.exp(x))
        val = x * mpmath.erf(s)
        der = mpmath.erf(s) + x * 2 / mpmath.sqrt(mpmath.pi) * mpmath.exp(-s * s) / (1 + mpmath.exp(-x))
        return float(val), float(der)


SERF_POINTS = [-1e4, -745.0, -100.0, -30.0, -8.0, -1.193, -1.0, -0.3, -1e-8, 0.0, 1e-8, 0.25, 1.0, 2.0, 5.5, 19.9, 20.1,
               40.0, 100.0, 1e4]


@pytest.mark.parametrize("dtype,rtol,atol,grtol,gatol", [
    (torch.float64, SERF64_RTOL, SERF64_ATOL, GRAD64_RTOL, GRAD64_ATOL),
    (torch.float32, SERF32_RTOL, SERF32_ATOL, GRAD32_RTOL, GRAD32_ATOL),
])
def test_serf_matches_mpmath_values_and_gradients(dtype, rtol, atol, grtol, gatol):
    x = torch.tensor(SERF_POINTS, dtype=dtype, requires_grad=True)
    y = serf(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    ref = torch.tensor([_serf_mp(float(v)) for v in x.detach()], dtype=torch.float64)
    assert torch.isfinite(y).all() and torch.isfinite(g).all()
    err_v = (y.detach().double() - ref[:, 0]).abs()
    err_g = (g.double() - ref[:, 1]).abs()
    assert (err_v <= atol + rtol * ref[:, 0].abs()).all(), f"value: max {err_v.max():.3g}, mean {err_v.mean():.3g}"
    assert (err_g <= gatol + grtol * ref[:, 1].abs()).all(), f"grad: max {err_g.max():.3g}, mean {err_g.mean():.3g}"
    assert float(y.detach()[0]) == pytest.approx(0.0, abs=1e-30) and float(y.detach()[-1]) == 1e4  # ReLU-like at ±1e4


def test_serf_minimum_is_the_papers_bound():
    x = torch.linspace(-3, 0, 300_001, dtype=torch.float64)
    assert float(serf(x).min()) == pytest.approx(-0.3484, abs=5e-5)  # "approximately 0.3484" (SERF paper)


def test_lambda_serf_grads_finite_at_large_inputs_and_gradcheck():
    for dtype in (torch.float32, torch.float64):
        x = torch.tensor([-1e4, -50.0, -1.0, 0.0, 1.0, 50.0, 1e4], dtype=dtype, requires_grad=True)
        lam = torch.tensor(160.0, dtype=dtype, requires_grad=True)
        gx, gl = torch.autograd.grad(lambda_serf(x, lam).sum(), (x, lam))
        assert torch.isfinite(gx).all() and torch.isfinite(gl).all()
    x = torch.randn(40, dtype=torch.float64, requires_grad=True)
    lam = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda_serf, (x, lam), eps=GRADCHECK_EPS, atol=GRADCHECK_ATOL)


# ---------------------------------------------------------------------------------------------
# λ-Swish


def test_lambda_swish_gradcheck_and_identity():
    x = torch.randn(64, dtype=torch.float64, requires_grad=True) * 3
    lam = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda_swish, (x.detach().requires_grad_(), lam), eps=GRADCHECK_EPS, atol=GRADCHECK_ATOL)
    torch.testing.assert_close(lambda_swish(x, lam), F.silu(lam * x) / lam, rtol=1e-14, atol=1e-15)
    # ∂f/∂λ = x²σ'(λx) without the cancellation of the SiLU(λx)/λ form: exact where λx ≫ 1
    big = torch.tensor([30.0, 60.0], dtype=torch.float64)
    lam = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    (gl,) = torch.autograd.grad(lambda_swish(big, lam).sum(), lam)
    s = torch.sigmoid(big)
    assert float(gl) == pytest.approx(float((big**2 * s * (1 - s)).sum()), rel=1e-12)


def test_lambda_swish_module_learns_s_and_freezes():
    ctx = GateContext(4, 0, 1, GateConfig(granularity="channel"), {})
    gate = ACTIVATIONS["lambda_swish"].build(ctx).double()
    assert isinstance(gate, LambdaSwish) and gate.GATE == "sigmoid" and ACTIVATIONS["lambda_swish"].gate == "sigmoid"
    assert torch.autograd.gradcheck(lambda s: _with_s(gate, s), (gate.s.detach().clone().requires_grad_(),),
                                    eps=GRADCHECK_EPS, atol=GRADCHECK_ATOL)
    gate.freeze(torch.tensor(50.0))
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(gate(x), x * torch.sigmoid(50 * x))


def _with_s(gate: LambdaSwish, s: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(5, 4, dtype=torch.float64)
    lam = 1 + F.softplus(s / gate.temperature)
    return lambda_swish(x, lam.view(1, -1))


# ---------------------------------------------------------------------------------------------
# Linked neurons and the swap


def test_linked_pair_widths_forward_and_crelu_swap():
    spec = make_spec(ModelConfig(name="mlp", hidden=[7, 5]), "linked_lambda_gelu", GateConfig(), _info())
    net = build_model(spec).double()
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 7), (14, 5), (10, 3)]
    x = torch.rand(6, 1, 8, 8, dtype=torch.float64)
    z = net.fc0(net.flatten(net.norm(x)))
    torch.testing.assert_close(net.act0(z), torch.cat([net.act0.inner(z), net.act0.inner(-z)], dim=1), rtol=0, atol=0)
    swapped = to_relu(net)
    assert all(isinstance(m.inner, nn.ReLU) for m in swapped.modules() if isinstance(m, Linked))
    torch.testing.assert_close(swapped.act0(z), torch.cat([F.relu(z), F.relu(-z)], dim=1), rtol=0, atol=0)  # CReLU
    # the swapped spec rebuilds it: linked_relu, same widths, same weights
    rs = relu_spec(spec, swapped_activation("linked_lambda_gelu"))
    assert rs["activation"] == "linked_relu" and swapped_activation("linked_gelu") == "linked_relu"
    rebuilt = build_model(rs).double()
    rebuilt.load_state_dict(swapped.state_dict())
    torch.testing.assert_close(rebuilt(x), swapped(x), rtol=0, atol=0)
    assert Linked(nn.Tanh()).to_relu().inner.__class__ is nn.Tanh  # not a gate: no swap


def test_unfold_linked_relu_is_exact():
    torch.manual_seed(0)
    for model, shape in (("mlp", (1, 8, 8)), ("cnn", (1, 8, 8))):
        mcfg = ModelConfig(name=model, hidden=[6, 5], channels=[3, 4], cnn_hidden=5)
        net = build_model(make_spec(mcfg, "linked_relu", GateConfig(), _info(shape))).eval().double()
        flat = unfold_linked_relu(net)
        assert not any(isinstance(m, Linked) for m in flat.modules())
        x = torch.rand(9, *shape, dtype=torch.float64)
        with torch.no_grad():  # equal in exact arithmetic; a wider GEMM may sum in another order
            torch.testing.assert_close(flat(x), net(x), rtol=0, atol=UNFOLD_ATOL)


def test_registry_swap_targets():
    for name, spec in ACTIVATIONS.items():
        target = swapped_activation(name)
        assert target is None or target in RELU_FORMS, name
        assert (target == "linked_relu") == (name.startswith("linked_") and target is not None), name
    assert swapped_activation("tanh") is None
    assert {ACTIVATIONS[n].gate for n in ("lambda_gelu", "lambda_swish", "lambda_serf")} == {"phi", "sigmoid", "serf"}


def test_linked_shares_per_channel_parameters():
    ctx = GateContext(3, 0, 1, GateConfig(granularity="channel"), {})
    pair = ACTIVATIONS["linked_lambda_serf"].build(ctx)
    assert len(hardenable_gates(pair)) == 1 and pair.inner.s.shape == (3,)
    prelu = ACTIVATIONS["linked_prelu"].build(ctx)
    assert sum(p.numel() for p in prelu.parameters()) == 3  # one slope per unit, shared by the pair
    assert pair(torch.randn(2, 3, 4, 4)).shape == (2, 6, 4, 4)


# ---------------------------------------------------------------------------------------------
# Width matching and the pre-activation ResNet


def test_width_match_options():
    info = _info((1, 28, 28))
    widths = lambda act, wm: [m.out_features for m in build_model(make_spec(ModelConfig(hidden=[256, 256], width_match=wm),  # noqa: E731
                                                                              act, GateConfig(), info)).modules()
                              if isinstance(m, nn.Linear)][:-1]
    assert widths("relu", "sqrt2") == [362, 362] and widths("linked_relu", "inv_sqrt2") == [181, 181]
    count = lambda act, wm: sum(p.numel() for p in build_model(make_spec(ModelConfig(hidden=[256, 256], width_match=wm),  # noqa: E731
                                                                         act, GateConfig(), info)).parameters())
    # params: each matches its counterpart at the given widths to within one unit's weights
    one_unit = 784 + 2 * 256 * 2 + 10
    assert abs(count("linked_relu", "params") - count("relu", "none")) <= one_unit
    assert abs(count("relu", "params") - count("linked_relu", "none")) <= one_unit
    assert parameter_count(ModelConfig(hidden=[256, 256]), (1, 28, 28), 3, 1) == count("relu", "none")


def test_preact_resnet_layout_and_linked_widths():
    info = _info((1, 28, 28))
    for act in ("relu", "linked_lambda_swish"):
        net = build_model(make_spec(ModelConfig(name="preact_resnet", channels=[4, 8, 8]), act, GateConfig(), info))
        convs3 = [m for m in net.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
        heads = [m for m in net.modules() if isinstance(m, nn.Linear)]
        assert len(convs3) + len(heads) == 14  # stem + 6 blocks x 2 + head: the paper's 14 layers
        assert len(activation_sites(net)) == 13  # 2 per block + the final one
        assert net(torch.rand(2, 1, 28, 28)).shape == (2, 3)
        strides = [m.stride[0] for m in convs3]
        assert strides == [1, 1, 1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1]  # stem, then stride 2 in the 3rd and 5th block
    assert heads[0].in_features == 16  # linked: 2 x 8 channels into the head


# ---------------------------------------------------------------------------------------------
# Dead units (the linked-neurons paper's definition) against brute force


def test_dead_units_match_brute_force():
    """The sparsity stage's counts (`unit_stats`/`apoz`, dead pairs as run_sparsity counts them) against one
    sample at a time."""
    from analysis.sparsity import apoz, unit_stats

    torch.manual_seed(0)
    info = _info()
    x = torch.rand(37, 1, 8, 8)
    split = Split(x, torch.zeros(37, dtype=torch.long))
    for act in ("relu", "linked_relu"):
        net = build_model(make_spec(ModelConfig(hidden=[12, 9]), act, GateConfig(), info)).eval()
        with torch.no_grad():
            net.fc0.bias[:4] = -100.0  # dead on [0, 1] inputs: z < 0 always
            net.fc1.bias[:3] = -100.0
            net.fc1.bias[3] = 100.0  # always positive: alive in single, its mirror dead in linked
        got = {}
        for name, a in apoz(unit_stats(net, split, batch_size=10)).items():
            dead = a == 1.0
            c = len(a) // 2 if act.startswith("linked") else len(a)
            got[name] = {"outputs": len(a), "dead_outputs": int(dead.sum()),
                         "dead_units": int((dead[:c] & dead[c:]).sum()) if act.startswith("linked") else int(dead.sum())}
        brute = {}
        for name, mod in activation_sites(net):
            outs = []
            h = mod.register_forward_hook(lambda m, i, o: outs.append(o.detach().clone()))
            with torch.no_grad():
                for k in range(len(x)):  # one sample at a time
                    net(x[k:k + 1])
            h.remove()
            out = torch.cat(outs)  # [N, outputs]
            dead_out = [all(float(out[n, j]) == 0.0 for n in range(len(x))) for j in range(out.shape[1])]
            c = out.shape[1] // 2 if isinstance(mod, Linked) else out.shape[1]
            units = [dead_out[j] and dead_out[j + c] for j in range(c)] if isinstance(mod, Linked) else dead_out
            brute[name] = {"outputs": out.shape[1], "dead_outputs": sum(dead_out), "dead_units": sum(units)}
        assert got == brute, act
        if act == "relu":
            assert got["act0"]["dead_units"] >= 4 and got["act1"]["dead_units"] >= 3
        else:
            assert got["act0"]["dead_units"] == 0 and got["act0"]["dead_outputs"] >= 4  # a pair never dies here


# ---------------------------------------------------------------------------------------------
# Bounds of every gate: pipeline/gates.py (what training uses) equals analysis/theory/symbolic.py, and holds on samples


def test_tail_peaks_bound_each_side_from_above():
    """Each side's peak of u·tail(u) is at least every densely sampled value (float64) and at most a nudge above it;
    c is the larger side, and an asymmetric gate's sides differ."""
    for gate, fam in GATES.items():
        peaks = tail_peaks(gate)
        for side, tail in (("upper", fam.upper_tail), ("lower", fam.lower_tail)):
            at, value = getattr(peaks, side)
            coarse = max(x * tail(x) for x in np.linspace(0.0, 20.0, 20_001).tolist())  # no higher peak anywhere
            fine = max(x * tail(x) for x in np.linspace(at - 1e-3, at + 1e-3, 2_001).tolist())  # and none beside it
            assert max(coarse, fine) <= value <= fine * (1 + 1e-10), (gate, side)
            assert at * tail(at) * (1 + PEAK_NUDGE) == pytest.approx(value, rel=1e-15), (gate, side)
        assert gate_bounds(gate).sup == max(peaks.upper[1], peaks.lower[1])
    assert tail_peaks("serf").lower[1] > 4 * tail_peaks("serf").upper[1]  # x < 0 is where SERF is far from ReLU


def test_hardness_constants_equal_symbolic():
    for gate in GATES:
        b = gate_bounds(gate)
        rel = EXACT_REL if gate in ("phi", "sigmoid") else NUMERIC_REL
        assert b.gate_l1 == pytest.approx(float(S.gate_l1_bound(gate) * S.LAM), rel=rel), gate
        assert b.act_l1 == pytest.approx(float(S.act_l1_bound(gate) * S.LAM**2), rel=rel), gate
        c = float(S.sup_constant(gate).c)
        # c is a sound upper bound: at or above the 30-digit value, by at most its nudge (within the numeric gates' rel)
        assert c * (1 - rel) <= b.sup <= c * (1 + 2 * PEAK_NUDGE) * (1 + rel), gate
        for crit in CRITERIA:
            tol = max(rel, 2 * PEAK_NUDGE if crit == "sup" else 0)
            assert lambda_target(5e-3, crit, gate=gate) == pytest.approx(S.lambda_target(5e-3, crit, gate), rel=tol), (gate, crit)
    assert sp.simplify(S.gate_l1_bound("sigmoid") - 2 * sp.log(2) / S.LAM) == 0  # ∫|H − σ(λx)| = 2 ln2/λ
    assert lambda_target(5e-3, gate="sigmoid") == pytest.approx(2 * math.log(2) / 5e-3, rel=EXACT_REL)
    assert lambda_target(5e-3, gate="serf") == pytest.approx(215.7209, abs=1e-4)
    assert S.sup_constant("serf").side == -1 and float(S.sup_constant("serf").c) == pytest.approx(0.348437, abs=1e-6)
    with pytest.raises(ValueError, match="unknown gate"):
        lambda_target(5e-3, gate="nope")


def _gate64(gate: str):
    return S.GATES[gate].g


@pytest.mark.parametrize("gate", ["sigmoid", "serf", "mish"])
@pytest.mark.parametrize("lam", LAMBDAS)
def test_gate_bounds_hold_on_float64_samples(gate, lam):
    b = gate_bounds(gate)
    sc = S.sup_constant(gate)
    u, side = float(sc.u), sc.side
    g = _gate64(gate)
    rng = np.random.default_rng(0)
    x = torch.tensor(np.concatenate([rng.standard_normal(N_SAMPLES // 2) * 3 / lam, rng.uniform(-50 / lam, 50 / lam, N_SAMPLES // 2),
                                     [0.0, 1e300, -1e300]]), dtype=torch.float64)
    gap = (torch.relu(x) - x * g(lam * x)).abs()
    gap = torch.where(torch.isfinite(gap), gap, torch.zeros_like(gap))  # ±1e300: 0·… is exactly ReLU in the limit
    assert float(gap.max()) <= b.sup / lam + SUP_TOL  # never exceeded
    where = (side or 1) * u / lam  # and reached, on the side where the sup lives
    dense = torch.linspace(where - 1e-3 / lam, where + 1e-3 / lam, 20_001, dtype=torch.float64)
    assert float((torch.relu(dense) - dense * g(lam * dense)).abs().max()) >= b.sup / lam * (1 - TIGHT_REL)
    # both L1 bounds against midpoint sums, each from above and below
    h = 80.0 / lam / N_SAMPLES
    xm = -40.0 / lam + h * (torch.arange(N_SAMPLES, dtype=torch.float64) + 0.5)
    s_gate = float(((xm > 0).double() - g(lam * xm)).abs().sum()) * h
    s_act = float((torch.relu(xm) - xm * g(lam * xm)).abs().sum()) * h
    assert b.gate_l1 / lam * (1 - RIEMANN_REL) <= s_gate <= b.gate_l1 / lam * (1 + RIEMANN_REL)
    assert b.act_l1 / lam**2 * (1 - RIEMANN_REL) <= s_act <= b.act_l1 / lam**2 * (1 + RIEMANN_REL)


def test_numeric_gate_minimum_and_lipschitz_on_samples():
    for gate in ("serf", "mish"):
        mn, lip = S.activation_minimum(gate), S.lipschitz_constant(gate)
        x = torch.linspace(-20, 20, 400_001, dtype=torch.float64, requires_grad=True)
        f = S.smooth_activation(x, 1.0, gate)
        (df,) = torch.autograd.grad(f.sum(), x)
        f = f.detach()
        assert float(f.min()) >= float(mn.value_scaled) - 1e-15 and float(f.min()) <= float(mn.value_scaled) + 1e-9
        assert float(df.abs().max()) <= float(lip.value) + 1e-12 and float(df.max()) >= float(lip.value) - 1e-8
        assert float(mn.value_scaled) == pytest.approx(-float(S.sup_constant(gate).c), abs=1e-25)


# ---------------------------------------------------------------------------------------------
# The zoo


def test_zoo_lists_the_papers_activations_and_renders():
    assert set(PAPER_TABLE1) <= set(ZOO) and {"serf", "mish", "lambda_gelu"} <= set(ZOO) and len(ZOO) == 23
    assert all(name in ACTIVATIONS for name in ZOO)
    sweep = (Path(__file__).resolve().parent.parent / "configs" / "sweeps" / "zoo-fmnist.toml").read_text()
    assert "variants=" + ",".join(ZOO) in sweep  # the sweep file trains exactly the zoo
    rows = [{"activation": "relu", "loss": 0.5, "accuracy": 0.8, "accuracy_swapped": None, "lambda_final": None,
             "paper_cifar10": PAPER_TABLE1["relu"]},
            {"activation": "lambda_gelu", "loss": 0.4, "accuracy": 0.85, "accuracy_swapped": 0.84, "lambda_final": 159.6,
             "paper_cifar10": None}]
    md = "\n".join(zoo_markdown(rows))
    assert "| relu | <u>0.5000</u> | <u>80.00</u> | no swap | 0.4478 | 87.19 |" in md
    assert "| lambda_gelu (λ = 160) | **0.4000** | **85.00** | 84.00 | – | – |" in md