"""`analysis.api.check`'s verdict says what it means, in both directions a first user hit: a model whose every
certificate was refused is not reported as passing, and a model whose certificate held is not reported as failing
because a closed-form prediction (a diagnostic of the pre-activation density) missed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from analysis import api
from pipeline import to_gates
from pipeline.activations import GELU, LambdaGELU, gate_of, lambda_gelu
from pipeline.extras import import_timm, import_transformers


class TinyViT(nn.Module):
    """Tokens → nn.MultiheadAttention → a λ-GELU feed-forward → pool → logits (the trial's ViT, smaller); its pool is a
    log-sum-exp (a soft max pool), which the certificate has no rule for."""

    def __init__(self, dim: int = 8, tokens: int = 4):
        super().__init__()
        self.tokens, self.dim = tokens, dim
        self.embed = nn.Linear(dim, dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, 16), LambdaGELU(nn.Parameter(torch.zeros(1)), 0.1), nn.Linear(16, dim))
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        h = self.embed(x.view(len(x), self.tokens, self.dim))
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.head(torch.logsumexp(h + self.ff(h), 1))


def _hardened_gates(model: nn.Module, lam: float = 160.0) -> nn.Module:
    """Every gate frozen at λ (what the Hardener's annealing ends with)."""
    for m in model.modules():
        if gate_of(m) is not None and hasattr(m, "freeze"):
            m.freeze(torch.tensor([lam]))
    return model.eval()


def test_every_certificate_refused_is_refused_not_a_pass():
    torch.manual_seed(0)
    model = _hardened_gates(TinyViT())
    x = torch.randn(64, 32)
    out = api.check(model, (x, torch.zeros(64, dtype=torch.long)))
    cert = out["certificate"]
    assert all(cert[k]["status"] == "refused" for k in ("float32", "float32_global"))
    assert out["verdict"]["certificate"] == "refused" and out["verdict"]["statements"] == []
    assert "float32" in out["verdict"]["why"] and "pass" not in out
    # the verdict as fields, the same as the dict says
    assert out.verdict == "refused" and out.why == out["verdict"]["why"] and out.statements == [] and not out.certified


def test_a_held_certificate_holds_whatever_the_predictions_say():
    """GELU at λ = 1: the density of N(0, 1) pre-activations is not flat over |x| < 3, so both closed-form
    predictions are off; the swap's float32 change stays within its certified bound all the same."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 32), GELU(), nn.Linear(32, 4)).eval()
    x = torch.randn(400, 6)
    out = api.check(model, (x, torch.zeros(400, dtype=torch.long)))
    assert out["certificate"]["float32"]["status"] == "sound" and out["certificate"]["float32"]["pass"]
    assert out["verdict"]["certificate"] == "holds" and "float32" in out["verdict"]["statements"]
    assert out.verdict == "holds" and out.certified and "float32" in out.statements and "held" in out.why
    assert not out["predictions"]["pass"] and {o["check"] for o in out["predictions"]["off"]} == {"gate_l1", "act_l1"}


def test_a_holding_certificate_that_keeps_no_prediction_says_so(capsys):
    """Two equal logits: no sample has a top-1 margin, so a sound bound that holds still keeps no prediction; the
    verdict says so in its reason and api.check prints it, where a bare "holds" would read as a guarantee."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 32), GELU(), nn.Linear(32, 2)).eval()
    with torch.no_grad():
        model[2].weight[1], model[2].bias[1] = model[2].weight[0], model[2].bias[0]
    x = torch.randn(200, 6)
    out = api.check(model, (x, torch.zeros(200, dtype=torch.long)))
    assert out.verdict == "holds" and out.certified_fraction == 0 and "proves no prediction unchanged" in out.why
    assert "holds but proves no prediction unchanged" in capsys.readouterr().out
    hardened = LambdaGELU(nn.Parameter(torch.full((1,), 19.9)), 0.1)  # λ = 1 + softplus(199) = 200
    kept = api.check(nn.Sequential(nn.Linear(6, 32), hardened, nn.Linear(32, 4)).eval(),
                     (x, torch.zeros(200, dtype=torch.long)))
    assert kept.verdict == "holds" and kept.certified_fraction > 0 and "no prediction" not in kept.why


class WrongLambda(LambdaGELU):
    """Reports λ but computes x·Φ(λx/4): farther from ReLU than c/λ."""

    def forward(self, x):
        return lambda_gelu(x, self._lam_for(x) / 4)


def test_a_gate_that_breaks_the_premise_fails():
    torch.manual_seed(2)
    bug = WrongLambda(nn.Parameter(torch.zeros(1)), 0.1)
    bug.freeze(torch.tensor([160.0]))
    model = nn.Sequential(nn.Linear(4, 32), bug, nn.Linear(32, 3)).eval()
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.fill_(-0.7517915 * 4 / 160.0)  # where x·Φ(λx/4) is farthest from ReLU
    x = torch.randn(32, 4)
    out = api.check(model, (x, torch.zeros(32, dtype=torch.long)))
    assert out["verdict"]["certificate"] == "fails" and "c/λ" in out["verdict"]["why"]
    assert out.verdict == "fails" and not out.certified and "c/λ" in out.why


def test_a_refused_certificate_is_one_printed_line_giving_its_reason_once(capsys):
    """The TinyViT's log-sum-exp after a gate has no rule: api.check prints one line saying the certificate is refused, the
    reason (which names `logsumexp` and the module) appears once for the statements it refuses, and it does not point into
    the project's own source."""
    torch.manual_seed(0)
    model = _hardened_gates(TinyViT())
    x = torch.randn(16, 32)
    out = api.check(model, (x, torch.zeros(16, dtype=torch.long)))
    why = out["verdict"]["why"]
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("api.check:")]
    assert len(lines) == 1 and "refused" in lines[0] and why in lines[0]
    assert why.count("`logsumexp`") == 1 and "float32, float32_global" in why
    assert "analysis/theory" not in why


def test_a_model_with_nothing_to_swap_has_no_verdict_and_says_why():
    out = api.check(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), (torch.randn(8, 4), torch.zeros(8, dtype=torch.long)))
    assert out.verdict is None and not out.certified and "unchanged" in out.why


def _tiny_llama() -> nn.Module:
    transformers = import_transformers()
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=16))


def test_a_tiny_llama_gets_the_float32_certificate(capsys):
    """LlamaRMSNorm casts to float32 and takes x·rsqrt(mean(x²) + eps); SwiGLU multiplies two values that both move;
    attention follows the first layer's gates: each has a rule, so the per-sample float32 statement is proved and holds
    (the global one is refused: a product of two moving values has no global bound)."""
    model, _ = to_gates(_tiny_llama())
    model = _hardened_gates(model, 200.0)
    ids = torch.randint(0, 32, (8, 6), generator=torch.Generator().manual_seed(0))
    out = api.check(model, (ids, torch.zeros(8, dtype=torch.long)))
    assert out.verdict == "holds" and out.statements == ["float32"], out.why
    assert out["certificate"]["float32"]["pass"] and "product" in out["certificate"]["global"]["reason"]
    assert not [l for l in capsys.readouterr().out.splitlines() if l.startswith("api.check:")]


@pytest.mark.slow  # ~7 s: the LLaMA above covers the same code path in the fast suite
def test_efficientnet_b0_gets_the_float32_certificate():
    """timm's efficientnet_b0 (random weights, 32×32): its squeeze-excite blocks (mean over the image, x·σ(...)) and
    head have rules, so the per-sample float32 statement is proved and holds."""
    torch.manual_seed(0)
    model, _ = to_gates(import_timm().create_model("efficientnet_b0", pretrained=False, num_classes=3))
    model = _hardened_gates(model, 200.0)
    x = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    out = api.check(model, (x, torch.zeros(4, dtype=torch.long)))
    assert out.verdict == "holds" and out.statements == ["float32"], out.why


def test_the_growth_note_credits_each_rise_of_the_largest_box_to_its_function():
    """A walk's trace (function, module, largest input box, largest output box): the largest box so far goes 0.1 →
    0.5 (linear ×5) → 2.0 (linear ×4; the relu's 0.4 raises nothing) → 4.0 (mul ×2), so linear gets ×20 in 2 steps
    and mul ×2, and the factors multiply to the whole growth 4.0/0.1."""
    from analysis.theory.certificate.interpreter import growth_note

    trace = [("conv2d", "a", 0.0, 0.0), ("linear", "a", 0.1, 0.5), ("relu", "b", 0.5, 0.4), ("linear", "c", 0.4, 2.0),
             ("mul", "d", 2.0, 4.0), ("add", "e", 4.0, 3.0)]
    note = growth_note(trace, 4.0)
    assert note.startswith("its boxes grow from 0.1 (the first gate's deviation) to 4: ")
    assert "×20 at `linear` (2 steps, ×4.47 each on average), ×2 at `mul` (1 step, ×2 each on average)" in note
    assert "relu" not in note and "add" not in note and growth_note(trace, 0.05) is None


def test_a_vacuous_bound_names_the_functions_its_boxes_grow_through(capsys):
    """Eight GELU layers converted at λ = 1: a gate deviates from ReLU by up to 0.17, the LayerNorm after the first has
    no signed rule (the change restarts from its box there) and every Linear after it carries the box as |W|·d, so the
    per-sample bound is far above every margin; api.check's line says it grows at `linear`."""
    torch.manual_seed(0)
    layers = [nn.Linear(6, 32), nn.GELU(), nn.LayerNorm(32)]
    for _ in range(7):
        layers += [nn.Linear(32, 32), nn.GELU()]
    model, _ = to_gates(nn.Sequential(*layers, nn.Linear(32, 3)).eval())
    x = torch.randn(100, 6)
    out = api.check(model.eval(), (x, torch.zeros(100, dtype=torch.long)))
    assert out.verdict == "holds" and out.certified_fraction == 0
    growth = out["certificate"]["per_sample"]["growth"]
    assert "at `linear` (8 steps" in growth and f"the per-sample bound ({out['certificate']['per_sample']['bound_max']:.2g}): {growth}" in out.why
    assert growth in capsys.readouterr().out
