"""timm's models as people export them (torch.onnx, random weights, 3×32×32 inputs) through the verifier: is the ONNX
file read, how long does one CROWN pass take, do its bounds hold at sampled points, and does `api.verify` answer?

    flock /tmp/heavy.lock python -m benchmarks.timm_exports [--only NAME ...] [--eps 0.002] [--points 10000] \\
        [--verify-samples 4] [--timeout 20] --out benchmarks/verify-results/timm-exports.json

Each model is built by timm from its config (no hub weights; seed 0), exported with the pipeline's exporter
(`pipeline.onnx_io.to_onnx`, the pipeline's opset, a symbolic batch axis) and read back from the file
(`readers.from_onnx`). One CROWN pass (`Bounder.crown`, then the logits' lower and upper bounds) over the L∞ box of
radius `eps` around a uniform input in [0, 1]; onnxruntime then runs the file on `points` points of that box (a
quarter of them corners, the rest uniform) and every logit outside [lower − tol, upper + tol] is a violation, tol =
`SOUND_TOL`·(1 + max |y|) (onnxruntime computes in float32, the bounds are float64). `api.verify` gets the module
itself, `verify_samples` uniform inputs labelled with the model's own class, at `eps` with `timeout_s`.
One torch thread.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

SOUND_TOL = 1e-5  # onnxruntime's float32 logits against the float64 bounds, relative to the logits' scale
CLASSES = 10
SHAPE = (3, 32, 32)


def build(name: str) -> torch.nn.Module:
    """The model as timm builds it from its config, random weights, 10 classes, for 32×32 inputs."""
    from pipeline.extras import import_timm

    timm = import_timm()
    torch.manual_seed(0)
    if name == "densenet":  # densenet121's layout (stem, dense blocks, transitions), 2 layers a block, growth 8
        m = timm.create_model("densenet121", pretrained=False, num_classes=CLASSES, growth_rate=8, block_config=(2, 2, 2, 2))
    elif name == "mixer_b16_shrunk":  # mixer_b16's blocks (token and channel MLPs, GELU, LayerNorm), 16 patches of 8×8
        from timm.models.mlp_mixer import MlpMixer  # mixer_b16_224 fixes patch, depth and width; its class takes them

        m = MlpMixer(num_classes=CLASSES, img_size=32, patch_size=8, num_blocks=2, embed_dim=32)
        torch.nn.init.normal_(m.head.weight, std=0.1)  # timm starts the head at zero: every logit 0 everywhere
    else:
        m = timm.create_model(name, pretrained=False, num_classes=CLASSES)
    return m.eval()


MODELS = {
    "efficientnet_b0": "SiLU, squeeze-excite (x·σ(pooled)), depthwise convs, BatchNorm",
    "mobilenetv3_small_050": "HardSwish, squeeze-excite with HardSigmoid, depthwise convs",
    "regnetx_002": "grouped convs, ReLU, residual adds",
    "densenet": "densenet121's layout shrunk (growth 8, blocks 2-2-2-2): concatenations, stem MaxPool, AvgPool transitions",
    "mixer_b16_shrunk": "mixer_b16 shrunk (2 blocks, dim 32, patch 8): token-mixing MLPs, GELU (Erf), LayerNorm",
}


def export(model: torch.nn.Module, path: Path) -> None:
    from pipeline.onnx_io import to_onnx
    from pipeline.opset import OPSET
    from quantize import export as export_mod

    proto, _ = to_onnx(model, torch.zeros(1, *SHAPE), opset=OPSET, simplify=True, dynamic_batch=True)
    export_mod.save(proto, path)


def box_points(lo: np.ndarray, hi: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """`n` points of the box [lo, hi]: a quarter of them corners, the rest uniform (float32)."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(size=(n, lo.size))
    u[: n // 4] = (u[: n // 4] > 0.5)
    return (lo + u * (hi - lo)).astype(np.float32)


def run_onnx(path: Path, xs: np.ndarray, chunk: int = 500) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: xs[i:i + chunk].reshape(-1, *SHAPE)})[0] for i in range(0, len(xs), chunk)])


def crown_check(net: Any, path: Path, x0: np.ndarray, eps: float, points: int) -> dict[str, Any]:
    """One CROWN pass over the box, timed, and its logit bounds against onnxruntime at `points` points of it."""
    from analysis.verification.bounds import Bounder, Spec

    lo, hi = x0 - eps, x0 + eps
    t0 = time.perf_counter()
    b = Bounder(net, torch.tensor(lo, dtype=torch.float64), torch.tensor(hi, dtype=torch.float64))
    b.crown()
    eye = torch.eye(net.num_outputs, dtype=torch.float64)
    both = b.spec_bounds(Spec(torch.cat([eye, -eye]), torch.zeros(2 * net.num_outputs))).numpy()
    seconds = time.perf_counter() - t0
    lower, upper = both[:net.num_outputs], -both[net.num_outputs:]
    ys = run_onnx(path, box_points(lo, hi, points)).astype(np.float64)
    tol = SOUND_TOL * (1 + float(np.abs(ys).max()))
    below, above = lower - ys, ys - upper  # > tol: a violation
    return {"crown_s": round(seconds, 3), "finite": bool(np.isfinite(both).all()), "points": points,
            "violations": int((below > tol).sum() + (above > tol).sum()), "tolerance": tol,
            "max_below_lower": float(below.max()), "max_above_upper": float(above.max()),
            "mean_width": float((upper - lower).mean()), "sampled_range": float((ys.max(0) - ys.min(0)).mean())}


def measure(name: str, eps: float, points: int, verify_samples: int, timeout: float, folder: Path) -> dict[str, Any]:
    from analysis import api
    from analysis.verification.ops.base import UnsupportedModel
    from analysis.verification.readers import from_onnx

    model = build(name)
    row: dict[str, Any] = {"model": name, "what": MODELS[name], "params": sum(p.numel() for p in model.parameters())}
    path = folder / f"{name}.onnx"
    export(model, path)
    t0 = time.perf_counter()
    try:
        net = from_onnx(path)
    except UnsupportedModel as e:
        return {**row, "read": False, "refusal": str(e)}
    row.update(read=True, read_s=round(time.perf_counter() - t0, 2), graph_nodes=len(net.nodes))
    rng = np.random.default_rng(1)
    x0 = rng.uniform(0, 1, int(np.prod(SHAPE)))
    row.update(crown_check(net, path, x0, eps, points))
    xs = torch.tensor(rng.uniform(0, 1, (verify_samples, *SHAPE)), dtype=torch.float32)
    with torch.no_grad():
        ys = model(xs).argmax(1)
    t0 = time.perf_counter()
    out = api.verify(model, (xs, ys), epsilons=[eps], samples=verify_samples, timeout_s=timeout, progress=False)
    row["verify"] = {"eps": eps, "timeout_s": timeout, "wall_s": round(time.perf_counter() - t0, 1), **answers(out)}
    return row


def answers(out: dict[str, Any]) -> dict[str, Any]:
    """What `api.verify` answered: the count of each result, which link decided, its first pass, its note, margins."""
    rows = out["rows"]
    results = [r["result"] for r in rows]
    decided = [r for r in rows if r["result"] in ("sat", "unsat")]
    stages = [str(r["stage"]) for r in decided]
    return {"samples": len(rows), "results": {k: results.count(k) for k in sorted(set(results))}, "decided": len(decided),
            "decided_by": {s: stages.count(s) for s in sorted(set(stages))}, "first_pass_s": out["first_pass"],
            "note": out["note"], "margins": [r["margin_lb"] for r in rows], "seconds": [r["seconds"] for r in rows]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--eps", type=float, default=0.002)
    p.add_argument("--points", type=int, default=10_000)
    p.add_argument("--verify-samples", type=int, default=4)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    done = json.loads(a.out.read_text()) if a.out.exists() else {"rows": []}
    rows = {r["model"]: r for r in done["rows"]}
    with tempfile.TemporaryDirectory(prefix="timm-exports-") as tmp:
        for name in a.only:
            rows[name] = measure(name, a.eps, a.points, a.verify_samples, a.timeout, Path(tmp))
            print(json.dumps(rows[name]), flush=True)
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "torch_threads": 1,
                                         "rows": [rows[m] for m in MODELS if m in rows]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
