"""Model registry. Every model is an `nn.Sequential` that starts with `Normalize`, so it takes inputs in
natural units and exports to one self-contained graph; activations come from the activation registry.
Language models take token ids and have no `Normalize` (their data has no mean/std).

A checkpoint stores the `spec` dict that `build_model` takes, so it rebuilds its own model.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .activations import ACTIVATIONS, GateContext, build_activation
from .config import GateConfig, ModelConfig, check_choice, need

MakeAct = Callable[[int], nn.Module]  # channels -> activation module; act.expansion: outputs per input unit


class Normalize(nn.Module):
    """y = x·scale + shift (= (x − mean)/std). Mul/Add rather than Sub/Div: verifiers read it."""

    def __init__(self, mean: list[float], std: list[float], input_shape: tuple[int, ...]):
        super().__init__()
        mean_t = torch.tensor(mean, dtype=torch.float32)
        std_t = torch.tensor(std, dtype=torch.float32)
        # Broadcast over [N, C, H, W] (one value per channel) or [N, D] (one per feature).
        shape = (-1, 1, 1) if len(input_shape) == 3 else (-1,)
        self.input_shape = tuple(input_shape)  # the model's input, [C, H, W] or [D]: what `pipeline.probe` feeds it
        self.register_buffer("scale", (1.0 / std_t).reshape(shape))
        self.register_buffer("shift", (-mean_t / std_t).reshape(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


def mlp(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, act: MakeAct) -> list[tuple[str, nn.Module]]:
    layers: list[tuple[str, nn.Module]] = [("flatten", nn.Flatten())]
    width = math.prod(input_shape)
    for i, h in enumerate(cfg.hidden):
        layers += [(f"fc{i}", nn.Linear(width, h)), (f"act{i}", act(h))]
        width = h * act.expansion
    layers.append(("head", nn.Linear(width, num_classes)))
    return layers


def cnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, act: MakeAct) -> list[tuple[str, nn.Module]]:
    """3x3 convs, the 2nd and later with stride 2 (no pooling: every verifier reads strided Conv)."""
    if len(input_shape) != 3:
        raise ValueError(f"model.name=cnn needs image inputs (C, H, W), got shape {input_shape}; use model.name=mlp")
    c, h, w = input_shape
    layers: list[tuple[str, nn.Module]] = []
    for i, out in enumerate(cfg.channels):
        stride = 1 if i == 0 else 2
        layers += [(f"conv{i}", nn.Conv2d(c, out, 3, stride=stride, padding=1)), (f"act{i}", act(out))]
        c = out * act.expansion
        h, w = (h - 1) // stride + 1, (w - 1) // stride + 1
    n = len(cfg.channels)
    layers += [
        ("flatten", nn.Flatten()),
        ("fc", nn.Linear(c * h * w, cfg.cnn_hidden)),
        (f"act{n}", act(cfg.cnn_hidden)),
        ("head", nn.Linear(cfg.cnn_hidden * act.expansion, num_classes)),
    ]
    return layers


# ---------------------------------------------------------------------------------------------
# The paper's GPU models. A builder may return an nn.Module instead of a layer list; build_model
# then puts it after Normalize as `net` (or alone, for token inputs). Every activation site still
# comes from `act(channels)`, so λ-init by depth, hardening and the swap walker see them all.


def _single_width(act: MakeAct, model: str) -> None:
    if act.expansion != 1:
        raise ValueError(f"model.name={model} needs an activation with one output per input (a residual add "
                         f"fixes the width); this activation has expansion {act.expansion}")


class BasicBlock(nn.Module):
    """ResNet basic block: conv-bn-act-conv-bn, + shortcut, act (two activation sites)."""

    def __init__(self, cin: int, cout: int, stride: int, act: MakeAct):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.act1 = act(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
        self.act2 = act(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        return self.act2(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet18_cifar(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, act: MakeAct) -> nn.Module:
    """ResNet-18, CIFAR variant: 3x3 stride-1 stem, no max-pool, stages of 2 blocks at w, 2w, 4w, 8w
    (w = model.resnet_width; 64 in the paper), 17 activation sites."""
    if len(input_shape) != 3:
        raise ValueError(f"model.name=resnet18_cifar needs image inputs (C, H, W), got shape {input_shape}")
    _single_width(act, "resnet18_cifar")
    w = cfg.resnet_width
    layers: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(input_shape[0], w, 3, stride=1, padding=1, bias=False)),
        ("bn1", nn.BatchNorm2d(w)),
        ("act0", act(w)),
    ]
    cin = w
    for i, (mult, stride) in enumerate([(1, 1), (2, 2), (4, 2), (8, 2)]):
        cout = w * mult
        layers.append((f"layer{i + 1}", nn.Sequential(BasicBlock(cin, cout, stride, act), BasicBlock(cout, cout, 1, act))))
        cin = cout
    layers += [("pool", nn.AdaptiveAvgPool2d(1)), ("flatten", nn.Flatten()), ("head", nn.Linear(cin, num_classes))]
    return nn.Sequential(OrderedDict(layers))


class SelfAttention(nn.Module):
    """Multi-head self-attention; causal for the GPT. x: [B, T, D] -> [B, T, D]."""

    def __init__(self, dim: int, heads: int, dropout: float, causal: bool):
        super().__init__()
        self.heads, self.causal, self.dropout = heads, causal, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)  # 3 x [B, H, T, D/H]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(LN(x)), then x + FFN(LN(x)); the FFN's activation is the block's one site."""

    def __init__(self, cfg: ModelConfig, act: MakeAct, causal: bool):
        super().__init__()
        hidden = int(round(cfg.mlp_ratio * cfg.dim))
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.attn = SelfAttention(cfg.dim, cfg.heads, cfg.dropout, causal)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(OrderedDict([("fc1", nn.Linear(cfg.dim, hidden)), ("act", act(hidden)),
                                              ("fc2", nn.Linear(hidden * act.expansion, cfg.dim)),
                                              ("drop", nn.Dropout(cfg.dropout))]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class DeiT(nn.Module):
    """DeiT/ViT classifier without the distillation token: patches -> class token + positions ->
    blocks -> LN -> head on the class token."""

    def __init__(self, cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, act: MakeAct):
        super().__init__()
        c, h, w = input_shape
        p = cfg.patch_size
        if h % p or w % p:
            raise ValueError(f"model.patch_size={p} must divide the image size {h}x{w}")
        self.patch = nn.Conv2d(c, cfg.dim, p, stride=p)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        self.pos = nn.Parameter(torch.randn(1, 1 + (h // p) * (w // p), cfg.dim) * 0.02)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.Sequential(*[TransformerBlock(cfg, act, causal=False) for _ in range(cfg.depth)])
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)  # [B, N, D]
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.ln(self.blocks(self.drop(x)))
        return self.head(x[:, 0])


def deit_tiny(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, act: MakeAct) -> nn.Module:
    """DeiT-Tiny at the defaults (dim 192, depth 12, 3 heads, MLP ratio 4); one site per block."""
    if len(input_shape) != 3:
        raise ValueError(f"model.name=deit_tiny needs image inputs (C, H, W), got shape {input_shape}")
    return DeiT(cfg, input_shape, num_classes, act)


class GPT(nn.Module):
    """GPT-2 architecture (pre-norm, learned positions, tied input/output embedding).
    Token ids [B, T] -> next-token logits [B, T, V]."""

    def __init__(self, cfg: ModelConfig, context: int, vocab: int, act: MakeAct):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, cfg.dim)
        self.pos = nn.Embedding(context, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.Sequential(*[TransformerBlock(cfg, act, causal=True) for _ in range(cfg.depth)])
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, vocab, bias=False)
        self.head.weight = self.tok.weight
        for name, prm in self.named_parameters():  # GPT-2's init: N(0, 0.02), residual projections scaled by depth
            if name.endswith("weight") and prm.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg.depth) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(prm, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(prm)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.context:
            raise ValueError(f"sequence of {T} tokens is longer than the model's context {self.context} (data.seq_len)")
        x = self.drop(self.tok(idx) + self.pos(torch.arange(T, device=idx.device)))
        return self.head(self.ln(self.blocks(x)))


def gpt(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, act: MakeAct) -> nn.Module:
    """GPT on token ids: input_shape = (context,), num_classes = vocabulary size."""
    if len(input_shape) != 1:
        raise ValueError(f"model.name=gpt needs token sequences (T,), got shape {input_shape}; use a text data set")
    return GPT(cfg, input_shape[0], num_classes, act)


class PreActBlock(nn.Module):
    """Pre-activation residual block (He et al., 2016): BN → act → conv3x3 (stride) → BN → act → conv3x3,
    plus the block's input (through a 1x1 conv when the shape changes). Two activation sites; a linked
    activation doubles each conv's input channels, the residual sum keeps `cout`."""

    def __init__(self, cin: int, cout: int, stride: int, act: MakeAct):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.act1 = act(cin)
        self.conv1 = nn.Conv2d(cin * act.expansion, cout, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.act2 = act(cout)
        self.conv2 = nn.Conv2d(cout * act.expansion, cout, 3, stride=1, padding=1, bias=False)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.act1(self.bn1(x)))
        return self.conv2(self.act2(self.bn2(out))) + self.shortcut(x)


def preact_resnet(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, act: MakeAct) -> nn.Module:
    """The GELU analysis paper's testbed: a conv stem that widens the input, six pre-activation blocks
    (stride 2 in the 3rd and 5th), BN → act → global average pool → linear: 14 weight layers.
    Stage widths are `model.channels`, two blocks each (the paper's six blocks: three widths)."""
    if len(input_shape) != 3:
        raise ValueError(f"model.name=preact_resnet needs image inputs (C, H, W), got shape {input_shape}")
    w = cfg.channels
    layers: list[tuple[str, nn.Module]] = [("stem", nn.Conv2d(input_shape[0], w[0], 3, padding=1, bias=False))]
    cin = w[0]
    for i in range(2 * len(w)):
        stride = 2 if i > 0 and i % 2 == 0 else 1
        layers.append((f"block{i}", PreActBlock(cin, w[i // 2], stride, act)))
        cin = w[i // 2]
    layers += [("bn", nn.BatchNorm2d(cin)), ("act", act(cin)), ("pool", nn.AdaptiveAvgPool2d(1)),
               ("flatten", nn.Flatten()), ("head", nn.Linear(cin * act.expansion, num_classes))]
    return nn.Sequential(OrderedDict(layers))


MODELS: dict[str, Callable[..., list[tuple[str, nn.Module]] | nn.Module]] = {"mlp": mlp, "cnn": cnn,
          "resnet18_cifar": resnet18_cifar, "deit_tiny": deit_tiny, "gpt": gpt, "preact_resnet": preact_resnet}


# ---------------------------------------------------------------------------------------------
# Width matching for linked activations (model.width_match)

WIDTH_FIELDS = {"mlp": ("hidden",), "cnn": ("channels", "cnn_hidden"), "preact_resnet": ("channels",)}


def check_config(cfg: ModelConfig) -> None:
    check_choice("model.name", cfg.name, MODELS)
    need(cfg.width_match == "none" or cfg.name in WIDTH_FIELDS,
         f"model.width_match={cfg.width_match} needs one of the models {', '.join(WIDTH_FIELDS)}")
SQRT2 = math.sqrt(2.0)


def _scale_widths(cfg: ModelConfig, factor: float) -> ModelConfig:
    scale = lambda w: max(1, int(round(w * factor)))  # noqa: E731
    new = {f: [scale(w) for w in getattr(cfg, f)] if isinstance(getattr(cfg, f), list) else scale(getattr(cfg, f))
           for f in WIDTH_FIELDS[cfg.name]}
    return dataclasses.replace(cfg, width_match="none", **new)


def parameter_count(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, expansion: int) -> int:
    """Weights and biases of the model's layers (activation parameters such as λ or PReLU slopes
    not counted), built on the meta device: nothing is allocated."""
    ident = _ActFactory(lambda ch: nn.Identity(), expansion)
    with torch.device("meta"):
        built = MODELS[cfg.name](cfg, input_shape, num_classes, ident)
        mods = built if isinstance(built, nn.Module) else nn.ModuleList([m for _, m in built])
        return sum(p.numel() for p in mods.parameters())


def match_widths(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, expansion: int) -> ModelConfig:
    """Apply `model.width_match`; returns a config with the final widths (and width_match="none").

    - "sqrt2" / "inv_sqrt2": every hidden width times √2 / 1/√2, rounded (the linked-neurons paper's
      "√2" networks: a single activation widened to about a linked pair's parameter count);
    - "params": one common factor on every width, chosen so the parameter count is the closest to the
      counterpart at the given widths: a single activation matches its linked version, a linked pair
      its single one (√2 is exact only for square hidden-to-hidden layers).
    """
    if cfg.width_match == "none":
        return cfg
    if cfg.name not in WIDTH_FIELDS:
        raise ValueError(f"model.width_match={cfg.width_match} is not supported for model.name={cfg.name}; "
                         f"models with width matching: {', '.join(WIDTH_FIELDS)}")
    if cfg.width_match in ("sqrt2", "inv_sqrt2"):
        return _scale_widths(cfg, SQRT2 if cfg.width_match == "sqrt2" else 1 / SQRT2)
    target = parameter_count(cfg, input_shape, num_classes, 2 if expansion == 1 else 1)
    count = lambda f: parameter_count(_scale_widths(cfg, f), input_shape, num_classes, expansion)  # noqa: E731
    lo, hi = 1 / 8, 8.0  # count(f) is non-decreasing in f; bisect to the smallest f with count ≥ target
    for _ in range(50):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if count(mid) < target else (lo, mid)
    best = min((lo, hi), key=lambda f: abs(count(f) - target))
    return _scale_widths(cfg, best)


def make_spec(model_cfg: ModelConfig, activation: str, gate_cfg: GateConfig, info) -> dict[str, Any]:
    from dataclasses import asdict

    return {
        "model": asdict(model_cfg),
        "activation": activation,
        "gate": asdict(gate_cfg),
        "input_shape": list(info.input_shape),
        "num_classes": info.num_classes,
        "mean": list(info.mean),
        "std": list(info.std),
    }


class _ActFactory:
    """Callable channels -> activation module, carrying the activation's width expansion."""

    def __init__(self, make: Callable[[int], nn.Module], expansion: int):
        self.make, self.expansion = make, expansion

    def __call__(self, channels: int) -> nn.Module:
        return self.make(channels)


def build_model(spec: dict[str, Any]) -> nn.Sequential:
    model_cfg = ModelConfig(**spec["model"])
    gate_cfg = GateConfig(**spec["gate"])
    shape = tuple(spec["input_shape"])
    builder = MODELS[model_cfg.name]
    # First pass counts activation sites (increasing/decreasing λ init needs the depth).
    activation = ACTIVATIONS[spec["activation"]]
    model_cfg = match_widths(model_cfg, shape, spec["num_classes"], activation.expansion)
    calls = []
    counter = _ActFactory(lambda ch: calls.append(ch) or nn.Identity(), activation.expansion)
    probe = builder(model_cfg, shape, spec["num_classes"], counter)
    count = len(calls) if isinstance(probe, nn.Module) else sum(1 for name, _ in probe if name.startswith("act"))
    shared: dict = {}
    sites = iter(range(count))
    act = _ActFactory(lambda ch: build_activation(spec["activation"], GateContext(ch, next(sites), count, gate_cfg, shared)),
                      activation.expansion)
    layers = builder(model_cfg, shape, spec["num_classes"], act)
    if isinstance(layers, nn.Module):
        layers = [("net", layers)]
    # Token inputs (language models) have no mean/std: nothing to normalize.
    norm = [("norm", Normalize(spec["mean"], spec["std"], shape))] if spec["mean"] else []
    return nn.Sequential(OrderedDict(norm + layers))
