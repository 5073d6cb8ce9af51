"""What issue 42's models need beyond their activations, on toy modules (no timm or transformers): outputs that are not a
tensor, the certificate's rules for addmm and in-place adds (each equal to the rule of the op it stands for, and sound
by sampling), and the export check's bounded sample count."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from analysis import api
from analysis.theory import certificate as cert
from pipeline import to_gates, to_relu
from pipeline.outputs import OutputError
from quantize import export as export_mod

RULE_RTOL = 1e-12  # two rules for the same arithmetic give the same bound up to float64 reassociation


class Net(nn.Module):
    """Linear → GELU → Linear, returning its logits as `shape` says: a tensor, a dict with logits, a tuple."""

    def __init__(self, shape: str = "tensor"):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.act, self.out, self.shape = nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3), shape

    def forward(self, x):
        y = self.out(self.act(self.fc(x)))
        return {"tensor": y, "dict": {"logits": y, "hidden": x}, "tuple": (y, x), "nameless": {"a": y, "b": x}}[self.shape]


@pytest.mark.parametrize("shape,said", [("dict", "the `logits` of its dict"), ("tuple", "element 0 of the tuple")])
def test_a_dict_or_tuple_output_is_measured_on_its_logits_and_said(shape, said):
    x, y = torch.randn(64, 6), torch.randint(0, 3, (64,))
    plain, other = to_gates(Net())[0], to_gates(Net(shape))[0]
    a, b = api.swap(plain, (x, y)), api.swap(other, (x, y))
    assert said in b.pop("output") and a == b  # the same numbers as the tensor-returning model
    checked = api.check(other, (x, y))
    assert said in checked["output"] and checked["verdict"] == api.check(plain, (x, y))["verdict"]
    with pytest.raises(OutputError, match="no `logits`") as e:
        api.swap(to_gates(Net("nameless"))[0], (x, y))
    assert "\n" not in str(e.value)


class Affine(nn.Module):
    """x·W + b written as torch.addmm (Hugging Face's Conv1D) or as F.linear: the same function."""

    def __init__(self, lin: nn.Linear, addmm: bool):
        super().__init__()
        self.weight, self.bias, self.addmm = lin.weight, lin.bias, addmm

    def forward(self, x):
        return torch.addmm(self.bias, x, self.weight.t()) if self.addmm else F.linear(x, self.weight, self.bias)


class Residual(nn.Module):
    """x + gate(W x), the add written in place (timm's `x += shortcut`) or not."""

    def __init__(self, inplace: bool, addmm: bool):
        super().__init__()
        torch.manual_seed(1)
        self.fc1, self.fc2, self.head = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.a1, self.a2, self.inplace = Affine(self.fc1, addmm), Affine(self.fc2, addmm), inplace
        self.act = nn.GELU()

    def forward(self, x):
        h = self.a2(self.act(self.a1(x)))
        if self.inplace:
            h += x
        else:
            h = h + x
        return self.head(self.act(h))


@pytest.mark.parametrize("inplace,addmm", [(True, False), (False, True), (True, True)])
def test_addmm_and_inplace_add_are_bounded_as_linear_and_add_are(inplace, addmm):
    x = torch.randn(200, 6, dtype=torch.float64) * 3
    ref, net = Residual(False, False).double(), Residual(inplace, addmm).double()
    want, got = cert.swap_bound_per_sample(ref, x), cert.swap_bound_per_sample(net, x)
    for a, b in ((want.per_logit, got.per_logit), (want.float32, got.float32)):
        assert b is not None and torch.allclose(a, b, rtol=RULE_RTOL, atol=0)
    with torch.no_grad():  # sound, sample by sample: the swap moves each logit by at most its bound
        change = (net(x) - to_relu(copy.deepcopy(net), x[:2])(x)).abs()
    assert (change <= got.per_logit).all() and change.max() > 0.01 * got.per_logit.max()  # not vacuous


def test_export_check_derives_its_bound_on_at_most_bound_samples(tmp_path):
    model = to_gates(Net())[0].eval()
    x = torch.randn(10, 6)
    out = api.export_onnx(model, x[:2], tmp_path / "m.onnx", check_inputs=x, bound_samples=4)
    assert out["samples"] == 10 and out["samples_bounded"] == 4 and out["ort_bound_ratio"] <= 1
    full = api.export_onnx(model, x[:2], tmp_path / "m.onnx", check_inputs=x, bound_samples=None)
    assert full["samples_bounded"] == 10 and export_mod.BOUND_SAMPLES >= 500  # the docs' 500 check inputs, all bounded
