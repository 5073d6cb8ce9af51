"""The table of what the verifier reads (README, `api.verify`'s docstring) is the one the engine's readers give now."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from analysis import api
from analysis.robustness import coverage
from analysis.verification.ops.base import UnsupportedModel
from analysis.verification.readers import from_onnx
from pipeline.models import MODELS
from quantize.verifier_form import signature
from tests._onnx import make_model

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def generated() -> dict[str, dict[str, str]]:
    return coverage.table()


def _readme_table() -> str:
    text = README.read_text()
    m = re.search(r"<!-- coverage:begin -->\n(.*?)\n<!-- coverage:end -->", text, re.S)
    assert m, "README.md lost its <!-- coverage:begin/end --> markers"
    return m.group(1).strip()


def test_every_built_in_architecture_has_a_row_and_every_kind_a_cell(generated):
    assert list(generated) == list(MODELS)
    assert all(set(cells) == set(coverage.COLUMNS) for cells in generated.values())
    assert all(c[k] == coverage.READ or c[k].startswith("not read: ") for c in generated.values() for k in coverage.KINDS)


def test_the_second_tool_column_is_measured_on_the_form_shipped_now(generated):
    # the peer benchmark's record holds each tiny float ReLU file's form: a changed export makes its row "not
    # measured" until benchmarks/peers/readers.py runs again, so the README never claims a stale form is read
    cells = {name: c[coverage.SECOND] for name, c in generated.items()}
    assert coverage.RERUN not in cells.values(), cells
    assert all(v == "—" for name, v in cells.items() if generated[name]["float ReLU"] != coverage.READ)
    assert all(v == "no" or v.startswith("yes: ") for name, v in cells.items() if generated[name]["float ReLU"] == coverage.READ)
    # the conv and residual networks' files, the ones issue 40 found refused, are read by every loader measured
    for name in ("cnn", "preact_resnet", "resnet18_cifar"):
        assert cells[name] == "yes: auto_LiRPA, neuralsat, onnx2pytorch, onnx2torch", (name, cells[name])


def test_a_record_of_another_form_is_not_taken_for_this_one(tmp_path, monkeypatch):
    record = {"tools": {"onnx2torch": {"label": "onnx2torch", "version": "1"}},
              "cases": [{"name": "cnn (float ReLU)", "architecture": "cnn", "kind": "float ReLU", "source": "tiny",
                         "signature": "0" * 16, "results": {"onnx2torch": {"read": True}}}]}
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    monkeypatch.setattr(coverage, "PEER_RECORD", path)
    coverage._peer_record.cache_clear()
    try:
        cells = coverage.row("cnn", tmp_path)
        assert cells[coverage.SECOND] == coverage.RERUN
        relu = tmp_path / "cnn.relu.onnx"  # the same record with this export's own signature: measured, read
        record["cases"][0]["signature"] = signature(onnx.load(str(relu)))
        path.write_text(json.dumps(record))
        coverage._peer_record.cache_clear()
        assert coverage.second_tools("cnn", relu) == "yes: onnx2torch"
        record["cases"][0]["results"]["onnx2torch"]["read"] = False
        path.write_text(json.dumps(record))
        coverage._peer_record.cache_clear()
        assert coverage.second_tools("cnn", relu) == "no"
    finally:
        coverage._peer_record.cache_clear()


def test_readme_and_docstring_hold_the_generated_table(generated):
    table = coverage.markdown(generated)
    fix = "run `python -m analysis.robustness.coverage` and paste its table"
    assert _readme_table() == table, f"README.md's verify table is stale: {fix}"
    assert table in inspect.getdoc(api.verify), f"api.verify's docstring table is stale: {fix}"


def test_the_image_models_are_read_in_every_kind(generated):
    # the promise: every image architecture the pipeline builds gets float and int8 rows
    for name in ("mlp", "cnn", "preact_resnet", "resnet18_cifar", "deit_tiny"):
        assert all(generated[name][k] == coverage.READ for k in coverage.KINDS), (name, generated[name])


def test_an_integer_input_is_refused_in_its_own_terms():
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 2])],
                              [helper.make_tensor("table", TensorProto.FLOAT, [4, 2], [0.0] * 8)])
    with pytest.raises(UnsupportedModel) as e:
        from_onnx(make_model(graph, 17))
    assert e.value.what == "an integer input (int64: token ids or indices)" and "embedding" in e.value.fix
    assert "\n" not in str(e.value)


def test_the_decided_column_quotes_the_measured_runs_summaries(generated):
    # every measured run named exists with its summary and config; each cell's counts are the summary's own
    import json
    assert set(coverage.MEASURED) <= set(MODELS)
    for name, folders in coverage.MEASURED.items():
        cell = generated[name][coverage.DECIDED]
        for folder in folders:
            summary = json.loads((coverage.BENCHMARKS / folder / "summary.json").read_text())
            d = summary["decided"]
            counts = f"{d['relu']['decided']}/{d['relu']['properties']} · {d['smooth']['decided']}/{d['smooth']['properties']}"
            assert counts in cell and f"benchmarks/{folder}/summary.json" in cell, (name, folder, cell)
    assert all(c[coverage.DECIDED] == coverage.UNMEASURED for n, c in generated.items() if n not in coverage.MEASURED)
