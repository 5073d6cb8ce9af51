"""Algorithm 1's schedule, λ_target, optimizer groups and the swap walker."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from pipeline.activations import GELU, Gate, LambdaGELU, hardenable_gates
from pipeline.config import Config
from pipeline.gates import gate_bounds, lambda_target
from pipeline.schedule import annealed_lambda, param_groups, switch_epoch

SUP_GAP_C = gate_bounds("phi").sup
from pipeline.models import Normalize, build_model, make_spec
from pipeline.relu_swap import replace_modules, to_relu
from pipeline.data import DataInfo

PAPER_TARGET = 159.577  # 2/(ε√(2π)) at ε = 5e-3, as stated in the paper (3 decimals)


def _info():
    return DataInfo("toy", (1, 4, 4), 3, [0.5], [0.25], 0.0, 1.0)


def test_lambda_target_from_epsilon():
    assert lambda_target(5e-3) == pytest.approx(PAPER_TARGET, abs=5e-4)
    assert lambda_target(5e-3, override=50.0) == 50.0
    assert lambda_target(5e-3, "act_l1") == pytest.approx(10.0)  # 1/(2λ²) = ε
    assert lambda_target(5e-3, "sup") == pytest.approx(SUP_GAP_C / 5e-3)
    assert SUP_GAP_C == pytest.approx(0.169971, abs=1e-6)


@given(T=st.integers(2, 400), frac=st.floats(0.0, 0.99), lam_s=st.floats(1.0, 10.0), target=st.floats(1.0, 1e3))
def test_schedule_linear_and_exact_at_T(T, frac, lam_s, target):
    e_s = switch_epoch(T, frac)
    if e_s >= T:
        return
    lam0 = torch.tensor([lam_s], dtype=torch.float64)
    assert float(annealed_lambda(lam0, T, e_s, T, target)) == target  # exactly, not approximately
    vals = [float(annealed_lambda(lam0, e, e_s, T, target)) for e in range(e_s, T + 1)]
    assert vals[0] == pytest.approx(lam_s)
    steps = [b - a for a, b in zip(vals, vals[1:])]
    assert all(math.isclose(s, (target - lam_s) / (T - e_s), rel_tol=1e-9, abs_tol=1e-9) for s in steps)


def test_switch_epoch_is_floor_quarter():
    assert [switch_epoch(T, 0.25) for T in (1, 3, 4, 7, 8, 20, 50)] == [0, 0, 1, 1, 2, 5, 12]


@pytest.mark.parametrize("granularity", ["layer", "channel", "global"])
def test_param_groups_lr_and_weight_decay(granularity):
    cfg = Config()
    cfg.gate.granularity = granularity
    model = build_model(make_spec(cfg.model, "lambda_gelu", cfg.gate, _info()))
    groups = param_groups(model, lr=0.05, weight_decay=1e-4, lr_mult=9.0)
    weights, hard = groups
    assert (weights["lr"], weights["weight_decay"]) == (0.05, 1e-4)
    assert hard["lr"] == pytest.approx(0.45) and hard["weight_decay"] == 0.0
    s_ids = {id(g.s) for g in hardenable_gates(model)}
    assert {id(p) for p in hard["params"]} == s_ids
    assert len(hard["params"]) == (1 if granularity == "global" else 4)
    assert not s_ids & {id(p) for p in weights["params"]}
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(groups, lr=0.05)
    assert [g["lr"] for g in opt.param_groups] == [0.05, pytest.approx(0.45)]


def test_walker_replaces_all_gates_and_nothing_else():
    cfg = Config()
    cfg.model.name = "cnn"
    model = build_model(make_spec(cfg.model, "lambda_gelu", cfg.gate, _info()))
    model.extra = nn.Sequential(GELU(), nn.Tanh(), nn.Sequential(LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1)))
    before = {n: type(m) for n, m in model.named_modules()}
    gates = {n for n, m in model.named_modules() if isinstance(m, Gate)}
    assert len(gates) == 4 + 2
    out = to_relu(model)
    after = {n: type(m) for n, m in out.named_modules()}
    for name, tp in before.items():
        if name in gates:
            assert after[name] is nn.ReLU, name
        elif not any(name.startswith(g + ".") for g in gates):
            assert after[name] is tp, name
    assert not any(isinstance(m, Gate) for m in out.modules())
    assert isinstance(out.norm, Normalize) and isinstance(out.extra[1], nn.Tanh)


def test_walker_can_replace_root_and_sees_fqns():
    seen = []
    root = replace_modules(nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Tanh())),
                           lambda m, fqn: seen.append(fqn) or isinstance(m, nn.Tanh), lambda m, fqn: nn.ReLU())
    assert isinstance(root[1][0], nn.ReLU) and seen == ["", "0", "1", "1.0"]
    assert isinstance(replace_modules(nn.Tanh(), lambda m, _: True, lambda m, _: nn.ReLU()), nn.ReLU)
