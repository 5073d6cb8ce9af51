"""Nothing called ReLU that is not: a swap with nothing to swap says so (`swapped: 0`) or refuses, and what the swap
keeps is listed with its reason. Each case returned a "ReLU" model or a bare agreement of 1.0 with no word on 7f02dce."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from _digits import digits, make_run
from analysis import api
from pipeline import swap_report, to_relu
from pipeline.config import GateConfig, ModelConfig
from pipeline.models import build_model, make_spec
from pipeline.relu_swap import SwapError
from pipeline.stages.swap import report_section, run_swap


class SqueezeExcite(nn.Module):
    """timm's squeeze-excite: a bounded gate that scales the features, not an activation."""

    def __init__(self, c: int):
        super().__init__()
        self.fc, self.gate = nn.Linear(c, c), nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc(x))


def _data(n: int = 32, d: int = 6, k: int = 3):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, d, generator=g), torch.randint(0, k, (n,), generator=g)


def test_a_model_with_no_gate_that_is_not_relu_is_refused_by_to_relu():
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    with pytest.raises(SwapError, match=r"nothing to swap.*2 Tanh kept: bounded, with no ReLU form") as e:
        to_relu(copy.deepcopy(net))
    assert "\n" not in str(e.value) and "to_gates(model)" in str(e.value)
    assert to_relu(net, allow_unchanged=True) is net  # asked for: taken as it is


@pytest.mark.parametrize("report", [swap_report, api.swap], ids=["swap_report", "api.swap"])
def test_nothing_to_swap_is_said_in_the_result(report):
    x, y = _data()
    out = report(nn.Sequential(nn.Linear(6, 8), nn.ELU(), nn.Linear(8, 3)), (x, y))
    assert out["swapped"] == 0 and out["note"].startswith("nothing to swap")
    assert out["kept"] == ["1 ELU kept: computes no gate x·g(λx), so it has no ReLU form"]
    relu = report(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), (x, y))
    assert relu["swapped"] == 0 and relu["kept"] == [] and "ReLU already" in relu["note"]


def test_squeeze_excite_gates_are_kept_with_their_reason():
    x, y = _data()
    net = nn.Sequential(nn.Linear(6, 8), nn.GELU(), SqueezeExcite(8), nn.Linear(8, 8), nn.SiLU(), SqueezeExcite(8),
                        nn.Linear(8, 3))
    out = swap_report(net, (x, y))
    assert out["swapped"] == 2 and "note" not in out
    assert out["kept"] == ["2 Sigmoid kept: squeeze-excite gates, not activations"]
    relu = to_relu(copy.deepcopy(net))
    assert [type(m) for m in relu.modules() if isinstance(m, (nn.ReLU, nn.Sigmoid))] == [nn.ReLU, nn.Sigmoid, nn.ReLU,
                                                                                          nn.Sigmoid]
    free = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3), nn.Sigmoid())  # a sigmoid head: no SE owner
    assert swap_report(free, (x, y))["kept"] == ["1 Sigmoid kept: bounded, with no ReLU form (x·g(λx) → ReLU is what "
                                                 "the swap replaces)"]


def test_the_swap_stage_records_what_it_swapped_and_kept(tmp_path):
    """swap.json carries `swapped` and `kept` per variant, and the report's swap section shows them: a tanh variant
    (nothing swapped, its Tanh kept) beside a GELU one (its gate layer swapped)."""
    nets = {}
    for act in ("tanh", "gelu"):
        spec = make_spec(ModelConfig(name="mlp", hidden=[8]), act, GateConfig(), digits().info)
        nets[act] = (build_model(spec).eval(), spec)
    run = make_run(tmp_path, nets)
    run_swap(run.cfg, run)
    saved = json.loads(run.file("swap", "swap.json").read_text())
    assert saved["gelu"]["swapped"] == 1 and saved["gelu"]["kept"] == []
    assert saved["tanh"]["swapped"] == 0 and len(saved["tanh"]["kept"]) == 1 and "1 Tanh kept" in saved["tanh"]["kept"][0]
    section = report_section(run.cfg, run)
    assert "gates swapped" in section and f"- tanh: {saved['tanh']['kept'][0]}" in section
