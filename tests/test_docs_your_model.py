"""docs/hardening-in-your-loop.md, "Your model, end to end": its code blocks run in order in one namespace, in a fresh
folder, and what each step promises is checked against an independent reference (onnxruntime on the files it wrote,
the model's own forward)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from pipeline.activations import gate_sites

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "hardening-in-your-loop.md"
SECTION = "## Your model, end to end"


def blocks() -> list[str]:
    text = DOC.read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_walkthrough_runs_and_does_what_it_says(tmp_path, monkeypatch, capsys):
    code = blocks()
    assert len(code) >= 8  # setup, convert, harden, check, swap, export, quantize, verify
    joined = "\n".join(code)
    for step in ("to_gates(", "Hardener(", "api.check(", "api.swap(", "to_relu(", "api.export_onnx(", "api.quantize(",
                 "api.verify("):
        assert step in joined, step
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("walkthrough")  # a module of its own, as a user's script is: its classes pickle
    monkeypatch.setitem(sys.modules, module.__name__, module)
    ns = module.__dict__
    for i, block in enumerate(code):
        exec(compile(block, f"{DOC.name} block {i + 1}", "exec"), ns)  # noqa: S102 - the documented example itself

    # convert: both GELUs of Net became gates; the inline one is reported, found without example=
    assert sorted(s.fqn for s in ns["report"].converted) == ["act", "act_fn"] and ns["report"].probed
    assert [(s.fqn, s.source) for s in ns["inline"].left] == [("", "F.gelu")]
    # harden: every gate at λ_target; the pickled model is the model
    assert ns["hardener"].hardened() and ns["hardener"].hardness() >= 1 - 1e-6
    x_val, y_val = ns["x_val"], ns["y_val"]
    loaded = torch.load(tmp_path / "hardened.pt", weights_only=False)
    with torch.no_grad():
        assert torch.equal(loaded(x_val), ns["model"](x_val))
    # check and swap
    assert ns["checked"]["verdict"]["certificate"] == "holds"
    assert gate_sites(ns["relu_model"]) == []
    # export: the files are there and run
    smooth, relu = (ort.InferenceSession(str(tmp_path / f)) for f in ("smooth.onnx", "relu.onnx"))
    with torch.no_grad():
        ref = ns["relu_model"](x_val).numpy()
    got = relu.run(None, {"input": x_val.numpy()})[0]
    assert np.array_equal(got.argmax(1), ref.argmax(1))
    assert {n.op_type for n in onnx.load(str(tmp_path / "smooth.onnx")).graph.node} & {"Gelu", "Erf"}
    # quantize: the int8 accuracy the report gives is onnxruntime's on the int8 file
    q = ort.InferenceSession(str(tmp_path / "relu.int8.onnx"))
    acc = float((q.run(None, {"input": x_val.numpy()})[0].argmax(1) == y_val.numpy()).mean())
    assert ns["int8"]["int8"]["accuracy"] == acc and ns["int8"]["int8"]["integer_only"]
    # verify: each counterexample, replayed here, is misclassified; the small radius is proved for most samples
    rows = ns["result"]["rows"]
    assert ns["result"]["certified"][0.01] >= 0.75 and any(r["counterexample"] is not None for r in rows)
    for r in rows:
        if r["counterexample"] is not None:
            logits = relu.run(None, {"input": r["counterexample"][None]})[0][0]
            assert logits.argmax() != r["label"]
    out = capsys.readouterr().out
    assert "Smooth work inside forward() looked for" in out and "verify: 8/8" in out
