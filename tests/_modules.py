"""Small torch modules the tests build networks from (not a test module)."""

from __future__ import annotations

import torch
from torch import nn


class Affine(nn.Module):
    """y = x·scale + shift with buffers, the Mul/Add normalization the exporter and the verifiers read."""

    def __init__(self, scale, shift):
        super().__init__()
        self.register_buffer("scale", torch.as_tensor(scale, dtype=torch.float32))
        self.register_buffer("shift", torch.as_tensor(shift, dtype=torch.float32))

    def forward(self, x):
        return x * self.scale + self.shift


class TinyViT(nn.Module):
    """Patches → tokens → pre-norm self-attention (nn.MultiheadAttention) and a GELU MLP, both residual →
    mean pool → logits: the layout of a small ViT."""

    def __init__(self, dim: int = 16, heads: int = 2, classes: int = 10):
        super().__init__()
        self.patch = nn.Conv2d(1, dim, 4, stride=4)
        self.pos = nn.Parameter(0.1 * torch.randn(1, 4, dim))
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.patch(x.reshape(-1, 1, 8, 8)).flatten(2).transpose(1, 2) + self.pos
        a = self.norm1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.mlp(self.norm2(h))
        return self.head(h.mean(1))


class ClassTokenViT(nn.Module):
    """A pre-norm ViT as a user writes it: patches by a strided Conv, a class token, learned positions, blocks of
    nn.MultiheadAttention and an MLP with nn.GELU, a final LayerNorm, the head on the class token."""

    def __init__(self, dim: int = 16, heads: int = 2, depth: int = 1, hidden: int = 32, patch: int = 4, image: int = 8,
                 channels: int = 1, classes: int = 10):
        super().__init__()
        self.input_shape = (channels, image, image)  # declared: what pipeline.probe feeds its watched forward
        self.patch = nn.Conv2d(channels, dim, patch, stride=patch)
        tokens = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(PreNormBlock(dim, heads, hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)  # [B, T, D]
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class PreNormBlock(nn.Module):
    """LayerNorm → self-attention, LayerNorm → GELU MLP, each residual."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))
