"""timm's VisionTransformer forward in plain torch, with timm's state_dict keys, so that a peer's venv without timm
(auto_LiRPA's, `auto_lirpa_setup.sh`) bounds the very model ours does: `crown_vit.py` saves a timm ViT's state_dict,
`lirpa_vit.py` loads it here and checks that the outputs agree before bounding it.

What it covers is what `benchmarks/vit64.py`'s `timm_vit` builds: a conv patch embedding, a class token, learned
position embeddings, pre-norm blocks of multi-head attention (one qkv Linear; no q/k norm, no layer scale) and a
two-layer MLP with ReLU, a final LayerNorm, the class token's row to the head. The attention is timm's unfused
path (`fused_attn` off): q·scale @ kᵀ, softmax, @ v. Imports torch only."""

from __future__ import annotations

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        x = attn.softmax(dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, eps: float):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=eps), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim, eps=eps), Mlp(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, chans: int, dim: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(chans, dim, patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class PlainViT(nn.Module):
    def __init__(self, img: int, patch: int, chans: int, dim: int, depth: int, heads: int, classes: int,
                 mlp_ratio: float = 4.0, eps: float = 1e-6):
        super().__init__()
        tokens = (img // patch) ** 2 + 1
        self.patch_embed = PatchEmbed(chans, dim, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads, int(dim * mlp_ratio), eps) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])
