"""Calibration of any size: `api.quantize` with a calibration set whose last batch is ragged (not a multiple of
quantize.int8.CALIBRATION_BATCH) quantizes with the ranges onnxruntime's own calibrator gives the same rows in
one batch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from onnxruntime import quantization as q
from torch import nn

from analysis import api
from pipeline.config import QuantizeConfig
from quantize import int8 as q8
from quantize import ort as ort_util

# The histograms see the same values in either batching, so the ranges (and scales) are the same floats.
SCALE_RTOL = 0.0

METHODS = {"minmax": q.CalibrationMethod.MinMax, "entropy": q.CalibrationMethod.Entropy,
           "percentile": q.CalibrationMethod.Percentile}


class _OneBatch(q.CalibrationDataReader):
    def __init__(self, x: np.ndarray):
        self.batches = iter([{ort_util.INPUT: x}])

    def get_next(self):
        return next(self.batches, None)


@pytest.fixture(scope="module")
def fp32_file(tmp_path_factory):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    path = tmp_path_factory.mktemp("calib") / "mlp.onnx"
    api.export_onnx(net, torch.randn(2, 6), path)
    return path


def _quant_params(path) -> dict[str, np.ndarray]:
    """Every scale and zero point in a QDQ file, by name."""
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer
            if i.name.endswith(("_scale", "_zero_point"))}


def _reference(fp32_file, x: np.ndarray, method: str, tmp_path) -> dict[str, np.ndarray]:
    """onnxruntime's own calibration of the same pre-processed graph on all of `x` in one batch."""
    pre, ref = tmp_path / "ref.pre.onnx", tmp_path / "ref.int8.onnx"
    q.quant_pre_process(str(fp32_file), str(pre))
    cfg = QuantizeConfig()
    if method == "entropy":  # the stage's finer histogram (quantize_static's own has one candidate), by hand here
        from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

        cal = create_calibrator(pre, q8.QUANTIZED_OPS, augmented_model_path=str(tmp_path / "ref_aug.onnx"),
                                calibrate_method=q.CalibrationMethod.Entropy,
                                extra_options={"num_bins": q8.ENTROPY_BINS, "num_quantized_bins": 128})
        cal.collect_data(_OneBatch(x))
        save_tensors_data(cal.compute_data(), tmp_path / "ref_ranges.json")
        reader, cache = None, tmp_path / "ref_ranges.json"
    else:
        reader, cache = _OneBatch(x), None
    q.quantize_static(str(pre), str(ref), reader, quant_format=q.QuantFormat.QDQ, calibration_cache_path=cache,
                      op_types_to_quantize=q8.QUANTIZED_OPS, per_channel=cfg.per_channel, reduce_range=cfg.reduce_range,
                      weight_type=q.QuantType.QInt8, activation_type=q.QuantType.QInt8, calibrate_method=METHODS[method],
                      extra_options={"QDQKeepRemovableActivations": cfg.keep_activations,
                                     "QuantizeBias": cfg.quantize_bias, "CalibPercentile": cfg.percentile})
    return _quant_params(ref)


@pytest.mark.parametrize("rows, method", [(1, "percentile"), (129, "percentile"), (300, "percentile"),
                                          (410, "percentile"), (129, "entropy"), (300, "minmax")])
def test_any_number_of_calibration_rows_gives_one_batch_ranges(fp32_file, rows, method, tmp_path):
    x = np.random.default_rng(rows).normal(size=(rows, 6)).astype(np.float32)
    x[:, 0] *= 40  # one wide input, so the ranges differ from tensor to tensor
    out = tmp_path / "model.int8.onnx"
    # no clip search: every model is quantized at the reference percentile, so the ranges alone decide the file (the
    # wide column costs agreement, which is not what is checked here: no floor)
    report = api.quantize(fp32_file, x, out, config=QuantizeConfig(calibration_method=method, clip_search=[], agreement_floor=0.0))
    assert report["settings"]["calibration_samples"] == rows
    got, want = _quant_params(out), _reference(fp32_file, x, method, tmp_path)
    assert got.keys() == want.keys() and len(got) >= 8  # input, 2 hidden and the output tensor: scale and zero point
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=SCALE_RTOL, atol=0, err_msg=name)


def test_no_calibration_rows_is_one_line_naming_it(fp32_file, tmp_path):
    with pytest.raises(ValueError, match="no calibration inputs"):
        api.quantize(fp32_file, np.zeros((0, 6), np.float32), tmp_path / "model.int8.onnx")
