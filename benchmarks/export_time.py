"""`api.export_onnx` of a 108k-parameter timm ViT (issue 42: ≤ 10 s on 2 cores with its default check), and with 256 and
500 check inputs, timed on whatever code is first on the path: run it once on this checkout and once on an older one.

    flock /tmp/heavy.lock env PYTHONPATH=$PWD python -m benchmarks.export_time --out benchmarks/export-results/head.json
    flock /tmp/heavy.lock env PYTHONPATH=/path/to/old/checkout python benchmarks/export_time.py --out .../base.json

timm comes through `pipeline.extras.import_timm` where it exists (the repair for a CPU-only torch) and through the same
repair written out here otherwise (an older checkout has no `pipeline.extras`)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch


def _timm():
    try:
        from pipeline.extras import import_timm
        return import_timm()
    except ImportError:  # an older checkout: the same repair (pipeline/extras.py says why)
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _timm.lib = lib
        import timm
        return timm


SHAPES = {  # two ViTs of about 100k parameters: CIFAR-sized (65 tokens) and ImageNet-sized (197 tokens)
    "vit32": dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4),
    "vit224": dict(img_size=224, patch_size=16, embed_dim=48, depth=2, num_heads=3),
}


def vit(shape: str):
    torch.manual_seed(0)
    return _timm().create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, **SHAPES[shape]).eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="vit32")
    ap.add_argument("--inputs", type=int, nargs="+", default=[256, 500])
    args = ap.parse_args()
    from analysis import api
    import pipeline

    model = vit(args.shape)
    size = SHAPES[args.shape]["img_size"]
    x = torch.rand(max(args.inputs), 3, size, size, generator=torch.Generator().manual_seed(0))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        api.export_onnx(model, x[:2], Path(tmp) / "warm.onnx")  # imports and first-call costs out of the timings
        for label, check in [("default (check_inputs=example, 2 inputs)", None),
                             *((f"check_inputs={n}", x[:n]) for n in args.inputs)]:
            times = []
            for r in range(args.reps):
                t = time.perf_counter()
                out = api.export_onnx(model, x[:2], Path(tmp) / f"vit{r}.onnx", check_inputs=check)
                times.append(time.perf_counter() - t)
            rows.append({"case": label, "seconds": times, "min_s": min(times), "samples": out["samples"],
                         "samples_bounded": out.get("samples_bounded", out["samples"]),
                         "ort_bound_ratio": out["ort_bound_ratio"]})
            print(f"{label}: {min(times):.2f} s (min of {args.reps}), bounded on {rows[-1]['samples_bounded']}", flush=True)
    root = Path(pipeline.__file__).resolve().parent.parent
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"code": str(root), "commit": commit or "(not a git checkout)", "shape": args.shape,
                                    "params": sum(p.numel() for p in model.parameters()), "cpu": platform.processor(),
                                    "threads": torch.get_num_threads(), "loadavg_after": os.getloadavg(), "rows": rows},
                                   indent=1) + "\n")


if __name__ == "__main__":
    main()
