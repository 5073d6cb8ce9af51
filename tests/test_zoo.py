"""timm and Hugging Face models through every stage, with no user declaration (issue 42), and never a silent non-swap.

Each of the five families (tests/_zoo.py) goes to_gates → Hardener in a plain loop → api.swap → to_relu → api.export_onnx
→ api.quantize. Expected values come from the closed forms (x·Φ(λx) by scipy's ndtr, x·σ(λx)), from onnxruntime, and
from counting the smooth ops the swapped forward calls. Skipped where the `models` extra is not installed."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from scipy import special
from torch import nn

from analysis import api
from _fresh import run_fresh
from benchmarks.zoo import FAMILIES, SmoothOps, build, data, harden
from pipeline import Hardener, to_gates, to_relu
from pipeline.extras import import_timm, import_transformers
from pipeline.hardener import HardenError
from pipeline.relu_swap import SwapError

try:
    timm, transformers = import_timm(), import_transformers()
except ImportError as exc:  # the models extra is not installed
    pytest.skip(str(exc), allow_module_level=True)

SWAP_MAX_DLOGIT = 1e-2  # the goal for a hardened model's swap
# int8 accuracy within 2.5 points of fp32 (6 of the 256 test inputs): these 4-epoch models sit near 60% accuracy with
# many inputs near a class boundary: resnet_silu's int8 accuracy moved by 4 inputs (1.6 points) with which test files
# ran before this one in the same process (as pytest-xdist's --dist loadfile may arrange); a broken quantization
# loses far more
INT8_POINTS = 0.025
LAMBDA_ATOL = 2e-3  # the λ a recognized activation matches (the tanh GELU's best λ is 1.00066)
MATCH_ATOL = 2e-3  # pipeline.recognize.MATCH_ATOL, the tolerance of a match (held equal by a test below)

# What every class of timm's and transformers' activation registries computes: (gate family, λ) or None (no gate).
# A class that appears in a later release fails `test_every_registered_activation_class` until it is added here.
GATE = {"gelu": ("phi", 1.0), "gelu_tanh": ("phi", 1.0), "gelu_new": ("phi", 1.0), "gelu_fast": ("phi", 1.0),
        "gelu_accurate": ("phi", 1.0), "gelu_python": ("phi", 1.0), "gelu_python_tanh": ("phi", 1.0),
        "gelu_pytorch_tanh": ("phi", 1.0), "quick_gelu": ("sigmoid", 1.702), "silu": ("sigmoid", 1.0),
        "swish": ("sigmoid", 1.0), "mish": ("mish", 1.0),
        # HardSwish is x·hardsigmoid(x), λ-HardSwish at λ = 1 (torch's nn.Hardswish under both names)
        "hard_swish": ("hardsigmoid", 1.0), "hardswish": ("hardsigmoid", 1.0)}
# hard_mish is x·clip(x/2 + 1, 0, 1): its gate is 1 at x = 0, so no λ makes it x·hardsigmoid(λx) (≥ 0.5 apart at x = −1)
NO_GATE = {"celu", "elu", "hard_mish", "hard_sigmoid", "hardsigmoid", "identity", "leaky_relu", "prelu", "relu", "relu6",
           "selu", "sigmoid", "tanh", "gelu_10", "laplace", "linear", "relu2", "sqrtsoftplus", "xielu"}


def _registry() -> list[tuple[str, str, type]]:
    from timm.layers import create_act
    from transformers.activations import ACT2CLS

    rows = [("timm", n, c) for reg in (create_act._ACT_LAYER_DEFAULT, create_act._ACT_LAYER_ME) for n, c in reg.items()]
    rows += [("transformers", n, c) for n, c in ACT2CLS.items()]
    return rows


def _instance(cls) -> nn.Module:
    cls, kwargs = cls if isinstance(cls, tuple) else (cls, {})
    return cls(**kwargs)


def _reference(family: str, lam: float, x: np.ndarray) -> np.ndarray:
    return x * (special.ndtr(lam * x) if family == "phi" else special.expit(lam * x) if family == "sigmoid"
                else np.clip(lam * x / 6 + 0.5, 0.0, 1.0) if family == "hardsigmoid"
                else np.tanh(np.logaddexp(0.0, lam * x)))


@pytest.mark.parametrize("lib,name,cls", _registry(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_registered_activation_class(lib, name, cls):
    from pipeline.recognize import grid

    act = _instance(cls)
    assert name in GATE or name in NO_GATE, f"{lib} registers {name!r} ({cls}): say in GATE or NO_GATE what it computes"
    net = nn.Sequential(nn.Linear(4, 4), act, nn.Linear(4, 4))
    _, report = to_gates(net)
    sites = {k: [s for s in getattr(report, k) if s.fqn == "1"] for k in ("converted", "left", "not_gates")}
    if name in NO_GATE:
        assert not sites["converted"] and not sites["left"]  # kept as it is: ReLU, Identity, or listed as no gate
        assert sites["not_gates"] or isinstance(act, (nn.ReLU, nn.Identity))
        return
    family, lam = GATE[name]
    if family == "mish":  # no hardenable λ-Mish is registered: left, with that reason
        assert "'mish' has no hardenable activation" in sites["left"][0].reason
        return
    (site,) = sites["converted"]
    assert site.target == {"phi": "lambda_gelu", "sigmoid": "lambda_swish", "hardsigmoid": "lambda_hardswish"}[family]
    if site.match_lambda is None:  # known by class (nn.GELU, nn.SiLU): exact
        return
    assert abs(site.match_lambda - lam) <= LAMBDA_ATOL
    x = grid().numpy()
    with torch.no_grad():
        y = act.eval()(torch.from_numpy(x.copy())).double().numpy()
    diff = float(np.abs(y - _reference(family, site.match_lambda, x)).max())  # scipy's, not the module's own fit
    assert diff <= MATCH_ATOL and diff == pytest.approx(site.match_diff, rel=1e-6, abs=1e-12)


@pytest.fixture(scope="module", params=FAMILIES)
def hardened(request):
    """The family's model converted with no declaration and hardened to λ_target in a plain loop (4 epochs)."""
    model, report, hardener, split = harden(request.param)
    return request.param, model, report, hardener, split


def test_converted_with_no_declaration_and_hardened(hardened):
    name, model, report, hardener, _ = hardened
    assert report.converted and not report.left and report.probed, str(report)
    assert [s.source for s in report.not_gates] == (["nn.Tanh"] if name == "bert" else [])  # BERT's pooler keeps its tanh
    assert hardener.hardened()
    assert pickle.loads(pickle.dumps(model)) is not None


def test_swap_export_int8_and_no_smooth_op_left(hardened, tmp_path):
    name, model, _, _, (x_train, _, x, y) = hardened
    swap = api.swap(model, (x, y))
    assert swap["max_logit_change"] <= SWAP_MAX_DLOGIT and swap["argmax_agreement"] >= 0.99, swap
    assert ("output" in swap) == (name in ("bert", "gpt2"))  # a ModelOutput's logits, said
    relu = to_relu(copy.deepcopy(model), x[:2])
    counter = SmoothOps(relu)
    with torch.no_grad(), counter:
        relu(x[:4])
    assert {k: v for k, v in counter.counts.items() if k != "Tanh.tanh"} == {}, counter.counts  # BERT's pooler
    exported = api.export_onnx(relu, x[:2], tmp_path / "relu.onnx", check_inputs=x)
    assert exported["ort_bound_ratio"] <= 1 and exported["samples_bounded"] == len(x)
    assert not any(op in exported["ops"] for op in ("Gelu", "Erf", "Sigmoid", "Softplus")), exported["ops"]
    int8 = api.quantize(relu, x_train, tmp_path / "relu.int8.onnx", data=(x, y))
    assert abs(int8["int8"]["accuracy"] - int8["fp32"]["accuracy"]) <= INT8_POINTS, (int8["int8"], int8["fp32"])


@pytest.mark.slow
def test_mobilenetv3_hardswish_becomes_lambda_hardswish_and_swaps_to_relu(tmp_path):
    """timm's mobilenetv3_small_050 (random weights, 32×32): its 19 nn.Hardswish convert to λ-HardSwish, its 9
    squeeze-excite nn.Hardsigmoid stay (listed at the swap), the Hardener anneals to λ_target, the swap changes no
    logit by more than 1e-2 and no hardswish is left in the swapped forward or its ONNX graph; api.check's per-sample
    bound keeps no prediction and its line says the convolutions make it so, not the squeeze-excite products (118 s
    measured on 2 loaded cores)."""
    model, report, hardener, (_, _, x, y) = harden("mobilenetv3")
    assert {s.source for s in report.converted} == {"nn.Hardswish"} and len(report.converted) == 19
    assert {s.target for s in report.converted} == {"lambda_hardswish"} and not report.left
    assert [s.source for s in report.not_gates] == ["nn.Hardsigmoid"] * 9
    assert hardener.hardened()
    swap = api.swap(model, (x, y))
    assert swap["max_logit_change"] <= SWAP_MAX_DLOGIT and swap["swapped"] == 19, swap
    assert swap["kept"] == ["9 Hardsigmoid kept: squeeze-excite gates, not activations"]
    relu = to_relu(copy.deepcopy(model), x[:2])
    assert not any(isinstance(m, nn.Hardswish) or hasattr(m, "lam") for m in relu.modules())
    counter = SmoothOps(relu)
    with torch.no_grad(), counter:
        relu(x[:4])
    assert counter.counts == {"Hardsigmoid.hardsigmoid": 9}, counter.counts  # the SE gates, once per forward each
    exported = api.export_onnx(relu, x[:2], tmp_path / "relu.onnx", check_inputs=x[:32])
    assert "HardSwish" not in exported["ops"] and exported["ops"].get("HardSigmoid") == 9, exported["ops"]
    check = api.check(model, (x[:64], y[:64]))
    growth = check["certificate"]["per_sample"]["growth"]
    assert check.verdict == "holds" and check.certified_fraction == 0 and growth in check.why
    first = growth.split(": ", 1)[1].split("), ")[0]  # the function that raises the box most
    assert "at `conv2d`" in first and "`mul`" not in growth, growth  # an SE gate's box is capped by its range [0, 1]


# -- never a silent non-swap: each of these returned a "ReLU" model or a perfect-looking swap on c1c507a ----------------

def test_gpt2_tanh_gelu_is_refused_before_conversion_and_converted_after():
    model = build("gpt2").eval()
    x, y = data("gpt2", 16)
    for call in (lambda: to_relu(copy.deepcopy(model)), lambda: api.swap(model, (x, y)), lambda: api.check(model, (x, y))):
        with pytest.raises(SwapError) as e:
            call()
        msg = str(e.value)
        assert "`transformer.h.0.mlp.act` (NewGELUActivation" in msg and "torch.tanh" in msg and "to_gates" in msg
        assert "\n" not in msg
    with pytest.raises(HardenError, match=r"NewGELUActivation.*to_gates"):
        Hardener(model, epochs=2)
    converted, report = to_gates(model, strict=True)
    assert [s.source.rsplit(".", 1)[-1] for s in report.converted] == ["NewGELUActivation"] * 2
    assert report.converted[0].match_diff <= MATCH_ATOL


def test_conv_first_model_is_watched_without_an_example():
    model = build("convnext").eval()  # timm's GELU modules; the first layer is a convolution
    with pytest.raises(SwapError) as e:
        to_relu(copy.deepcopy(model))
    assert "`stages.0.blocks.0.mlp.act` (GELU" in str(e.value) and "\n" not in str(e.value)
    _, report = to_gates(model)
    assert report.probed and len(report.converted) == 4


def test_the_match_tolerance_is_the_recognizers():
    from pipeline import recognize

    assert recognize.MATCH_ATOL == MATCH_ATOL


class Unsized(nn.Module):
    """Starts with a convolution, declares no input size, and runs only on 7×7 inputs."""

    def __init__(self):
        super().__init__()
        self.conv, self.act, self.head = nn.Conv2d(1, 2, 3), nn.GELU(), nn.Linear(2 * 5 * 5, 3)

    def forward(self, x):
        return self.head(self.act(self.conv(x)).flatten(1))


def test_an_unwatchable_model_is_asked_for_an_example_in_one_line():
    with pytest.raises(SwapError) as e:
        to_relu(Unsized())
    assert "pass example=" in str(e.value) and "\n" not in str(e.value)
    relu = to_relu(Unsized(), torch.zeros(2, 1, 7, 7))
    assert isinstance(relu.act, nn.ReLU)


class Swishy(nn.Module):  # a user's own formula, no class anyone registers
    def forward(self, x):
        return x * torch.sigmoid(x)


def test_a_users_own_gate_formula_is_recognized_and_never_passed_through():
    net = nn.Sequential(nn.Linear(4, 8), Swishy(), nn.Linear(8, 2))
    with pytest.raises(SwapError, match=r"torch.sigmoid in `1` \(Swishy, which computes λ-Swish"):
        to_relu(copy.deepcopy(net))
    model, report = to_gates(net)
    assert [(s.fqn, s.target) for s in report.converted] == [("1", "lambda_swish")]
    assert report.converted[0].match_lambda == pytest.approx(1.0, abs=1e-6)


def test_hf_wrappers_are_converted_once_and_strict_passes():
    model, report = to_gates(build("bert"), strict=True)  # c1c507a: "2 converted, 3 left", and strict raised
    assert [s.fqn for s in report.converted] == [f"bert.encoder.layer.{i}.intermediate.intermediate_act_fn" for i in (0, 1)]
    assert report.left == [] and [s.fqn for s in report.not_gates] == ["bert.pooler.activation"]


def test_quick_gelu_starts_at_its_own_lambda():
    act = transformers.activations.QuickGELUActivation()
    model, report = to_gates(nn.Sequential(nn.Linear(4, 4), act))
    assert float(model[1].lam.detach()) == pytest.approx(1.702, abs=LAMBDA_ATOL)
    x = torch.randn(64, 4)
    with torch.no_grad():
        assert torch.allclose(model(x), nn.Sequential(model[0], act)(x), atol=1e-5)


# -- Hugging Face's Trainer runs the Hardener --------------------------------------------------------------------------

def test_trainer_callback_hardens_inside_trainer_train(tmp_path):
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (the models extra installs it)")
    from pipeline.hf import STATE_FILE, HardeningCallback, hardening_optimizer

    x, y = data("bert", 128)
    train = [{"input_ids": a, "labels": b} for a, b in zip(x, y)]
    model, _ = to_gates(build("bert"))
    args = transformers.TrainingArguments(str(tmp_path), num_train_epochs=3, per_device_train_batch_size=32,
                                          learning_rate=3e-3, save_strategy="epoch", report_to=[], use_cpu=True,
                                          logging_strategy="no", disable_tqdm=True)
    hardener = Hardener(model, epochs=3)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train,
                                   optimizers=(hardening_optimizer(hardener, args), None),
                                   callbacks=[HardeningCallback(hardener)])
    trainer.train()
    assert hardener.hardened() and hardener.epoch == 3
    assert (tmp_path / "checkpoint-12" / STATE_FILE).is_file()
    again = Hardener(model, epochs=3)
    HardeningCallback.load(again, str(tmp_path / "checkpoint-12"))
    assert again.state_dict()["epoch"] == 3
    wrong = transformers.Trainer(model=model, args=args, train_dataset=train, callbacks=[HardeningCallback(Hardener(model, epochs=5))])
    with pytest.raises(HardenError, match="num_train_epochs=5"):
        wrong.train()


def _readme_block(heading: str) -> str:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = text.split(f"### {heading}", 1)[1].split("\n#", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_timm_block_runs(tmp_path):
    # as a user runs it: a fresh process, nothing imported before the block (tests/_fresh.py)
    run_fresh(_readme_block("A timm model") + "\nassert hardener.hardened() and len(report.converted) == 4\n", tmp_path)
    assert (tmp_path / "convnext.int8.onnx").is_file()


def test_readme_hugging_face_block_runs(tmp_path):
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate (the models extra installs it)")
    run_fresh(_readme_block("A Hugging Face model") + "\nassert hardener.hardened()\n", tmp_path)
    assert (tmp_path / "gpt2.int8.onnx").is_file()
