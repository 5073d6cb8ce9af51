"""A 64-token ViT through `analysis.api.verify` (issue 40, item 2's ViT goal): timm's `vit_tiny_patch16_224` shrunk to
64 tokens (img 32, patch 4, embed_dim 64, depth 2, 2 heads, ReLU MLPs), trained briefly on sklearn's digits upscaled
to 32×32 (3 channels), then verified at ε 0.002 with `timeout_s=60` on the first test samples; every sat's witness
re-run in onnxruntime, every unsat attacked (PGD in float64 and random points through onnxruntime).

    flock /tmp/heavy.lock python -m benchmarks.vit64 train            # the model, seeded (writes --model)
    flock /tmp/heavy.lock python -m benchmarks.vit64 profile          # one CROWN pass, site by site
    flock /tmp/heavy.lock python -m benchmarks.vit64 verify --tag after   # api.verify on --samples test samples

`verify` merges its result under `--tag` into benchmarks/verify-results/vit64.json (run it from another checkout's
code for a "before": `PYTHONPATH=OTHER python -m benchmarks.vit64 verify --tag before --code OTHER`)."""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
OUT = HERE / "verify-results"
MODEL = Path("/tmp/vit64-model.pt")
HEADS = 2


def build(heads: int = HEADS) -> torch.nn.Module:
    from .verify_time import _vit

    torch.manual_seed(0)
    m = _vit()
    if heads != 2:
        import timm
        from torch import nn

        torch.manual_seed(0)
        m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, embed_dim=64, depth=2,
                              num_heads=heads, num_classes=10, act_layer=nn.ReLU).eval()
    return m


def digits32() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """sklearn's digits in [0, 1], bilinearly upscaled to 32×32, 3 equal channels: the first 1400 train, 397 test."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16, dtype=torch.float32).reshape(-1, 1, 8, 8)
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).clamp(0, 1).repeat(1, 3, 1, 1)
    y = torch.tensor(y)
    return x[:1400], y[:1400], x[1400:], y[1400:]


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model.eval()(x).argmax(1) == y).float().mean())


def section_train(a) -> dict:
    torch.manual_seed(a.seed)
    model = build(a.heads)
    xtr, ytr, xte, yte = digits32()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(a.seed)
    steps = a.epochs * math.ceil(len(xtr) / 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        model.train()
        for i in torch.randperm(len(xtr), generator=gen).split(64):
            opt.zero_grad()
            F.cross_entropy(model(xtr[i]), ytr[i]).backward()
            opt.step()
            sched.step()
    model.eval()
    out = {"epochs": a.epochs, "heads": a.heads, "train_seconds": round(time.perf_counter() - t0, 1),
           "acc_train": accuracy(model, xtr, ytr), "acc_test": accuracy(model, xte, yte)}
    torch.save(model.state_dict(), a.model)
    print(out)
    return out


def load(a) -> torch.nn.Module:
    m = build(a.heads)
    m.load_state_dict(torch.load(a.model))
    return m.eval()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("section", choices=["train", "profile", "verify"])
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--heads", type=int, default=HEADS)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--eps", type=float, default=0.002)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--tag", default="after")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    res = {"train": section_train}[a.section](a)


if __name__ == "__main__":
    main()
