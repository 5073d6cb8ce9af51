"""The models people already have, tiny: timm's ConvNeXt, ViT and ResNet (SiLU), Hugging Face's BERT and GPT-2 (its
default `gelu_new`), built from configs with random weights (no hub), and the data each learns in a few steps. Shared by
tests/test_zoo.py and benchmarks/zoo.py. `zoo_or_skip` skips where the `models` extra is not installed."""

from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits

from pipeline.extras import import_timm, import_transformers

VOCAB, TOKENS, CLASSES = 32, 8, 3
FAMILIES = ("convnext", "vit", "resnet_silu", "bert", "gpt2")


def zoo_or_skip():
    """(timm, transformers), or a skip naming the extra."""
    try:
        return import_timm(), import_transformers()
    except ImportError as exc:
        pytest.skip(f"{exc}")


def build(name: str) -> torch.nn.Module:
    """The family's model as its library builds it (its own activation classes), tiny."""
    timm, transformers = import_timm(), import_transformers()
    torch.manual_seed(0)
    if name == "convnext":  # timm's GELU module (act_layer='gelu'), in-place adds none, LayerNorm2d
        return timm.create_model("convnext_atto", pretrained=False, num_classes=10, depths=(1, 1, 1, 1), dims=(8, 16, 24, 32))
    if name == "vit":  # nn.GELU, attention, a class token
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32, patch_size=8,
                                 embed_dim=32, depth=2, num_heads=2)
    if name == "resnet_silu":  # nn.SiLU(inplace=True), `x += shortcut`, BatchNorm
        return timm.create_model("resnet18", pretrained=False, num_classes=10, act_layer="silu", layers=(1, 1, 1, 1),
                                 channels=(8, 16, 32, 64))
    if name == "bert":  # GELUActivation holding F.gelu, a Tanh pooler
        cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                      vocab_size=VOCAB, max_position_embeddings=TOKENS, num_labels=CLASSES)
        return transformers.BertForSequenceClassification(cfg)
    if name == "gpt2":  # NewGELUActivation (the tanh formula), Conv1D (addmm)
        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=TOKENS,
                                      num_labels=CLASSES, pad_token_id=0, bos_token_id=1, eos_token_id=1)
        return transformers.GPT2ForSequenceClassification(cfg)
    raise ValueError(name)


def data(name: str, n: int = 768) -> tuple[torch.Tensor, torch.Tensor]:
    """Digits as 3×32×32 images for the vision models; token sequences whose class is the first token mod 3 (repeated
    last, where GPT-2 reads it; never the pad id 0) for the text models."""
    g = torch.Generator().manual_seed(0)
    if name in ("bert", "gpt2"):
        x = torch.randint(1, VOCAB, (n, TOKENS), generator=g)
        x[:, -1] = x[:, 0]
        return x, x[:, 0] % CLASSES
    xs, ys = load_digits(return_X_y=True)
    img = torch.tensor(xs[:n] / 16, dtype=torch.float32).reshape(-1, 1, 8, 8)
    img = torch.nn.functional.interpolate(img, size=32, mode="nearest").expand(-1, 3, -1, -1).contiguous()
    return img, torch.tensor(ys[:n])
