"""Plug-ins through the real entry-point mechanism: a throwaway package (a module and its .dist-info with an
entry_points.txt) is put on sys.path, found by importlib.metadata, registered before a config's names are
checked, listed by `pipeline plugins`, and run through `pipeline run`; a broken one is one line."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from torch import nn

from pipeline import plugins, to_gates
from pipeline.activations import ACTIVATIONS
from pipeline.cli import main
from pipeline.data import DATASETS
from pipeline.models import MODELS

PACKAGE = '''
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.activations import HardenableGate, with_limits
from pipeline.data import load_digits


def load(cfg):  # a data set: (DataConfig) -> Dataset
    return load_digits(cfg)


def build(cfg, input_shape, num_classes, act):  # a model: the builders' signature in pipeline/models.py
    return [("flatten", nn.Flatten()), ("fc0", nn.Linear(64, 16)), ("act0", act(16)),
            ("head", nn.Linear(16 * act.expansion, num_classes))]


class LambdaMish(HardenableGate):  # an activation: x·tanh(softplus(λx)), the "mish" gate family
    GATE = "mish"
    expression = staticmethod(lambda x, lam: with_limits(x, torch.as_tensor(lam, dtype=x.dtype), lambda z: torch.tanh(F.softplus(z))))
'''


def _package(root: Path, name: str, module: str, entry_points: str) -> None:
    (root / f"{name}.py").write_text(textwrap.dedent(module))
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path for throwaway packages; the registries are restored afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    plugins.unload()  # another test in this process may have loaded (no) plug-ins already
    monkeypatch.syspath_prepend(str(root))
    yield root
    plugins.unload()
    for name in ("myplug", "brokenplug", "clashplug"):
        sys.modules.pop(name, None)


@pytest.fixture
def myplug(site):
    _package(site, "myplug", PACKAGE, """
        [lambda_gelu_pipeline.datasets]
        tiny_digits = myplug:load
        [lambda_gelu_pipeline.models]
        tiny_mlp = myplug:build
        [lambda_gelu_pipeline.activations]
        lambda_mish = myplug:LambdaMish
    """)
    return site


def test_entry_points_are_found_registered_and_listed(myplug, capsys):
    found = plugins.load()
    assert {(p.kind, p.name, p.package, p.error) for p in found} == {
        ("datasets", "tiny_digits", "myplug 0.1", ""), ("models", "tiny_mlp", "myplug 0.1", ""),
        ("activations", "lambda_mish", "myplug 0.1", "")}
    assert "tiny_digits" in DATASETS and "tiny_mlp" in MODELS
    assert ACTIVATIONS["lambda_mish"].hardenable and ACTIVATIONS["lambda_mish"].gate == "mish"
    assert ACTIVATIONS["linked_lambda_mish"].expansion == 2
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "| lambda_gelu_pipeline.activations | lambda_mish | myplug:LambdaMish | myplug 0.1 | registered |" in out
    # a registered hardenable Mish makes nn.Mish convertible (it was left before: no hardenable family member)
    _, report = to_gates(nn.Sequential(nn.Linear(2, 2), nn.Mish()))
    assert [(s.source, s.target) for s in report.converted] == [("nn.Mish", "lambda_mish")]
    plugins.unload()
    assert "tiny_digits" not in DATASETS and "lambda_mish" not in ACTIVATIONS


def test_a_plugin_data_set_model_and_activation_run_through_pipeline_run(myplug, tmp_path):
    args = ["run", f"out_dir={tmp_path}", "name=plug", "threads=1", "data.name=tiny_digits", "model.name=tiny_mlp",
            "variants=lambda_mish,relu", "train.epochs=2", "train.switch_fraction=0.5", "stages=train,harden,swap"]
    assert main(args) == 0  # names are checked after the plug-ins are loaded (runner.validate)
    run = tmp_path / "plug"
    facts = json.loads((run / "manifest.json").read_text())["variants"]["lambda_mish"]
    assert facts["hardenable"] and facts["gate"] == "mish" and facts["swapped_to"] == "relu"
    assert json.loads((run / "swap" / "swap.json").read_text())["lambda_mish"]["argmax_agreement"] > 0.9


def test_a_broken_plugin_is_one_line_naming_package_and_entry_point(site, tmp_path, capsys):
    _package(site, "brokenplug", "import not_a_module_anywhere\n", """
        [lambda_gelu_pipeline.datasets]
        broken_data = brokenplug:load
    """)
    _package(site, "clashplug", "def load(cfg):\n    return None\n", """
        [lambda_gelu_pipeline.datasets]
        digits = clashplug:load
    """)
    assert main(["run", f"out_dir={tmp_path / 'runs'}", "data.name=digits"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "plug-in 'broken_data' (lambda_gelu_pipeline.datasets = brokenplug:load, from brokenplug 0.1)" in err
    assert "ModuleNotFoundError" in err and not (tmp_path / "runs").exists()  # stopped before any folder
    assert main(["plugins"]) == 1  # the listing still shows every plug-in, with what went wrong
    out = capsys.readouterr().out
    assert "No module named 'not_a_module_anywhere'" in out and "the name 'digits' is taken" in out
    assert DATASETS["digits"].__module__ == "pipeline.data.builtin"  # a clash never replaces a built-in
