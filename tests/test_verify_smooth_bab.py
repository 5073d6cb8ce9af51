"""Branch and bound on smooth activations' input intervals (`analysis.verification.smooth_bab`) against a dense-grid
reference on 2-input sigmoid and tanh networks: unsat where no grid point is unsafe and the grid's smallest margin is
far above its Lipschitz error (3×), sat where a grid point is unsafe, with a witness strictly unsafe in onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from analysis.verification.problem import Budget, Problem
from analysis.verification.registry import get_verifier
from analysis.verification.vnnlib import robustness_spec, write_vnnlib

GRID = 2001  # points per axis of the reference grid
COARSE = 201  # the fast suite's grid: its Lipschitz error is 10× GRID's, so its unsat radius is smaller
X0 = np.array([0.3, -0.2])
BUDGET_S = 20.0


ACTS = {"sigmoid": (nn.Sigmoid, 0.25), "tanh": (nn.Tanh, 1.0)}  # the activation and the largest slope it has


def _net(path: Path, act: str = "sigmoid") -> nn.Module:
    torch.manual_seed(0)
    f = ACTS[act][0]
    net = nn.Sequential(nn.Linear(2, 16), f(), nn.Linear(16, 16), f(), nn.Linear(16, 2))
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.Linear):
                m.weight.mul_(3)
        # the decision boundary near X0: its margin there 0.3, so small radii are safe and larger ones are not
        y = net(torch.tensor(X0, dtype=torch.float32)[None])[0]
        net[-1].bias[int(y.argmax())] -= float(y.max() - y.min()) - 0.3
    torch.onnx.export(net, torch.zeros(1, 2), str(path), opset_version=17, dynamo=False)
    return net.double()


def _lipschitz(net: nn.Module) -> float:
    """An upper bound on the margin's Lipschitz constant in ∞-norm: ‖W‖∞ products, σ' ≤ 1/4 and tanh' ≤ 1, the margin's
    row 2·max."""
    L = 1.0
    for m in net:
        if isinstance(m, nn.Linear):
            L *= float(m.weight.detach().abs().sum(1).max())
        else:
            L *= next(slope for f, slope in ACTS.values() if isinstance(m, f))
    return 2 * L


def _grid_margin(net: nn.Module, eps: float, label: int, grid: int = GRID) -> float:
    g = torch.linspace(-1, 1, grid, dtype=torch.float64)
    xs = torch.stack(torch.meshgrid(X0[0] + eps * g, X0[1] + eps * g, indexing="ij"), -1).reshape(-1, 2)
    with torch.no_grad():
        y = net(xs)
    return float((y[:, label] - y[:, 1 - label]).min())


EPS = np.geomspace(0.005, 2.0, 60)  # the radii the reference scans


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("expect", ["unsat", "sat"])
@pytest.mark.parametrize("grid", [pytest.param(GRID, marks=pytest.mark.slow), COARSE])
def test_smooth_net_branch_and_bound_agrees_with_a_dense_grid(tmp_path, expect, grid, act):
    """unsat: the largest radius whose grid margin exceeds 3× the grid's Lipschitz error (here the bounds before the
    search decide it); sat: the smallest radius with an unsafe grid point, found by the smooth search's minimizers."""
    net = _net(tmp_path / "n.onnx", act)
    with torch.no_grad():
        label = int(net(torch.tensor(X0)[None]).argmax())
    L = _lipschitz(net)
    margins = [(float(e), _grid_margin(net, float(e), label, grid), L * float(e) * 2 / (grid - 1)) for e in EPS]
    if expect == "unsat":
        eps = [m for m in margins if m[1] > 3 * m[2]][-1][0]
        write_vnnlib(tmp_path / "p.vnnlib", robustness_spec(X0, eps, -10, 10, label, 2))
    else:
        eps = [m for m in margins if m[1] < 0][0][0]
        write_vnnlib(tmp_path / "p.vnnlib", robustness_spec(X0, eps, -10, 10, label, 2))
    problem = Problem.from_files(tmp_path / "n.onnx", tmp_path / "p.vnnlib")
    result = get_verifier("bab").run(problem, Budget(BUDGET_S, "wall"))
    if expect == "unsat":
        assert result.status == "unsat", result.message
    else:
        assert result.status == "sat", result.message
        x = np.asarray(result.counterexample, dtype=np.float32).reshape(1, 2)
        assert np.all(np.abs(x - X0) <= eps + 1e-7)
        sess = ort.InferenceSession(str(tmp_path / "n.onnx"))
        y = sess.run(None, {sess.get_inputs()[0].name: x})[0][0]
        assert y[1 - label] > y[label]  # strictly unsafe in onnxruntime
