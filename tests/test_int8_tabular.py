"""int8 on tabular inputs: features of very different scales keep their information through the int8 graph (the input
normalization stays in float where folding it would put them on one grid), the verifier reads the form that ships,
and a model that falls below quantize.agreement_floor says so, naming the inputs that lose the signal and the fix."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from analysis import api
from analysis.verification.bounds import Bounder, Spec
from analysis.verification.readers import from_onnx
from pipeline.config import Config, QuantizeConfig
from pipeline.models import Normalize
from pipeline.runner import closing_lines
from quantize import int8 as q8
from quantize import ort as ort_util
from quantize.export import fold_normalization

# Feature scales spanning six decades, as a table's columns (an area in mm², a ratio) do.
SCALES = np.array([1e3, 1e2, 1.0, 1e-1, 1e-2, 1e-3])
OFFSETS = np.array([5e3, -2e2, 3.0, 0.5, 0.07, 0.002])
FLOOR = Config().quantize.agreement_floor
SQNR_TOL_DB = 1e-6  # float64 evaluation of the same quantized values
SUM_TOL = 1e-9  # float64 summation slack of the verifier's bounds (outputs here are O(1))


def _table(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(n, len(SCALES))) * SCALES + OFFSETS).astype(np.float32)


def _net(normalize: bool) -> nn.Sequential:
    """6 → 32 → 32 → 2 ReLU MLP with the model's own Normalize, trained a little to tell whether a fixed mix of the
    standardized features is positive (every feature counts alike); with `normalize` False the same function with
    the standardization folded into the first Linear's weights, so that the graph's input is quantized raw."""
    torch.manual_seed(0)
    net = nn.Sequential(Normalize(OFFSETS.tolist(), SCALES.tolist(), (len(SCALES),)), nn.Linear(len(SCALES), 32), nn.ReLU(),
                        nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    x = torch.as_tensor(_table(2048, 5))
    y = (((x - torch.as_tensor(OFFSETS, dtype=torch.float32)) / torch.as_tensor(SCALES, dtype=torch.float32))
         @ torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0]) > 0).long()
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    net.eval()
    return net if normalize else fold_normalization(net, (len(SCALES),))


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    path = tmp_path_factory.mktemp("tabular") / "model.int8.onnx"
    return path, api.quantize(_net(True), _table(512, 0), path, data=torch.as_tensor(_table(400, 1)))


def test_features_of_very_different_scales_keep_int8_agreement(tabular):
    """Folded, the input's one grid is set by the widest column and the narrow ones become constants; the stage keeps
    the normalization in float, and int8 agrees with fp32."""
    path, report = tabular
    assert report["argmax_agreement"] >= FLOOR
    forms = {r["form"]: r for r in report["settings"]["input_forms"]}
    assert report["settings"]["input_form"] == "float"
    assert forms["folded"]["agreement"] < FLOOR  # what the fold alone gave
    assert report["warning"] is None
    inputs = [r for r in report["sqnr"] if r["kind"] == "input"]
    assert len(inputs) == len(SCALES) and all(r["sqnr_db"] > q8.LOW_SQNR_DB for r in inputs)
    assert "Mul" in ort_util.op_counts(path) and "Add" in ort_util.op_counts(path)  # the standardization, in float


def test_where_agreement_cannot_tell_the_forms_apart_the_inputs_the_fold_loses_decide(tmp_path):
    """A model that reads only the widest column agrees as well folded, but its input grid would still flatten the
    narrow ones: the float form ships, with every form's record."""
    net = _net(True)
    with torch.no_grad():
        net[1].weight[:, 1:] = 0
    cfg = QuantizeConfig(clip_tolerance_pt=5.0)  # both forms within it: the lost inputs decide
    report = api.quantize(net, _table(512, 0), tmp_path / "m.int8.onnx", data=torch.as_tensor(_table(400, 1)), config=cfg)
    forms = {r["form"]: r for r in report["settings"]["input_forms"]}
    assert abs(forms["folded"]["agreement"] - forms["float"]["agreement"]) <= cfg.clip_tolerance_pt / 100
    # lost under the fold: the columns three and more decades below the widest (its grid step is about 30 of its units)
    assert forms["folded"]["inputs_lost"] == int((SCALES <= 1).sum()) and forms["float"]["inputs_lost"] == 0
    assert report["settings"]["input_form"] == "float"


def test_the_verifier_reads_the_float_prologue_and_its_bounds_contain_onnxruntime(tabular):
    path, _ = tabular
    graph = from_onnx(path)
    sess = ort_util.session(path)
    rng = np.random.default_rng(2)
    eye = torch.eye(graph.num_outputs, dtype=torch.float64)
    for x0 in _table(3, 3):
        for rel in (1e-3, 3e-2):
            lb, ub = x0 - rel * SCALES, x0 + rel * SCALES
            b = Bounder(graph, lb, ub)
            b.crown()
            lo = b.spec_bounds(Spec(eye, torch.zeros(graph.num_outputs))).numpy()
            hi = -b.spec_bounds(Spec(-eye, torch.zeros(graph.num_outputs))).numpy()
            pts = np.concatenate([rng.uniform(lb, ub, (500, len(SCALES))), [lb, ub]]).astype(np.float32)
            y = ort_util.infer(sess, pts)
            assert np.all(y >= lo - SUM_TOL) and np.all(y <= hi + SUM_TOL), (rel, float((lo - y).max()), float((y - hi).max()))


def test_a_model_below_the_floor_warns_naming_the_inputs_and_the_fix(tmp_path):
    """No normalization in the model: its raw input is quantized on one grid, the narrow columns are lost, and the
    result, a RuntimeWarning and the per-input SQNR say which and what to do."""
    path = tmp_path / "raw.int8.onnx"
    with pytest.warns(RuntimeWarning, match="below quantize.agreement_floor"):
        report = api.quantize(_net(False), _table(512, 0), path, data=torch.as_tensor(_table(400, 1)))
    assert report["argmax_agreement"] < FLOOR and report["settings"]["input_form"] == "float"
    w = report["warning"]
    assert f"{report['argmax_agreement']:.2%}" in w and "input[5]" in w and "input[0]" not in w
    assert "fix: standardize each input feature inside the model" in w

    # the per-input SQNR is that of the input's QuantizeLinear, as its closed form gives it from the file's grid
    init = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}
    qnode = next(n for n in onnx.load(str(path)).graph.node if n.op_type == "QuantizeLinear" and n.input[0] == ort_util.INPUT)
    s, z = init[qnode.input[1]], init[qnode.input[2]]
    info = np.iinfo(z.dtype)
    x = _table(400, 1)[:QuantizeConfig().sqnr_samples]
    xq = ((np.clip(np.rint(x / s) + z.astype(np.float32), info.min, info.max) - z) * s).astype(np.float64)
    want = 10 * np.log10(np.square(x - x.mean(0, dtype=np.float64)).mean(0) / np.square(x - xq).mean(0))
    got = [r["sqnr_db"] for r in report["sqnr"] if r["kind"] == "input"]
    np.testing.assert_allclose(got, want, atol=SQNR_TOL_DB)
    assert got[0] > q8.LOW_SQNR_DB > got[-1]


def test_a_layer_that_loses_the_signal_is_named_with_its_fix():
    fid = {"agreement": 0.9, "disagreements": 10, "inputs": 100}
    rows = [{"tensor": "a", "kind": "input", "sqnr_db": 35.0}, {"tensor": "/fc0/Gemm_output_0", "kind": "activation", "sqnr_db": 31.0},
            {"tensor": "/fc1/Gemm_output_0", "kind": "activation", "sqnr_db": 12.5},
            {"tensor": "logits", "kind": "activation", "sqnr_db": 9.0}, {"tensor": "w", "kind": "weight", "sqnr_db": 5.0}]
    w = q8.agreement_warning("m", fid, 0.98, "the validation split", rows, folded=False)
    assert w.startswith("m: int8 agrees with fp32 on 90.00% of the validation split (10 of 100 differ)")
    assert "from /fc1/Gemm_output_0 on (12.5 dB SQNR; the lowest 9.0 dB)" in w and "quantize.activation_type=int16" in w
    assert q8.agreement_warning("m", {**fid, "agreement": 0.98}, 0.98, "x", rows, folded=False) is None
    lost = [{"tensor": "area", "kind": "input", "sqnr_db": -math.inf}, *rows]
    assert "quantize.fold_normalization=false" in q8.agreement_warning("m", fid, 0.98, "x", lost, folded=True)


def test_the_run_ends_with_the_int8_warning(tmp_path):
    from pipeline.rundir import RunDir

    cfg = Config()
    cfg.out_dir, cfg.name = str(tmp_path), "run"
    run = RunDir.create(cfg)
    run.mark_stage("int8", status="done", metrics={"warnings": ["relu/relu: int8 agrees with fp32 on 64.60% ..."]})
    assert "WARNING (int8) relu/relu: int8 agrees with fp32 on 64.60% ..." in closing_lines(run)
