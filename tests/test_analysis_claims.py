"""The papers' claims table: verdicts as derived, with the wrong ones corrected."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from analysis.theory import claims as C

EXPECTED = {
    "gelu_min_value": C.CONFIRMED,
    "gelu_argmin": C.CONFIRMED,
    "gelu_tanh_min": C.CONFIRMED,
    "gelu_second_derivative": C.CONFIRMED,
    "gelu_prime_critical_points": C.CONFIRMED,
    "gelu_lipschitz": C.WRONG,
    "gelu_upper_bound": C.WRONG,
    "gelu_holder": C.WRONG,
    "gelu_limits": C.CONFIRMED,
    "gelu_negative_slope": C.CONFIRMED,
    "gelu_tanh_approx": C.APPROX,
    "serf_min": C.CONFIRMED,
    "serf_properties": C.CONFIRMED,
    "serf_derivative": C.CONFIRMED,
    "lgelu_e_inf": C.CONFIRMED,
    "lgelu_lambda_target": C.CONFIRMED,
    "lgelu_relu_limit": C.CONFIRMED,
    "lgelu_ds_chain": C.CONFIRMED,
    "lgelu_delta_lambda": C.CONFIRMED,
    "lgelu_dadlam_concentrates": C.CONFIRMED,
    "lgelu_lambda_range": C.APPROX,
    "selu_constants": C.CONFIRMED,
    "linked_param_count": C.APPROX,
    "swish_quasiconvex": C.CONFIRMED,
}


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    table = C.claims_table()
    ids = [r["id"] for r in table]
    assert len(ids) == len(set(ids))
    return {r["id"]: r for r in table}


def test_verdicts(rows):
    assert {k: r["verdict"] for k, r in rows.items()} == EXPECTED


def test_every_row_is_complete(rows):
    for r in rows.values():
        assert r["source"] in {"gelu-analysis", "serf", "lambda-gelu", "linked-neurons"}
        assert r["statement"] and r["stated"] and r["derived"], r["id"]
        if r["verdict"] == C.WRONG:
            assert r["correct"], r["id"]  # a wrong claim always comes with the right value


def test_gelu_lipschitz_row_gives_the_right_constant(rows):
    r = rows["gelu_lipschitz"]
    assert "1.128904" in r["derived"] and "1.128904" in r["correct"]
    assert "1.084438" in r["stated"]
    # The refutation in the note is real: a difference quotient near √2 beats e/√(2π).
    a, b = math.sqrt(2) - 1e-3, math.sqrt(2) + 1e-3
    q = (F.gelu(torch.tensor(b, dtype=torch.float64)) - F.gelu(torch.tensor(a, dtype=torch.float64))) / (b - a)
    assert q.item() > math.e / math.sqrt(2 * math.pi) + 0.04


def test_gelu_upper_bound_counterexample():
    x = torch.tensor([-1.0, -0.1, -10.0], dtype=torch.float64)
    assert (F.gelu(x) > x).all()  # GELU(x) ≤ x fails for x < 0
    y = torch.linspace(-30, 30, 60_001, dtype=torch.float64)
    assert (F.gelu(y) <= F.relu(y)).all()  # the corrected statement


def test_rounding_verdict():
    assert C.rounding_verdict("-0.17", -0.169971) == C.CONFIRMED
    assert C.rounding_verdict("160", 159.577) == C.CONFIRMED
    assert C.rounding_verdict("1.084", 1.128904) == C.WRONG
    assert C.rounding_verdict("1.12", 1.128904) == C.APPROX  # off by more than rounding, within 2 %
    assert C.rounding_verdict("0.3484", 0.348437) == C.CONFIRMED


def test_render_markdown(rows):
    md = C.render_markdown(list(rows.values()))
    lines = md.strip().splitlines()
    assert len(lines) == 2 + len(rows)
    assert md.count("**wrong**") == sum(v == C.WRONG for v in EXPECTED.values())
    assert all(line.count("|") - line.count("\\|") == 8 for line in lines)  # 7 columns, escaped pipes
