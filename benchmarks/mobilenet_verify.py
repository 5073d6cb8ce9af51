"""A MobileNetV2-style ReLU6 net of 12,906 parameters on 3×32×32 inputs through `api.verify`: how long its first bound
pass takes, and how many of its properties at ε 0.002 are decided.

    flock /tmp/heavy.lock python -m benchmarks.mobilenet_verify --kind random --out benchmarks/verify-results/mobilenet-relu6.json
    flock /tmp/heavy.lock python -m benchmarks.mobilenet_verify --kind trained --out ...
    flock /tmp/heavy.lock python -m benchmarks.mobilenet_verify --kind trained --samples 10 --vnncomp runs/mobilenet-relu6

`--vnncomp DIR` verifies nothing: it writes the same net and properties as a VNN-COMP folder (DIR/onnx/, DIR/vnnlib/,
DIR/instances.csv at `--timeout`) for `pipeline vnncomp` and the peer verifiers (benchmarks/peers/), the ONNX file
checked against the net in onnxruntime (`write_checked`; onnxsim folds the BatchNorms, ReLU6 stays a Clip).

The net is `crown_time.mobilenet(BLOCKS_13K)` (stem, six inverted residual blocks with depthwise 3×3 convolutions,
BatchNorm, ReLU6, a 1×1 conv to 64 channels, average pooling, a Linear; seed 0). `random`: its random weights, the
properties at uniform random inputs in [0, 1] (seed 1) labelled with the net's own class. `trained`: the same net
trained `EPOCHS` epochs (Adam) on sklearn's digits as 3×32×32 images (`benchmarks.zoo.data`: the first 1,400 for
training), the properties at the first test images with their true labels. `api.verify` with its default chain, ε
0.002, the box clipped to [0, 1], `timeout_s` per property (20 s: the limit the net's pass did not fit before), one
torch thread.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.crown_time import BLOCKS_13K, mobilenet
from benchmarks.timm_exports import answers

EPOCHS = 15
TRAIN = 1400


def net_and_properties(kind: str, n: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, dict[str, Any]]:
    model = mobilenet(BLOCKS_13K)
    info: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters())}
    if kind == "random":
        gen = torch.Generator().manual_seed(1)
        xs = torch.rand(n, 3, 32, 32, generator=gen)
        with torch.no_grad():
            return model, xs, model(xs).argmax(1), info
    from benchmarks.zoo import data

    x, y = data("convnext", n=1797)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(EPOCHS):
        for idx in torch.randperm(TRAIN, generator=gen).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        info["test_accuracy"] = round(float((model(x[TRAIN:]).argmax(1) == y[TRAIN:]).float().mean()), 4)
    info["epochs"] = EPOCHS
    return model, x[TRAIN:TRAIN + n], y[TRAIN:TRAIN + n], info


def export_folder(model: torch.nn.Module, xs: torch.Tensor, ys: torch.Tensor, eps: float, timeout: float, out: Path,
                  name: str) -> None:
    """The net and one robustness property per input (ε box clipped to [0, 1], as `api.verify` takes it) as a VNN-COMP
    folder under `out`."""
    from analysis.verification.vnnlib import write_robustness_benchmark
    from quantize.export import write_checked

    with tempfile.TemporaryDirectory() as tmp:
        written = write_checked(model, xs[:1], Path(tmp) / f"{name}.onnx", xs, dynamic_batch=False)
        rows = write_robustness_benchmark(out, written.path, xs.numpy(), [int(c) for c in ys], eps, 0.0, 1.0,
                                          int(model(xs[:1]).shape[1]), timeout, prefix="digits")
    print(f"{len(rows)} instances in {out}; the ONNX file against the net: {written.check}")


def main(argv: list[str] | None = None) -> int:
    from analysis import api

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=["random", "trained"], required=True)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--eps", type=float, default=0.002)
    p.add_argument("--timeout", type=float, default=20.0)
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", type=Path, help="the JSON that keeps each kind's api.verify answers")
    out.add_argument("--vnncomp", type=Path, metavar="DIR", help="write the net and properties as a VNN-COMP folder")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    model, xs, ys, info = net_and_properties(a.kind, a.samples)
    if a.vnncomp:
        export_folder(model, xs, ys, a.eps, a.timeout, a.vnncomp, f"mobilenet_relu6_{a.kind}")
        return 0
    t0 = time.perf_counter()
    out = api.verify(model, (xs, ys), epsilons=[a.eps], low=0.0, high=1.0, samples=a.samples, timeout_s=a.timeout,
                     progress=False)
    wall = time.perf_counter() - t0
    row = {"kind": a.kind, **info, "eps": a.eps, "timeout_s": a.timeout, "wall_s": round(wall, 1), **answers(out)}
    print(json.dumps(row))
    done = json.loads(a.out.read_text()) if a.out.exists() else {}
    done[a.kind] = row
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(done, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
