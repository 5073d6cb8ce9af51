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
