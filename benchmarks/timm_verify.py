"""timm models a user already has, through the library path and `api.verify` (issue 40: "a timm ConvNeXt ... decided 0
of 8", "a ViT from timm ... 0 of 8"): built by timm with its own GELU, converted (`to_gates`: GELU → λ-GELU), hardened
(`Hardener`) and swapped (`to_relu`) on sklearn's digits upscaled to img×img (bilinear, one channel), then
`api.verify` on the first test samples at ε with `timeout_s`, every answer cross-checked outside the verifier:

- every sat's counterexample re-run in onnxruntime on its float32 input (inside the box, strictly misclassified);
- every unsat attacked (PGD in float64, 40 restarts × 100 steps): a counterexample to an unsat would be a wrong answer.

Models: `convnext` (timm `convnext_atto`, depths 1-1-1-1, dims 8-16-24-32: GELU, LayerNorm2d, depthwise convs; the
zoo's, benchmarks/ZOO.md) and `vit17` (timm `vit_tiny_patch16_224` at img 16, patch 4: 17 tokens, dim 32, depth 2,
2 heads; the model of benchmarks/peers/crown-vit/ with timm's GELU). `--kinds smooth` verifies the λ-GELU model itself.
Training is deterministic (one thread, a seed), so a run with `--code OTHER` (another checkout's `analysis/` first on
sys.path, by PYTHONPATH) verifies the same model with other code: a before and after.

    flock /tmp/heavy.lock python -m benchmarks.timm_verify --model convnext --tag after
    cd /tmp/wt-old && PYTHONPATH=. flock /tmp/heavy.lock /work/main/.venv/bin/python -m benchmarks.timm_verify \\
        --model convnext --tag before --code OLD --out /work/main/benchmarks/verify-results/timm_verify.json

(run from the other checkout's directory, with this file copied there: `python -m` puts the working directory first
on sys.path).

Merges its result under `<model>/<tag>` into benchmarks/verify-results/timm_verify.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import torch

from benchmarks.maxpool_resnet import _verified, digits_up
from benchmarks.vit_digits import _attack_float, harden

OUT = Path(__file__).resolve().parent / "verify-results" / "timm_verify.json"
IMG = {"convnext": 32, "vit17": 16}


def build(name: str) -> torch.nn.Module:
    from pipeline.extras import import_timm

    timm = import_timm()
    if name == "convnext":
        return timm.create_model("convnext_atto", pretrained=False, num_classes=10, in_chans=1, depths=(1, 1, 1, 1),
                                 dims=(8, 16, 24, 32))
    if name == "vit17":
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, in_chans=1, img_size=16,
                                 patch_size=4, embed_dim=32, depth=2, num_heads=2)
    raise ValueError(name)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(IMG), required=True)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--eps", type=float, default=0.002)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--kinds", nargs="+", choices=("float_relu", "smooth"), default=["float_relu"])
    p.add_argument("--tag", default="after")
    p.add_argument("--code", default="", help="the checkout whose analysis/ runs (recorded)")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    from analysis import api

    torch.manual_seed(a.seed)
    xtr, ytr, xte, yte = digits_up(IMG[a.model])
    t = harden(build(a.model), (xtr, ytr, xte, yte), a.epochs, a.seed)
    result: dict = {k: v for k, v in t.items() if k not in ("gated", "relu")}
    result["settings"] = {k: v for k, v in vars(a).items()}
    result["machine"] = {"python": platform.python_version(), "torch": torch.__version__, "threads": 1,
                         "cpu": platform.processor() or platform.machine()}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, model in (("float_relu", t["relu"]), ("smooth", t["gated"])):
            if kind not in a.kinds:
                continue
            path = Path(tmp) / f"{kind}.onnx"
            api.export_onnx(model, xte[:2], path, check_inputs=xte[:64])
            result[kind] = _verified(api, model, path, xte, yte, a, lambda x0, y, m=model: _attack_float(m, x0, y, a.eps))
    allres = json.loads(a.out.read_text()) if a.out.exists() else {}
    allres.setdefault(a.model, {})[a.tag] = result
    a.out.write_text(json.dumps(allres, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("float_relu", "smooth")}, default=str))
    for kind in ("float_relu", "smooth"):
        if kind in result:
            print(kind, {k: v for k, v in result[kind].items() if k != "rows"})
    return result


if __name__ == "__main__":
    main()
