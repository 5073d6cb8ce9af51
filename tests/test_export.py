"""Export: the ONNX graphs match PyTorch, are self-contained, and have the structure we chose."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from quantize import export as ex
from quantize import ort as ort_util

from _digits import digits, make_run, trained

FP32_ATOL = ex.FP32_ATOL  # 1e-5: onnxruntime vs PyTorch on fp32 logits
OPSET = 20

CASES = [("lambda_gelu", "mlp"), ("gelu", "mlp"), ("relu", "mlp"), ("lambda_gelu", "cnn"), ("relu", "cnn")]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def nets():
    return {case: trained(*case, epochs=3) for case in CASES}


@pytest.fixture(scope="module")
def exported(nets, tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx")
    out = {}
    for (act, model), (net, spec) in nets.items():
        meta = ex.metadata_for({"spec": spec}, act, "smooth", digits().info)
        proto, facts = ex.to_onnx(net, digits().val.x[:2], OPSET, metadata=meta)
        path = d / f"{act}-{model}.onnx"
        ex.save(proto, path)
        out[(act, model)] = (path, proto, facts)
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_onnxruntime_matches_pytorch_at_any_batch_size(case, nets, exported):
    net, _ = nets[case]
    path, _, _ = exported[case]
    sess = ort_util.session(path)
    x = digits().val.x
    for n in (1, 7, len(x)):  # dynamic batch axis: sizes other than the traced one (2)
        with torch.no_grad():
            ref = net(x[:n]).numpy()
        got = sess.run(None, {ort_util.INPUT: x[:n].numpy()})[0]
        assert got.shape == ref.shape
        err = np.abs(got - ref).max()
        assert err <= FP32_ATOL, f"{case} batch {n}: max |Δ| = {err:.3g}"
    check = ex.compare(path, net, x, FP32_ATOL, rtol=0)  # small logits here: the bare absolute bound holds
    assert check["max_abs_diff"] <= FP32_ATOL and check["argmax_agreement"] == 1.0
    # Both sides are float32 roundings of the same float64 function.
    assert check["ort_vs_fp64"] <= FP32_ATOL and check["torch_vs_fp64"] <= FP32_ATOL


def test_graph_structure(exported):
    # Normalization is inside the graph (inputs in natural units): Mul, Add on the raw input first.
    for case, (_, proto, facts) in exported.items():
        first = proto.graph.node[0]
        assert first.op_type == "Mul" and ort_util.INPUT in first.input, case
        assert proto.graph.node[1].op_type == "Add"
        assert proto.opset_import[0].version == OPSET
        assert facts["nodes"] <= facts["nodes_traced"]
        meta = {p.key: p.value for p in proto.metadata_props}
        assert json.loads(meta["input_low"]) == 0.0 and json.loads(meta["input_high"]) == 1.0
        assert json.loads(meta["input_shape"]) == [1, 8, 8] and meta["activation"] == case[0]
        dim0 = proto.graph.input[0].type.tensor_type.shape.dim[0]
        assert dim0.dim_param == "batch"
    ops = {case: ort_util.op_counts(p) for case, (_, p, _) in exported.items()}
    sites = 2  # MLP hidden [64, 32]
    # λ-GELU at opset 20 = Mul → Gelu → Div per site (native Gelu, no Erf expansion)
    assert ops[("lambda_gelu", "mlp")] == {"Mul": 1 + sites, "Add": 1, "Flatten": 1, "Gemm": 3, "Gelu": sites, "Div": sites}
    assert ops[("gelu", "mlp")] == {"Mul": 1, "Add": 1, "Flatten": 1, "Gemm": 3, "Gelu": sites}
    assert ops[("relu", "mlp")] == {"Mul": 1, "Add": 1, "Flatten": 1, "Gemm": 3, "Relu": sites}
    # CNN [8, 16] + fc 32: three activation sites, two convs, two Gemms
    assert ops[("relu", "cnn")] == {"Mul": 1, "Add": 1, "Conv": 2, "Relu": 3, "Flatten": 1, "Gemm": 2}
    assert "Erf" not in ops[("lambda_gelu", "cnn")]


def test_single_file_and_full_check(exported):
    for path, _, _ in exported.values():
        proto = onnx.load(str(path), load_external_data=False)
        assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
        onnx.checker.check_model(str(path), full_check=True)
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(f"{a}-{m}.onnx" for a, m in CASES)


def test_lower_opset_expands_gelu_to_erf_and_still_matches(nets, tmp_path):
    net, _ = nets[("lambda_gelu", "mlp")]
    proto, _ = ex.to_onnx(net, digits().val.x[:2], 17)
    ops = ort_util.op_counts(proto)
    assert "Gelu" not in ops and ops["Erf"] == 2
    ex.save(proto, tmp_path / "m.onnx")
    assert ex.compare(tmp_path / "m.onnx", net, digits().val.x, FP32_ATOL, rtol=0)["max_abs_diff"] <= FP32_ATOL


def test_compare_fails_loudly_on_a_wrong_graph(nets, exported):
    other, _ = nets[("gelu", "mlp")]
    with pytest.raises(ex.ExportError, match="differ by"):
        ex.compare(exported[("relu", "mlp")][0], other, digits().val.x, FP32_ATOL)


def test_export_stage(nets, tmp_path):
    run = make_run(tmp_path, {"lambda_gelu": nets[("lambda_gelu", "mlp")], "relu": nets[("relu", "mlp")]})
    result = ex.run_export(run.cfg, run)
    saved = json.loads(run.file("export", "export.json").read_text())
    assert saved["opset"] == OPSET and saved["exporter"] == ex.EXPORTER
    assert saved["atol"] == FP32_ATOL and saved["rtol"] == ex.FP32_RTOL
    # The ReLU baseline has no smooth form; λ-GELU has both.
    assert {v: sorted(f) for v, f in saved["models"].items()} == {"lambda_gelu": ["relu", "smooth"], "relu": ["relu"]}
    for forms in saved["models"].values():
        for entry in forms.values():
            assert entry["max_abs_diff"] <= entry["tolerance"] == FP32_ATOL + ex.FP32_RTOL * entry["max_abs_logit"]
            assert entry["argmax_agreement"] == 1.0
            assert (run.path / entry["path"]).stat().st_size == entry["bytes"]
            assert entry["samples"] == len(digits().val)
    assert saved["models"]["lambda_gelu"]["relu"]["ops"]["Relu"] == 2
    assert result["models"] == saved["models"]


class TinyViT(torch.nn.Module):
    """Patches → tokens → pre-norm self-attention (nn.MultiheadAttention) and a GELU MLP, both residual →
    mean pool → logits: the layout of a small ViT."""

    def __init__(self, dim: int = 16, heads: int = 2, classes: int = 10):
        super().__init__()
        self.patch = torch.nn.Conv2d(1, dim, 4, stride=4)
        self.pos = torch.nn.Parameter(0.1 * torch.randn(1, 4, dim))
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, x):
        h = self.patch(x.reshape(-1, 1, 8, 8)).flatten(2).transpose(1, 2) + self.pos
        a = self.norm1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.mlp(self.norm2(h))
        return self.head(h.mean(1))


def test_multihead_attention_exports_in_eval_mode_and_matches(tmp_path):
    # Eval mode takes nn.MultiheadAttention's fused fast path, which the TorchScript exporter cannot export
    torch.manual_seed(0)
    net = TinyViT().eval()
    x = digits().val.x[:64]
    proto, _ = ex.to_onnx(net, x[:2], OPSET)
    ex.save(proto, tmp_path / "vit.onnx")
    assert torch.backends.mha.get_fastpath_enabled(), "export restores the fast path"
    check = ex.compare(tmp_path / "vit.onnx", net, x)
    assert check["argmax_agreement"] == 1.0 and "MatMul" in ort_util.op_counts(proto)
