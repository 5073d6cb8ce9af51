"""Branch and bound on the input box (`analysis.verification.input_bab`) against a dense-grid reference on a 2-input ReLU
network: unsat where no grid point is unsafe and the grid's smallest margin is far above its Lipschitz error (3×), sat
where a grid point is unsafe, with a witness strictly unsafe in onnxruntime; and the branch-and-bound link hands a
network of few inputs to it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from analysis.verification import input_bab
from analysis.verification.problem import Budget, Problem
from analysis.verification.registry import get_verifier
from analysis.verification.vnnlib import robustness_spec, write_vnnlib

GRID = 401  # points per axis of the reference grid
X0 = np.array([0.3, -0.2])
EPS = np.geomspace(0.005, 2.0, 200)  # the radii the reference scans (3% apart: the unsat one lies near the boundary)
BUDGET_S = 20.0


def _net(path) -> nn.Module:
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(2, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 2))
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.Linear):
                m.weight.mul_(3)
        y = net(torch.tensor(X0, dtype=torch.float32)[None])[0]
        net[-1].bias[int(y.argmax())] -= float(y.max() - y.min()) - 0.3  # the margin at X0 0.3: a boundary nearby
    torch.onnx.export(net, torch.zeros(1, 2), str(path), opset_version=17, dynamo=False)
    return net.double()


def _radius(net: nn.Module, label: int, expect: str) -> float:
    """unsat: the largest radius whose grid margin exceeds 3× the grid's Lipschitz error; grid-safe: the largest with no
    unsafe grid point; sat: the smallest with an unsafe grid point."""
    L = 2.0
    for m in net:
        if isinstance(m, nn.Linear):
            L *= float(m.weight.detach().abs().sum(1).max())
    g = torch.linspace(-1, 1, GRID, dtype=torch.float64)
    out = []
    for e in EPS:
        xs = torch.stack(torch.meshgrid(X0[0] + e * g, X0[1] + e * g, indexing="ij"), -1).reshape(-1, 2)
        with torch.no_grad():
            y = net(xs)
        out.append((float(e), float((y[:, label] - y[:, 1 - label]).min()), L * float(e) * 2 / (GRID - 1)))
    if expect == "unsat":
        return [e for e, m, err in out if m > 3 * err][-1]
    if expect == "grid-safe":
        return [e for e, m, _ in out if m > 0][-1]
    return [e for e, m, _ in out if m < 0][0]


@pytest.mark.parametrize("expect", ["unsat", "sat"])
def test_input_branch_and_bound_agrees_with_a_dense_grid(tmp_path, expect):
    net = _net(tmp_path / "n.onnx")
    with torch.no_grad():
        label = int(net(torch.tensor(X0)[None]).argmax())
    eps = _radius(net, label, expect)
    write_vnnlib(tmp_path / "p.vnnlib", robustness_spec(X0, eps, -10, 10, label, 2))
    problem = Problem.from_files(tmp_path / "n.onnx", tmp_path / "p.vnnlib")
    spec = problem.specs[0]
    budget = Budget(BUDGET_S, "wall")
    status, x, msg, stats = input_bab.search(problem.network, spec, list(range(len(spec.disjuncts))), budget.expired,
                                             lambda x: problem.confirm(0, x, budget.expired)[0])
    assert status == expect, msg
    if expect == "unsat":
        assert stats["boxes"] >= 1
    else:
        x32 = np.asarray(x, dtype=np.float32).reshape(1, 2)
        assert np.all(np.abs(x32 - X0) <= eps + 1e-7)
        sess = ort.InferenceSession(str(tmp_path / "n.onnx"))
        y = sess.run(None, {sess.get_inputs()[0].name: x32})[0][0]
        assert y[1 - label] > y[label]  # strictly unsafe in onnxruntime


def test_input_branch_and_bound_splits_near_the_boundary_and_agrees_with_the_milp(tmp_path):
    # the largest radius with no unsafe grid point: CROWN on the whole box does not decide it, so the search splits;
    # the reference there is the MILP (complete for ReLU networks, another method than the one tested)
    net = _net(tmp_path / "n.onnx")
    with torch.no_grad():
        label = int(net(torch.tensor(X0)[None]).argmax())
    eps = _radius(net, label, "grid-safe")
    write_vnnlib(tmp_path / "p.vnnlib", robustness_spec(X0, eps, -10, 10, label, 2))
    reference = get_verifier("milp").run(Problem.from_files(tmp_path / "n.onnx", tmp_path / "p.vnnlib"), Budget(60, "wall"))
    assert reference.status in ("sat", "unsat"), reference.message
    problem = Problem.from_files(tmp_path / "n.onnx", tmp_path / "p.vnnlib")
    budget = Budget(BUDGET_S, "wall")
    status, _, msg, stats = input_bab.search(problem.network, problem.specs[0], [0], budget.expired,
                                             lambda x: problem.confirm(0, x, budget.expired)[0])
    assert status == reference.status, msg
    assert stats["boxes"] > 1  # it split


def test_the_branch_and_bound_link_tries_the_input_search_on_few_inputs(tmp_path, monkeypatch):
    # the ReLU search gets no time of its own (share 0), so the answer near the boundary comes from the input search
    import analysis.verification.complete_verifiers as cv

    monkeypatch.setattr(cv, "RELU_FIRST_SHARE", 0.0)
    net = _net(tmp_path / "n.onnx")
    with torch.no_grad():
        label = int(net(torch.tensor(X0)[None]).argmax())
    write_vnnlib(tmp_path / "p.vnnlib", robustness_spec(X0, _radius(net, label, "grid-safe"), -10, 10, label, 2))
    problem = Problem.from_files(tmp_path / "n.onnx", tmp_path / "p.vnnlib")
    result = get_verifier("bab").run(problem, Budget(BUDGET_S, "wall"))
    assert result.status in ("sat", "unsat") and "input branch and bound" in result.message, result.message
    assert problem.info["input_boxes"] > 1
