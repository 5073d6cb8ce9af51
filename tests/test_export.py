"""Export: the ONNX graphs match PyTorch, are self-contained, and have the structure we chose."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from quantize import export as ex
from quantize import ort as ort_util
from quantize import rounding
from pipeline.stages import export as export_stage

from _digits import digits, make_run, trained

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
def test_onnxruntime_is_within_float32_rounding_at_any_batch_size(case, nets, exported):
    net, _ = nets[case]
    path, _, _ = exported[case]
    sess = ort_util.session(path)
    x = digits().val.x
    for n in (1, 7, len(x)):  # dynamic batch axis: sizes other than the traced one (2)
        got = sess.run(None, {ort_util.INPUT: x[:n].numpy()})[0]
        b = rounding.forward_bound(net, x[:n])
        assert got.shape == b.reference.shape
        assert (np.abs(got - b.reference) <= b.bound).all(), f"{case} batch {n}"
    check = ex.compare(path, net, x)
    assert check["argmax_agreement"] == 1.0 and check["ort_bound_ratio"] <= 1 and check["torch_bound_ratio"] <= 1
    assert check["outputs_checked"] == check["outputs"] == 10 and check["unmodelled_ops"] == {}


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
    assert ex.compare(tmp_path / "m.onnx", net, digits().val.x)["ort_bound_ratio"] <= 1


def test_compare_fails_loudly_on_a_wrong_graph(nets, exported):
    other, _ = nets[("gelu", "mlp")]
    with pytest.raises(ex.ExportError, match="computes another function"):
        ex.compare(exported[("relu", "mlp")][0], other, digits().val.x)


WEIGHT_CHANGE = 1e-3  # relative change of one weight that the check must see


@pytest.mark.parametrize("case", [("relu", "mlp"), ("lambda_gelu", "cnn")], ids=lambda c: "-".join(c))
def test_compare_fails_loudly_on_one_changed_weight(case, nets, exported, tmp_path):
    # One weight of the output layer off by 0.1%: far below what the argmax or a fixed tolerance would notice
    net, _ = nets[case]
    proto = onnx.load(str(exported[case][0]))
    last = [n for n in proto.graph.node if n.op_type == "Gemm"][-1]
    init = next(t for t in proto.graph.initializer if t.name == last.input[1])
    w = onnx.numpy_helper.to_array(init).copy()
    k, j = np.unravel_index(np.abs(w).argmax(), w.shape)
    w[k, j] *= 1 + WEIGHT_CHANGE
    init.CopyFrom(onnx.numpy_helper.from_array(w, init.name))
    ex.save(proto, tmp_path / "changed.onnx")
    with pytest.raises(ex.ExportError, match="computes another function"):
        ex.compare(tmp_path / "changed.onnx", net, digits().val.x)


def test_a_folded_normalization_that_rounds_otherwise_than_pytorch_passes(tmp_path):
    # The failure: onnxruntime (a normalization folded into the first Gemm) and PyTorch differed by
    # more than a fixed tolerance, though onnxruntime was the closer one to float64. Inputs far from 0
    # relative to their spread make the folded bias cancel the folded product, so the two round apart.
    from _modules import Affine

    torch.manual_seed(0)
    offset, spread = 100.0, 0.5
    net = torch.nn.Sequential(Affine(1 / spread, -offset / spread), torch.nn.Linear(16, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 10)).eval()
    x = offset + spread * torch.randn(512, 16)
    folded = ex.fold_normalization(net, (16,))
    proto, _ = ex.to_onnx(folded, x[:2], OPSET)
    ex.save(proto, tmp_path / "folded.onnx")
    check = ex.compare(tmp_path / "folded.onnx", net, x)
    old_tolerance = 1e-5 + 1e-6 * check["max_abs_logit"]  # what the check allowed between the two engines before
    assert check["max_abs_diff"] > old_tolerance, check
    assert check["ort_bound_ratio"] <= 1 and check["torch_bound_ratio"] <= 1


def test_export_stage(nets, tmp_path):
    run = make_run(tmp_path, {"lambda_gelu": nets[("lambda_gelu", "mlp")], "relu": nets[("relu", "mlp")]})
    result = export_stage.run_export(run.cfg, run)
    saved = json.loads(run.file("export", "export.json").read_text())
    assert saved["opset"] == OPSET and saved["exporter"] == ex.EXPORTER
    assert saved["atol"] == ex.FP32_ATOL == 0 and saved["rtol"] == ex.FP32_RTOL == 0
    # The ReLU baseline has no smooth form; λ-GELU has both.
    assert {v: sorted(f) for v, f in saved["models"].items()} == {"lambda_gelu": ["relu", "smooth"], "relu": ["relu"]}
    for forms in saved["models"].values():
        for entry in forms.values():
            assert entry["ort_bound_ratio"] <= 1 and entry["torch_bound_ratio"] <= 1
            assert entry["argmax_agreement"] == 1.0
            assert (run.path / entry["path"]).stat().st_size == entry["bytes"]
            assert entry["samples"] == len(digits().val)
    assert saved["models"]["lambda_gelu"]["relu"]["ops"]["Relu"] == 2
    assert result["models"] == saved["models"]
    # every form a later stage reads, written here and declared: the stage's directory holds exactly those files
    assert saved["files"] == export_stage.FILES
    want = {"export/export.json"}
    for v, forms in saved["models"].items():
        for form, entry in forms.items():
            want.add(entry["path"])
            folded = entry["folded"]  # the digits MLPs start with their normalization and a Linear: it folds
            assert folded["path"].endswith(export_stage.FILES["folded"]) and folded["into"]
            assert folded["check"]["ort_bound_ratio"] <= 1 and folded["check"]["argmax_agreement"] == 1.0
            assert folded["ops"]["Gemm"] == entry["ops"]["Gemm"]  # the prologue folded away, the layers kept
            assert sum(folded["ops"].values()) < sum(entry["ops"].values()), (folded["ops"], entry["ops"])
            want.add(folded["path"])
            if form == "relu":
                assert entry["verifiers"]["path"].endswith(export_stage.FILES["verifiers"])
                assert entry["verifiers"]["ort_bound_ratio"] <= 1 and entry["verifiers"]["verifier_form"]
                want.add(entry["verifiers"]["path"])
            else:
                assert "verifiers" not in entry
    have = {p.relative_to(run.path).as_posix() for p in run.file("export").rglob("*") if p.is_file()}
    assert have == want
    md = export_stage.report_section(run.cfg, run)
    assert "| relu | relu (verifiers) |" in md and "| lambda_gelu | smooth (folded) |" in md


def test_multihead_attention_exports_in_eval_mode_and_matches(tmp_path):
    # Eval mode takes nn.MultiheadAttention's fused fast path, which the TorchScript exporter cannot export
    from _modules import TinyViT

    torch.manual_seed(0)
    net = TinyViT().eval()
    x = digits().val.x[:64]
    proto, _ = ex.to_onnx(net, x[:2], OPSET)
    ex.save(proto, tmp_path / "vit.onnx")
    assert torch.backends.mha.get_fastpath_enabled(), "export restores the fast path"
    check = ex.compare(tmp_path / "vit.onnx", net, x)
    assert check["argmax_agreement"] == 1.0 and "MatMul" in ort_util.op_counts(proto)
