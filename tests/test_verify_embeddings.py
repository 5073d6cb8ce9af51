"""A language model verified from its embeddings, as the verifier's refusal of token ids says to: a wrapper that passes
`inputs_embeds` to a Hugging Face LLaMA is read (its unused nn.Embedding is not its input), its causal mask's constants
(-inf, or float32's lowest as eager attention writes it) are read as constants (the masked entries are 0 after the
softmax), the read graph computes what onnxruntime computes, CROWN's bounds contain every sampled output, and
`api.verify` answers with no `OutOfDomain`."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from analysis.verification.bounds import Bounder, Spec
from analysis.verification.ops.base import UnsupportedModel
from analysis.verification.readers import from_onnx, from_torch
from pipeline.extras import import_transformers
from quantize import ort as ort_util
from quantize.export import save, to_onnx

TOKENS, HIDDEN = 6, 16
READ_TOL = 2e-5  # the graph in float64 against onnxruntime in float32, relative to the logits' size
SAMPLE_TOL = 1e-5  # onnxruntime's float32 outputs against float64 bounds


class FromEmbeddings(nn.Module):
    """The last token's logits of a causal LM given its embedded tokens."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, embeds):
        return self.lm(inputs_embeds=embeds).logits[:, -1]


def _llama(attn: str) -> nn.Module:
    transformers = import_transformers()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    cfg._attn_implementation = attn
    return transformers.LlamaForCausalLM(cfg).eval()


def _embeds(lm: nn.Module, n: int, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(0, 32, (n, TOKENS), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return lm.model.embed_tokens(ids)


def _export(model: nn.Module, path):
    proto, _ = to_onnx(copy.deepcopy(model).float(), torch.zeros(1, TOKENS, HIDDEN), opset=20, simplify=True,
                       dynamic_batch=True)
    save(proto, path)
    return proto


def _ort(path, x: np.ndarray) -> np.ndarray:
    sess = ort_util.session(path)
    return sess.run(None, {sess.get_inputs()[0].name: np.asarray(x, dtype=np.float32)})[0].astype(np.float64)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_an_embedding_input_reads_with_its_mask_as_constants_and_crown_contains_every_sample(attn, tmp_path, monkeypatch):
    from analysis.verification.ops.softmax import ExpSums

    lm = _llama(attn)
    model = FromEmbeddings(lm).eval()
    path = tmp_path / "llama.onnx"
    proto = _export(model, path)
    masks = [float(np.min(np.frombuffer(n.attribute[0].t.raw_data, np.float32))) for n in proto.graph.node
             if n.op_type == "Constant" and n.attribute[0].t.data_type == 1 and n.attribute[0].t.raw_data]
    assert min(masks) <= -1e30  # the graph does add a mask constant: -inf or float32's lowest
    x = _embeds(lm, 8)
    ref = _ort(path, x.numpy())
    for min_diffs in (10**9, 0):  # the softmax's differences as a layer, and as ExpSums
        monkeypatch.setattr(ExpSums, "MIN_DIFFS", min_diffs)
        net = from_onnx(proto)
        got = net.forward(x.reshape(len(x), -1).double()).numpy()
        np.testing.assert_allclose(got, ref, atol=READ_TOL * (1 + np.abs(ref).max()), rtol=0)
        x0 = x[0].reshape(-1).double().numpy()
        eps = 1e-3  # the embeddings are ~0.02 in size (LLaMA's init): 5% of them
        lb, ub = x0 - eps, x0 + eps
        b = Bounder(net, lb, ub)
        b.crown()
        K = net.num_outputs
        low = b.spec_bounds(Spec(np.concatenate([np.eye(K), -np.eye(K)]), np.zeros(2 * K))).numpy()
        rng = np.random.default_rng(0)
        pts = np.concatenate([rng.uniform(lb, ub, (500, lb.size)), np.where(rng.random((500, lb.size)) < 0.5, lb, ub)])
        y = _ort(path, pts.reshape(-1, TOKENS, HIDDEN))
        slack = SAMPLE_TOL * (1 + np.abs(y).max())
        assert np.all(y >= low[:K] - slack) and np.all(y <= -low[K:] + slack)
        assert np.all(-low[K:] - low[:K] < 50 * (y.max(0) - y.min(0)) + 1e-6)  # not vacuous


def test_token_ids_into_an_embedding_are_still_refused_naming_it():
    with pytest.raises(UnsupportedModel, match="takes token ids .*'model.embed_tokens'"):
        from_torch(_llama("sdpa"), (TOKENS,))


@pytest.mark.slow  # ~13 s: the read and CROWN's soundness on the same graph are in the fast suite above
def test_api_verify_from_embeddings_answers_with_no_out_of_domain():
    from analysis import api

    lm = _llama("sdpa")
    model = FromEmbeddings(lm).eval()
    x = _embeds(lm, 3)
    with torch.no_grad():
        y = model(x).argmax(-1)
    out = api.verify(model, (x, y), epsilons=[1e-3], timeout_s=10, progress=False)
    assert len(out["rows"]) == 3
    for row in out["rows"]:
        assert row["result"] in ("sat", "unsat", "timeout", "unknown"), row
        assert "OutOfDomain" not in (row.get("message") or ""), row["message"]
    assert any(row["result"] == "unsat" for row in out["rows"])


def _masked_softmax_graph(mask_value: float, masked_weight: float | None, T: int = 4):
    """softmax(reshape(x W, T×T) + mask) over the last axis, the mask `mask_value` above the diagonal (a causal mask);
    `masked_weight`: the masked scores' weights all that (the kept ones stay N(0, 1))."""
    from onnx import TensorProto, helper, numpy_helper

    from _onnx import make_model

    rng = np.random.default_rng(0)
    W = rng.standard_normal((T, T * T)).astype(np.float32)
    upper = np.triu(np.ones((T, T), dtype=bool), 1)
    if masked_weight is not None:
        W[:, upper.reshape(-1)] = masked_weight
    mask = np.where(upper, np.float32(mask_value), np.float32(0)).astype(np.float32)
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(mask, "mask"),
             numpy_helper.from_array(np.array([1, T, T], np.int64), "square"),
             numpy_helper.from_array(np.array([1, T * T], np.int64), "flat")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["s"]), helper.make_node("Reshape", ["s", "square"], ["s2"]),
             helper.make_node("Add", ["s2", "mask"], ["a"]),
             helper.make_node("Softmax", ["a"], ["p"], axis=-1, name="attn/Softmax"),
             helper.make_node("Reshape", ["p", "flat"], ["y"])]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T * T])], inits)
    return make_model(graph, 17)


def _ort_proto(proto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"x": row[None].astype(np.float32)})[0] for row in x]).astype(np.float64)


def test_a_masked_softmax_whose_mask_outweighs_its_scores_reads_soundly():
    T = 4
    proto = _masked_softmax_graph(float(np.finfo(np.float32).min), None, T)
    net = from_onnx(proto)
    x0 = np.linspace(-1.0, 1.0, T)
    lb, ub = x0 - 0.5, x0 + 0.5
    b = Bounder(net, lb, ub)
    b.crown()
    K = T * T
    low = b.spec_bounds(Spec(np.concatenate([np.eye(K), -np.eye(K)]), np.zeros(2 * K))).numpy()
    rng = np.random.default_rng(1)
    pts = np.concatenate([rng.uniform(lb, ub, (1000, T)), np.where(rng.random((1000, T)) < 0.5, lb, ub)])
    y = _ort_proto(proto, pts)
    assert np.all(y >= low[:K] - SAMPLE_TOL) and np.all(y <= -low[K:] + SAMPLE_TOL)
    upper = np.triu(np.ones((T, T), dtype=bool), 1).reshape(-1)
    assert np.all(low[:K][upper] == 0) and np.all(-low[K:][upper] == 0)  # the masked entries: exactly 0


def test_a_masked_softmax_whose_scores_can_outweigh_its_mask_is_refused_naming_it():
    from analysis.verification.ops.base import OutOfDomain
    from analysis.verification.problem import Budget, Problem
    from analysis.verification.registry import get_verifier
    from analysis.verification.vnnlib import robustness_spec

    T = 4
    proto = _masked_softmax_graph(-1e30, 2e30, T)  # a masked score reaches 2e30 · Σx: past its -1e30 constant
    net = from_onnx(proto)
    x0 = np.full(T, 1.0)
    lb, ub = x0 - 0.5, x0 + 0.5
    # the premise fails for real: onnxruntime gives a masked entry most of its row there, where 0 was read
    upper = np.triu(np.ones((T, T), dtype=bool), 1).reshape(-1)
    assert _ort_proto(proto, x0[None])[0][upper].max() > 0.5
    with pytest.raises(OutOfDomain, match=r"^Softmax \(attn/Softmax\): its mask's constants do not provably outweigh"):
        Bounder(net, lb, ub)
    res = get_verifier("crown").run(Problem([robustness_spec(x0, 0.5, -10.0, 10.0, 0, T * T)], network=net), Budget(20.0))
    assert res.status == "unknown" and "OutOfDomain: Softmax (attn/Softmax)" in res.message, res.message
    assert len(res.message.splitlines()) == 1
