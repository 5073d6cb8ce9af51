"""A torchvision-layout ResNet with a MaxPool stem through the library path, verified (issue 40's MaxPool goal).

timm's `resnet18` builder, shrunk: the stem conv 7×7 stride 2 → BatchNorm → activation → MaxPool 3×3 stride 2 pad 1,
BasicBlocks (`layers`, `channels`), global average pool, fc; nn.SiLU as timm builds it (act_layer="silu"). On sklearn's
digits upscaled to 32×32 (bilinear), trained as a user of this project trains it: SiLU → λ-Swish (`to_gates`), hardened
(`Hardener`), swapped to ReLU (`to_relu`). Then `api.verify` on the float ReLU model at ε 0.002 with `timeout_s=60`
(the MaxPool read as a tree of ReLUs, `analysis.verification.readers._max_tree`), every answer cross-checked:

- every sat's counterexample is re-run in onnxruntime on its float32 input (inside the box, strictly misclassified);
- every unsat is attacked (PGD in float64, many restarts): a counterexample to an unsat would be a wrong answer.

`--kinds smooth` verifies the λ-Swish model itself, `--kinds int8` the ReLU model's int8 QDQ file (Q/DQ around the
MaxPool); training is deterministic (one thread, a seed), so each kind may run in a process of its own.

    flock /tmp/heavy.lock python -m benchmarks.maxpool_resnet        # writes benchmarks/verify-results/maxpool_resnet.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.vit_digits import _attack_float, _attack_onnx, _rows_summary, _witnesses, digits, harden

OUT = Path(__file__).resolve().parent / "verify-results"
KINDS = ("float_relu", "smooth", "int8", "pairmax")


def resnet(layers: tuple[int, ...], channels: tuple[int, ...]) -> torch.nn.Module:
    """timm's ResNet (torchvision's layout: conv7×7/2 with 64 channels, BN, act, MaxPool 3×3/2 p1, BasicBlocks,
    avgpool, fc), its stages tiny."""
    from pipeline.extras import import_timm

    timm = import_timm()
    return timm.create_model("resnet18", pretrained=False, num_classes=10, in_chans=1, act_layer="silu",
                             layers=layers, channels=channels)


def digits_up(img: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """sklearn's digits in [0, 1] (benchmarks/vit_digits.py's split), upscaled to [N, 1, img, img] (bilinear, so still
    in [0, 1])."""
    xtr, ytr, xte, yte = digits()
    up = lambda x: F.interpolate(x, size=img, mode="bilinear", align_corners=False).clamp(0, 1)  # noqa: E731
    return up(xtr), ytr, up(xte), yte


def train(seed: int, epochs: int, layers, channels) -> dict:
    torch.manual_seed(seed)
    return harden(resnet(layers, channels), digits_up(), epochs, seed)


def _verified(api, model, path: Path, xte, yte, a, attack) -> dict:
    """api.verify's answers on `model`, its witnesses replayed in onnxruntime on `path`, its unsats attacked."""
    t0 = time.perf_counter()
    res = api.verify(model, (xte, yte), epsilons=[a.eps], low=0.0, high=1.0, samples=a.samples, timeout_s=a.timeout,
                     progress=False)
    out = _rows_summary(res)
    out["wall_seconds"] = round(time.perf_counter() - t0, 1)
    out["first_pass"] = res.get("first_pass")
    out["note"] = res.get("note", "")
    out["rows"] = [{k: v for k, v in r.items() if k not in ("counterexample", "output")} for r in res["rows"]]
    out.update(_witnesses(res["rows"], path, xte, yte, a.eps))
    out["unsat_attacked_and_broken"] = [r["sample"] for r in res["rows"] if r["result"] == "unsat"
                                        and attack(xte[r["sample"]].numpy().astype(np.float64), int(yte[r["sample"]]))]
    out["wrong_answers"] = (out["witnesses_checked"] - out["witnesses_strictly_violating"]) + len(out["unsat_attacked_and_broken"])
    return out


def pairmax_interval_cost(graph, x0: np.ndarray, eps: float) -> dict:
    """One CROWN pass over the box of x0 with `PairMax`'s interval (the max's own) and with the plain Pool's (a + ReLU(b − a)
    by interval arithmetic): how many units interval arithmetic leaves unstable, what CROWN then costs and leaves."""
    from analysis.verification.bounds import Bounder
    from analysis.verification.ops import PairMax, Pool

    out = {}
    lb, ub = np.clip(x0 - eps, 0, 1), np.clip(x0 + eps, 0, 1)
    for name, ibp in (("PairMax", PairMax.ibp), ("Pool", Pool.ibp)):
        saved, PairMax.ibp = PairMax.ibp, ibp
        try:
            b = Bounder(graph, lb, ub)
            ibp_unstable = b.result().unstable("ibp")
            t0 = time.perf_counter()
            b.crown()
            out[name] = {"ibp_unstable_per_site": ibp_unstable, "ibp_unstable": sum(ibp_unstable),
                         "crown_unstable": sum(b.result().unstable()), "crown_seconds": round(time.perf_counter() - t0, 2),
                         "ibp_output_width": float((b.ibp_out[1] - b.ibp_out[0]).max())}
        finally:
            PairMax.ibp = saved
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--skip", type=int, default=0, help="verify test samples skip..skip+samples-1 (a run in parts)")
    p.add_argument("--eps", type=float, default=0.002)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--layers", type=int, nargs=4, default=[1, 1, 1, 1])  # timm runs layer1..layer4
    p.add_argument("--channels", type=int, nargs=4, default=[8, 16, 16, 16])
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=["float_relu"],
                   help="what to verify: the float ReLU model, the λ-Swish model itself, the ReLU model's int8 QDQ file; "
                        "pairmax: one CROWN pass on the first sample's box with PairMax's interval and with the plain Pool's")
    p.add_argument("--out", type=Path, default=OUT / "maxpool_resnet.json")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    from analysis import api
    from analysis.verification.readers import from_torch

    t = train(a.seed, a.epochs, tuple(a.layers), tuple(a.channels))
    xtr, ytr, xte, yte = digits_up()
    xte, yte = xte[a.skip:], yte[a.skip:]  # rows' "sample" count from here
    result: dict = {k: v for k, v in t.items() if k not in ("gated", "relu")}
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    result["machine"] = {"python": platform.python_version(), "torch": torch.__version__, "threads": 1,
                         "cpu": platform.processor() or platform.machine()}
    graph = from_torch(t["relu"], (1, 32, 32))
    result["graph"] = graph.describe()
    result["stem"] = [str(getattr(t["relu"], m)) for m in ("conv1", "bn1", "act1", "maxpool")]
    if "pairmax" in a.kinds:
        result["pairmax"] = pairmax_interval_cost(graph, xte[0].reshape(-1).double().numpy(), a.eps)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fp32 = tmp / "relu.onnx"
        api.export_onnx(t["relu"], xte[:2], fp32, check_inputs=xte[:64])
        relu = t["relu"]
        if "float_relu" in a.kinds:
            result["float_relu"] = _verified(api, relu, fp32, xte, yte, a, lambda x0, y: _attack_float(relu, x0, y, a.eps))
        if "smooth" in a.kinds:
            smooth = tmp / "smooth.onnx"
            api.export_onnx(t["gated"], xte[:2], smooth, check_inputs=xte[:64])
            gated = t["gated"]
            result["smooth"] = _verified(api, gated, smooth, xte, yte, a, lambda x0, y: _attack_float(gated, x0, y, a.eps))
        if "int8" in a.kinds:
            from pipeline.config import Config
            from quantize import ort as ort_util
            from quantize.int8 import quantize_file

            int8 = tmp / "relu.int8.onnx"
            calib = xtr[torch.randperm(len(xtr), generator=torch.Generator().manual_seed(a.seed))[:256]].numpy()
            quantize_file(fp32, int8, calib, Config(), tmp)
            result["acc_int8"] = float((ort_util.infer(ort_util.session(int8), xte.numpy()).argmax(1) == yte.numpy()).mean())
            result["int8"] = _verified(api, str(int8), int8, xte, yte, a, lambda x0, y: _attack_onnx(int8, x0, y, a.eps))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in KINDS}, indent=1, default=str))
    for key in KINDS:
        if key in result:
            print(key, {k: v for k, v in result[key].items() if k != "rows"})
    return result


if __name__ == "__main__":
    main()
