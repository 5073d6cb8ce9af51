"""analysis.api: the verify stage's verifiers on a model and data tensors (check, swap and export through the API
are exercised on a user's residual model in tests/test_convert.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from _digits import digits, trained
from analysis import api
from analysis.verification import registry
from pipeline import to_relu

SAMPLES = 4
SMALL_EPS, LARGE_EPS = 1e-3, 0.5  # a radius the digits MLP survives, and one (half the pixel range) it cannot


@pytest.fixture(scope="module")
def relu_mlp():
    torch.manual_seed(0)
    model, _ = trained("lambda_gelu", epochs=10)
    return model, to_relu(copy.deepcopy(model))


def test_verify_a_model_on_data_tensors(relu_mlp):
    smooth, relu = relu_mlp
    ds = digits()
    data = (ds.val.x, ds.val.y)
    out = api.verify(relu, data, [SMALL_EPS, LARGE_EPS], low=0.0, high=1.0, samples=SAMPLES, timeout_s=5.0)
    assert out["verifier"] == registry.resolve("auto") and len(out["rows"]) == 2 * SAMPLES
    correct = (relu(ds.val.x[:SAMPLES]).argmax(-1) == ds.val.y[:SAMPLES]).float().mean().item()
    assert out["certified"][SMALL_EPS] == correct  # the complete chain decides every correctly classified sample
    assert out["certified"][LARGE_EPS] == 0.0 and {r["result"] for r in out["rows"] if r["eps"] == LARGE_EPS} == {"sat"}
    assert all(r["reason"] == "" for r in out["rows"]) and out["first_pass"] > 0 and out["note"] == ""
    assert all(r["seconds"] <= 5.0 + 0.5 for r in out["rows"])
    bounds = api.verify(smooth, data, [SMALL_EPS], low=0.0, high=1.0, samples=SAMPLES, verifier="crown")
    assert bounds["certified"][SMALL_EPS] > 0  # the smooth model through its gates' relaxations
    assert not smooth.training and not relu.training


class _Wrapper(torch.nn.Module):
    """What a user writes: not an nn.Sequential, a residual add inside, an activation the verifier reads."""

    def __init__(self, residual: bool, act: torch.nn.Module):
        super().__init__()
        self.residual = residual
        self.fc1, self.fc2, self.out, self.act = torch.nn.Linear(64, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 10), act

    def forward(self, x):
        h = self.act(self.fc1(x.flatten(1)))
        h = self.act(h + self.fc2(h)) if self.residual else self.act(self.fc2(h))
        return self.out(h)


@pytest.mark.parametrize("residual", [False, True])
def test_verify_a_wrapper_module_and_a_residual_module(residual):
    torch.manual_seed(1)
    model = _Wrapper(residual, torch.nn.ReLU()).eval()
    ds = digits()
    data = (ds.val.x, model(ds.val.x).argmax(-1).detach())  # its own predictions: every sample is correctly classified
    out = api.verify(model, data, [SMALL_EPS, LARGE_EPS], low=0.0, high=1.0, samples=SAMPLES, timeout_s=10.0)
    assert out["certified"][SMALL_EPS] == 1.0
    assert {r["result"] for r in out["rows"]} <= {"sat", "unsat"}  # complete: every property decided


def test_verify_a_module_it_cannot_represent_says_which_op_and_where():
    model = _Wrapper(True, torch.nn.LogSoftmax(-1)).eval()
    ds = digits()
    with pytest.raises(NotImplementedError) as e:
        api.verify(model, (ds.val.x, ds.val.y), [SMALL_EPS], samples=1)
    msg = str(e.value)
    assert msg.startswith("_Wrapper: unsupported op LogSoftmax in module 'act'") and "\n" not in msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_verify_on_a_device_this_machine_lacks_is_one_line_in_its_own_words(relu_mlp):
    """The device is resolved once, before any work, to a DeviceError that names `device=` as api.verify spells it."""
    from pipeline.errors import DeviceError

    ds = digits()
    with pytest.raises(DeviceError) as e:
        api.verify(relu_mlp, (ds.val.x, ds.val.y), [SMALL_EPS], samples=1, device="cuda")
    assert str(e.value).startswith("device=cuda asked for CUDA but none is available; use device=cpu")


@pytest.mark.parametrize("activations", ["int8", "int16"])
def test_verify_an_int8_onnx_file_and_its_witnesses_are_onnxruntimes(relu_mlp, tmp_path, activations):
    """The int8 file `api.quantize` writes (or its w8a16 one, `activation_type` "int16"), through `api.verify`: every
    sat's witness (found on the model itself in onnxruntime or by PGD) is strictly misclassified when onnxruntime runs
    it, and the small radius is decided."""
    import numpy as np

    from pipeline.config import QuantizeConfig
    from quantize import ort as ort_util

    _, relu = relu_mlp
    ds = digits()
    path = tmp_path / "mlp.int8.onnx"
    api.quantize(relu, ds.train.x[:256], path, config=QuantizeConfig(activation_type=activations))
    out = api.verify(path, (ds.val.x, ds.val.y), [SMALL_EPS, LARGE_EPS], low=0.0, high=1.0, samples=SAMPLES,
                     timeout_s=5.0, progress=False)
    sess = ort_util.session(path)
    sats = [r for r in out["rows"] if r["result"] == "sat"]
    assert {r["result"] for r in out["rows"] if r["eps"] == LARGE_EPS} == {"sat"}
    for r in sats:
        x = np.asarray(r["counterexample"], dtype=np.float32)
        y = ort_util.infer(sess, x[None])[0]
        label = int(ds.val.y[r["sample"]])
        assert np.max(np.delete(y, label)) > y[label], r
        assert np.allclose(y, np.asarray(r["output"]), rtol=0, atol=0)  # the output it reports is onnxruntime's
    assert all(r["result"] in ("sat", "unsat") for r in out["rows"] if r["eps"] == SMALL_EPS), out["rows"]
    assert any("search on the model" in r["message"] for r in sats)  # the int8 search ran, through OnnxRecheck
