"""A ViT of one's own through the whole library path (issue 35's goal): nn.MultiheadAttention, LayerNorm, a class token
and 4×4 patches on sklearn's 8×8 digits, trained with GELU, converted to λ-GELU (`to_gates`), hardened (`Hardener`),
swapped to ReLU (`to_relu`), then `api.check` on the λ-GELU model, `api.verify` on the float ReLU model and on its int8
model (the int8 stage's recipe, `quantize.int8.quantize_file`), every answer cross-checked:

- every sat's counterexample is re-run in onnxruntime on its float32 input (inside the box, strictly violating);
- every unsat is attacked (PGD, many restarts, on the float model in float64; on the int8 model through onnxruntime at
  random points and the PGD points): a counterexample to an unsat would be a wrong answer.

    flock /tmp/heavy.lock python -m benchmarks.vit_digits            # writes benchmarks/verify-results/vit_digits.json

`TinyViT` is also what tests/test_verify_transformers.py reads and verifies (smaller, untrained)."""

from __future__ import annotations

import argparse
import json
import math
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

OUT = Path(__file__).resolve().parent / "verify-results"


class TinyViT(nn.Module):
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
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)  # [B, T, D]
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class Block(nn.Module):
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


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """sklearn's digits in [0, 1] as [N, 1, 8, 8]: the first 1400 train, the other 397 test."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(y)
    return x[:1400], y[:1400], x[1400:], y[1400:]


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def train(seed: int, epochs: int, dim: int, heads: int, depth: int, hidden: int) -> dict:
    """GELU → λ-GELU (to_gates) → Algorithm 1 (Hardener) → ReLU (to_relu); returns the models and their accuracies."""
    torch.manual_seed(seed)
    return harden(TinyViT(dim, heads, depth, hidden), digits(), epochs, seed)


def harden(model: nn.Module, data, epochs: int, seed: int) -> dict:
    """A user's model through `to_gates`, `Hardener` in a plain AdamW loop and `to_relu`, on (xtr, ytr, xte, yte):
    the gated and the swapped model, their test accuracies, the training seconds and the final λ."""
    import copy

    from pipeline import Hardener, to_gates, to_relu

    xtr, ytr, xte, yte = data
    model, report = to_gates(model)
    hardener = Hardener(model, epochs=epochs, example=xtr[:2])  # the example lets it look for F.gelu calls in forward()
    opt = torch.optim.AdamW(hardener.param_groups(lr=3e-3, weight_decay=1e-4), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for epoch in range(1, epochs + 1):
        hardener.start_epoch(epoch)
        model.train()
        for i in torch.randperm(len(xtr), generator=gen).split(64):
            opt.zero_grad()
            F.cross_entropy(model(xtr[i]), ytr[i]).backward()
            opt.step()
    seconds = time.perf_counter() - t0
    gated = model.eval()
    relu = to_relu(copy.deepcopy(gated)).eval()
    return {"gated": gated, "relu": relu, "convert": str(report).splitlines()[0] if str(report) else "",
            "train_seconds": round(seconds, 1), "acc_gated": accuracy(gated, xte, yte), "acc_relu": accuracy(relu, xte, yte),
            "lambdas": [round(float(v), 2) for v in hardener.lambdas()], "hardness": round(float(hardener.hardness()), 4)}


def _witnesses(rows: list[dict], path: Path, xte: torch.Tensor, yte: torch.Tensor, eps: float) -> dict:
    """Every sat row's counterexample through onnxruntime on `path`: inside the box (float32) and strictly misclassified
    (some other logit above the label's)."""
    from quantize import ort as ort_util

    sess = ort_util.session(path)
    checked = strict = 0
    for r in rows:
        if r["result"] != "sat":
            continue
        x = np.asarray(r["counterexample"], dtype=np.float32).reshape(1, *xte.shape[1:])
        x0 = xte[r["sample"]].numpy().astype(np.float64)
        inside = bool(np.all(x >= np.clip(x0 - eps, 0, 1).astype(np.float32)) and np.all(x <= np.clip(x0 + eps, 0, 1).astype(np.float32)))
        y = sess.run(None, {sess.get_inputs()[0].name: x})[0][0].astype(np.float64)
        label = int(yte[r["sample"]])
        checked += 1
        strict += inside and float(np.delete(y, label).max()) > float(y[label])
    return {"witnesses_checked": checked, "witnesses_strictly_violating": strict}


def _rows_summary(res: dict) -> dict:
    counts: dict[str, int] = {}
    for r in res["rows"]:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    n = len(res["rows"])
    decided = counts.get("sat", 0) + counts.get("unsat", 0)
    return {"properties": n, "counts": counts, "decided": decided, "decided_fraction": decided / max(n, 1),
            "seconds": [round(r["seconds"], 2) for r in res["rows"]],
            "margins": {r["sample"]: r.get("margin_lb") for r in res["rows"] if r["result"] not in ("sat", "unsat")}}


def _attack_float(model: nn.Module, x0: np.ndarray, label: int, eps: float, restarts: int = 40, steps: int = 100) -> bool:
    """PGD (float64, margin loss, random starts): True when a point of the box is misclassified."""
    m = __import__("copy").deepcopy(model).double().eval()
    x0t = torch.as_tensor(x0, dtype=torch.float64)
    lo, hi = (x0t - eps).clamp(0, 1), (x0t + eps).clamp(0, 1)
    gen = torch.Generator().manual_seed(0)
    x = lo + torch.rand(restarts, *x0t.shape, generator=gen, dtype=torch.float64) * (hi - lo)
    for k in range(steps):
        x.requires_grad_(True)
        out = m(x)
        other = out.clone()
        other[:, label] = -math.inf
        margin = out[:, label] - other.max(1).values
        if bool((margin < 0).any()):
            return True
        g, = torch.autograd.grad(margin.sum(), x)
        step = (hi - lo) * 0.25 * (0.5 * (1 + math.cos(math.pi * k / steps))) + 1e-9
        x = torch.max(torch.min(x.detach() - step * g.sign(), hi), lo)
    with torch.no_grad():
        out = m(x)
    return bool((out.argmax(1) != label).any())


def _attack_onnx(path: Path, x0: np.ndarray, label: int, eps: float, n: int = 4000) -> bool:
    """Random points and box corners through onnxruntime: True when one is misclassified."""
    from quantize import ort as ort_util

    sess = ort_util.session(path)
    rng = np.random.default_rng(0)
    lo, hi = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
    pts = np.concatenate([rng.uniform(lo, hi, (n, *x0.shape)), np.where(rng.random((n, *x0.shape)) < 0.5, lo, hi)])
    out = sess.run(None, {sess.get_inputs()[0].name: pts.astype(np.float32)})[0]
    return bool((out.argmax(1) != label).any())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--eps", type=float, default=0.002)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--depth", type=int, default=1)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--out", type=Path, default=OUT / "vit_digits.json")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    from analysis import api
    from pipeline.config import Config
    from quantize.int8 import quantize_file

    t = train(a.seed, a.epochs, a.dim, a.heads, a.depth, a.hidden)
    xtr, ytr, xte, yte = digits()
    result: dict = {k: v for k, v in t.items() if k not in ("gated", "relu")}
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    result["machine"] = {"python": platform.python_version(), "torch": torch.__version__, "threads": 1}

    t0 = time.perf_counter()
    chk = api.check(t["gated"], (xte, yte))
    result["check"] = {"verdict": chk["verdict"], "seconds": round(time.perf_counter() - t0, 1)}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fp32 = tmp / "relu.onnx"
        api.export_onnx(t["relu"], xte[:2], fp32, check_inputs=xte[:64])
        res = api.verify(t["relu"], (xte, yte), epsilons=[a.eps], low=0.0, high=1.0, samples=a.samples, timeout_s=a.timeout)
        result["float_relu"] = _rows_summary(res)
        result["float_relu"]["rows"] = [{k: v for k, v in r.items() if k not in ("counterexample", "output")} for r in res["rows"]]
        result["float_relu"].update(_witnesses(res["rows"], fp32, xte, yte, a.eps))
        result["float_relu"]["unsat_attacked_and_broken"] = [
            r["sample"] for r in res["rows"] if r["result"] == "unsat"
            and _attack_float(t["relu"], xte[r["sample"]].numpy().astype(np.float64), int(yte[r["sample"]]), a.eps)]
        int8 = tmp / "relu.int8.onnx"
        calib = xtr[torch.randperm(len(xtr), generator=torch.Generator().manual_seed(a.seed))[:256]].numpy()
        quantize_file(fp32, int8, calib, Config(), tmp)
        from quantize import ort as ort_util

        sess = ort_util.session(int8)
        out = sess.run(None, {sess.get_inputs()[0].name: xte.numpy()})[0]
        result["acc_int8"] = float((out.argmax(1) == yte.numpy()).mean())
        try:
            res8 = api.verify(str(int8), (xte, yte), epsilons=[a.eps], low=0.0, high=1.0, samples=a.samples, timeout_s=a.timeout)
            result["int8"] = _rows_summary(res8)
            result["int8"]["rows"] = [{k: v for k, v in r.items() if k not in ("counterexample", "output")} for r in res8["rows"]]
            result["int8"].update(_witnesses(res8["rows"], int8, xte, yte, a.eps))
            result["int8"]["unsat_attacked_and_broken"] = [
                r["sample"] for r in res8["rows"] if r["result"] == "unsat"
                and _attack_onnx(int8, xte[r["sample"]].numpy().astype(np.float64), int(yte[r["sample"]]), a.eps)]
        except Exception as e:  # the report says what the int8 reading met
            result["int8"] = {"not_verified": f"{type(e).__name__}: {e}"}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    short = {k: v for k, v in result.items() if k not in ("float_relu", "int8")}
    print(json.dumps(short, indent=1, default=str))
    for key in ("float_relu", "int8"):
        r = result.get(key, {})
        print(key, {k: v for k, v in r.items() if k != "rows"})
    return result


if __name__ == "__main__":
    main()
