"""A model the project did not build: converted by `to_gates`, hardened by the `Hardener` inside a plain loop on
digits, swapped within the bound, exported and checked against onnxruntime, resumed mid-anneal; the conversion
report (what was converted, what was left and why); the README's "Use it on your own model" block, run."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _digits import digits
from analysis import api
from pipeline import GateConfig, Hardener, swap_report, to_gates, to_relu
from pipeline.activations import HardenableGate, LambdaGELU, LambdaSwish, gate_sites
from pipeline.convert import ConvertError
from pipeline.relu_swap import SwapError
from pipeline.gates import lambda_target

ROOT = Path(__file__).resolve().parent.parent
EPOCHS, SWITCH = 8, 2  # e_s = ⌊0.25·8⌋: λ learned in epochs 1-2, annealed in 3-8
# The swap of a model hardened to λ_target moves each unit by at most c/λ_target (~1e-3 here): on digits' 359
# test images at most one prediction may flip.
SWAP_ACCURACY_TOL = 1 / 359 + 1e-9
CHECK_SAMPLES = 64  # validation inputs for the per-layer check and the certificate (the certificate is the slow part)


class Block(nn.Module):
    """x + fc2(SiLU(fc1(x))): an activation inside a residual block."""

    def __init__(self, d: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class ResidualNet(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.stem, self.act = nn.Linear(64, d), nn.GELU()
        self.blocks = nn.Sequential(Block(d), Block(d))
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, 1, 8, 8] -> [N, 10]
        return self.head(self.blocks(self.act(self.stem(x.flatten(1)))))


def _fit(model: nn.Module, hardener: Hardener, opt: torch.optim.Optimizer, epochs: range) -> list[list[float]]:
    """The plain loop: the hardener sets λ, the rest is ordinary training. Data order depends on the epoch only."""
    ds = digits()
    lambdas = []
    for epoch in epochs:
        hardener.start_epoch(epoch)
        model.train()
        order = torch.randperm(len(ds.train), generator=torch.Generator().manual_seed(epoch))
        for i in order.split(64):
            opt.zero_grad()
            F.cross_entropy(model(ds.train.x[i]), ds.train.y[i]).backward()
            opt.step()
        lambdas.append(hardener.lambdas())
    return lambdas


def _start(seed: int = 0):
    torch.manual_seed(seed)
    model, report = to_gates(ResidualNet())
    hardener = Hardener(model, epochs=EPOCHS)
    opt = torch.optim.SGD(hardener.param_groups(lr=0.05, weight_decay=1e-4), lr=0.05, momentum=0.9)
    return model, report, hardener, opt


@pytest.fixture(scope="module")
def hardened():
    model, report, hardener, opt = _start()
    lambdas = _fit(model, hardener, opt, range(1, EPOCHS + 1))
    return model.eval(), report, hardener, lambdas


def test_the_residual_model_is_converted_site_by_site(hardened):
    _, report, _, _ = hardened
    assert {(s.fqn, s.source, s.target) for s in report.converted} == {
        ("act", "nn.GELU", "lambda_gelu"), ("blocks.0.act", "nn.SiLU", "lambda_swish"), ("blocks.1.act", "nn.SiLU", "lambda_swish")}
    assert report.left == [] and report.kept == [] and report.filtered == []
    original = ResidualNet()
    converted, _ = to_gates(original)
    assert isinstance(original.act, nn.GELU) and isinstance(converted.act, LambdaGELU)  # a copy by default
    assert isinstance(converted.blocks[1].act, LambdaSwish)


def test_hardened_in_a_plain_loop_then_swapped_within_the_bound(hardened):
    model, _, hardener, lambdas = hardened
    ds = digits()
    assert hardener.switch == SWITCH and hardener.hardened()
    targets = [lambda_target(5e-3, gate="phi"), lambda_target(5e-3, gate="sigmoid"), lambda_target(5e-3, gate="sigmoid")]
    assert lambdas[-1] == pytest.approx(targets, rel=1e-6)  # each gate family its own λ_target
    assert all(a < b for a, b in zip(lambdas[SWITCH][1:], lambdas[-1][1:]))  # annealed upward after e_s
    swap = swap_report(model, ds.test)
    assert swap["before"] > 0.8, swap  # it learned
    assert swap["after"] >= swap["before"] - SWAP_ACCURACY_TOL and swap["argmax_agreement"] >= 1 - SWAP_ACCURACY_TOL, swap
    assert api.swap(model, (ds.test.x, ds.test.y)) == swap  # the same numbers through the API and from tensors
    checked = api.check(model, (ds.val.x[:CHECK_SAMPLES], ds.val.y[:CHECK_SAMPLES]))
    cert = checked["certificate"]
    assert [layer["module"] for layer in checked["layers"]] == ["act", "blocks.0.act", "blocks.1.act"]
    assert cert["float32"]["status"] == "sound" and cert["float32"]["pass"], cert["float32"]
    assert cert["measured_max_logit_change"] <= cert["global"]["bound_max"]
    assert checked["verdict"]["certificate"] == "holds", checked["verdict"]
    assert not model.training  # api calls give the model back in its mode


def test_exported_smooth_and_swapped_graphs_agree_with_pytorch(hardened, tmp_path):
    model, _, _, _ = hardened
    x = digits().val.x
    smooth = api.export_onnx(model, x[:2], tmp_path / "smooth.onnx", check_inputs=x)  # raises on a mismatch
    relu = api.export_onnx(to_relu(copy.deepcopy(model)), x[:2], tmp_path / "relu.onnx", check_inputs=x)
    assert smooth["ops"].get("Gelu") == 1 and smooth["ops"].get("Sigmoid") == 2, smooth["ops"]
    assert relu["ops"].get("Relu") == 3 and not {"Gelu", "Sigmoid", "Div"} & set(relu["ops"]), relu["ops"]
    assert smooth["samples"] == relu["samples"] == len(x) and smooth["ort_bound_ratio"] <= 1


def test_resumed_from_a_checkpoint_mid_anneal_gives_the_same_lambdas(hardened, tmp_path):
    _, _, _, straight = hardened
    model, _, hardener, opt = _start()
    first = _fit(model, hardener, opt, range(1, 5))  # epochs 1-4: two of learning, two of annealing
    assert hardener.phase(4) == "anneal"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "hardener": hardener.state_dict()},
               tmp_path / "mid.pt")
    model2, _, hardener2, opt2 = _start(seed=1)  # other initial weights and λ: everything must come from the file
    state = torch.load(tmp_path / "mid.pt")
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optimizer"])
    hardener2.load_state_dict(state["hardener"])
    rest = _fit(model2, hardener2, opt2, range(5, EPOCHS + 1))
    assert first + rest == straight  # exactly: λ(e_s) and the schedule come from the checkpoint
    with pytest.raises(ValueError, match="T=8"):
        Hardener(model2, epochs=EPOCHS + 1).load_state_dict(state["hardener"])


class HFStyleMLP(nn.Module):
    """A Hugging Face-style block: the activation is a function held as an attribute."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)
        self.act_fn = F.gelu

    def forward(self, x):
        return self.fc2(self.act_fn(self.fc1(x)))


class TanhGELU(nn.Module):  # a user's activation nothing here knows
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(0.79788456 * (x + 0.044715 * x**3)))


class Zoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = HFStyleMLP()
        self.silu, self.tanh_gelu, self.tanh, self.mish = nn.SiLU(), nn.GELU(approximate="tanh"), nn.Tanh(), nn.Mish()
        self.mine, self.relu = TanhGELU(), nn.ReLU()
        self.partial = functools.partial(F.gelu, approximate="tanh")
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        h = self.mine(self.tanh(self.tanh_gelu(self.silu(self.mlp(x)))))
        return self.proj(self.relu(self.mish(F.silu(self.partial(h)))))  # F.silu: a call inside forward


def test_what_is_left_is_reported_with_its_reason_never_skipped():
    zoo, x = Zoo(), torch.randn(5, 8)
    model, report = to_gates(zoo, example=x)
    # the tanh GELU (as nn.GELU, a user's formula, a partial) is recognized by what it computes: λ-GELU at λ ≈ 1
    assert {s.fqn: s.target for s in report.converted} == {"mlp.act_fn": "lambda_gelu", "silu": "lambda_swish",
                                                            "tanh_gelu": "lambda_gelu", "mine": "lambda_gelu",
                                                            "partial": "lambda_gelu"}
    assert all(s.match_diff < 1e-3 and abs(s.match_lambda - 1) < 2e-3 for s in report.converted
               if s.fqn in ("tanh_gelu", "mine", "partial"))
    assert isinstance(model.mlp.act_fn, LambdaGELU) and "act_fn" in model.mlp._modules  # a submodule now
    left = {s.fqn: (s.source, s.reason) for s in report.left}
    assert set(left) == {"mish", ""}, left
    assert "'mish' has no hardenable activation" in left["mish"][1]
    assert left[""] == ("F.silu", left[""][1]) and "called inside forward()" in left[""][1]
    assert [(s.fqn, s.source) for s in report.not_gates] == [("tanh", "nn.Tanh")]
    assert "computes no gate" in report.not_gates[0].reason
    assert report.unknown_types == sorted({s.source for s in report.left}) and "test_convert.TanhGELU" in str(report)
    assert torch.allclose(model(x), zoo(x), atol=0.2)  # same function up to λ(0) = 1.05 instead of 1
    with pytest.raises(ConvertError) as e:
        to_gates(zoo, strict=True)
    assert "activation(s) left" in str(e.value) and "mish" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SwapError) as e:  # the swap would leave F.silu computing a smooth gate
        to_relu(model)
    msg = str(e.value)
    assert "F.silu in `(root)` (Zoo)" in msg and "\n" not in msg
    relu = to_relu(nn.Sequential(model.mlp, nn.Mish()))  # the inverse: every gate, converted ones and an nn.Mish, becomes ReLU
    assert gate_sites(relu) == [] and isinstance(relu[0].act_fn, nn.ReLU) and isinstance(relu[1], nn.ReLU)


def test_filter_inplace_and_channel_granularity():
    zoo = Zoo()
    same, report = to_gates(zoo, filter_fn=lambda m, fqn: not fqn.startswith("mlp"), inplace=True)
    assert same is zoo and isinstance(zoo.silu, LambdaSwish) and zoo.mlp.act_fn is F.gelu
    assert [(s.fqn, s.target) for s in report.filtered] == [("mlp.act_fn", "lambda_gelu")]
    with pytest.raises(ConvertError, match="needs example="):
        to_gates(HFStyleMLP(), GateConfig(granularity="channel"))
    model, _ = to_gates(HFStyleMLP(), GateConfig(granularity="channel", init_lambda=1.5), example=torch.randn(3, 8))
    assert model.act_fn.s.shape == (16,)  # one λ per unit of fc1's output, read from the example
    assert float(model.act_fn.lam.detach().mean()) == pytest.approx(1.5, rel=1e-6)
    shared, _ = to_gates(HFStyleMLP(), GateConfig(granularity="global"))
    again, report = to_gates(shared)  # hardenable already: kept, not wrapped again
    assert [s.fqn for s in report.kept] == ["act_fn"] and isinstance(again.act_fn, HardenableGate)


def test_readme_block_runs():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it on your own model", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)  # noqa: S102 - the documented example itself
    assert ns["hardener"].hardened() and [s.target for s in ns["report"].converted] == ["lambda_gelu", "lambda_swish"]
    assert gate_sites(ns["relu_model"]) == []


def test_the_registrys_own_gates_convert_too():
    from pipeline.activations import GELU, SERF, LambdaSERF, Linked, Mish, SiLU

    net = nn.Sequential(nn.Linear(4, 4), GELU(), Linked(SiLU()), nn.Linear(8, 4), SERF(), Mish(), nn.ReLU())
    model, report = to_gates(net, GateConfig(granularity="channel"), example=torch.randn(2, 4))
    assert [(s.fqn, s.target) for s in report.converted] == [("1", "lambda_gelu"), ("2.inner", "lambda_swish"),
                                                            ("4", "lambda_serf")]
    assert isinstance(model[2], Linked) and model[2].inner.s.shape == (4,) and isinstance(model[4], LambdaSERF)
    assert [s.fqn for s in report.left] == ["5"]  # Mish: no hardenable λ-Mish registered (tests/test_plugins.py adds one)
