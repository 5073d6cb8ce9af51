"""The table of what the verifier reads (README, `api.verify`'s docstring) is the one the engine's readers give now."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from analysis import api
from analysis.robustness import coverage
from analysis.verification.ops import UnsupportedModel
from analysis.verification.readers import from_onnx
from pipeline.models import MODELS
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
    assert all(set(cells) == set(coverage.KINDS) for cells in generated.values())
    assert all(c == coverage.READ or c.startswith("not read: ") for cells in generated.values() for c in cells.values())


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
