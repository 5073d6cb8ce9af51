"""One peer ONNX loader on a list of ONNX files, inside that loader's own venv (benchmarks/peers/readers.py runs it):
does it read each file, and does what it read compute what onnxruntime computes?

    PYTHONPATH=benchmarks/peers/stand_ins /work/peers/onnx2pytorch/bin/python benchmarks/peers/read_check.py \\
        onnx2pytorch jobs.json out.json

Imports only numpy, onnx, torch and the loader (the project is not installed in a peer's venv). Tools:

- `onnx2pytorch`: `onnx2pytorch.ConvertModel(model, experimental=True)`, as α,β-CROWN's `load_model_onnx` calls it.
- `onnx2torch`: `onnx2torch.convert(model)`.
- `auto_lirpa`: onnx2pytorch as above, then auto_LiRPA's `BoundedModule` (its default convolutional mode, patches)
  and one CROWN pass on the box [box_lo, box_hi]: read when the pass gives finite bounds that hold at
  `SOUNDNESS_SAMPLES` points of the box (a quarter of them corners, the rest uniform), run through the loaded model.
- `abcrown`: α,β-CROWN's loader, its fork of onnx2pytorch at the commit its `load_model.py` pins
  (`abcrown_loader_setup.sh` installs it into a folder put first on PYTHONPATH), called as `load_model_onnx` calls it
  (`ConvertModel(model, experimental=True, quirks={})`), then auto_LiRPA's CROWN pass as for `auto_lirpa`: the two
  steps α,β-CROWN takes before its own bounds.

A job: {"name", "onnx", "npz"} where the npz holds x [N, ...], onnxruntime's outputs y [N, K] and a box box_lo,
box_hi of one input's shape (a property's input set). A file is read when the loader builds a model and its outputs on every x are within
`READ_RTOL`·(1 + max|y|) of onnxruntime's (another float32 engine sums in another order; a wrong op or weight is
far off). The first line of any error is kept.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
import torch

READ_RTOL = 1e-4  # float32 engines summing in other orders agree to ~1e-6 of the logits' scale on these nets
SOUNDNESS_SAMPLES = 512
SOUNDNESS_ATOL = 1e-5  # float32 evaluation of the loaded model against auto_LiRPA's float32 bounds


def load(tool: str, path: str) -> torch.nn.Module:
    model = onnx.load(path)
    if tool in ("onnx2pytorch", "auto_lirpa"):
        from onnx2pytorch import ConvertModel

        return ConvertModel(model, experimental=True).eval()
    if tool == "abcrown":
        from onnx2pytorch import ConvertModel

        return ConvertModel(model, experimental=True, quirks={}).eval()
    if tool == "onnx2torch":
        from onnx2torch import convert

        return convert(model).eval()
    raise SystemExit(f"error: unknown tool {tool!r}")


def version(tool: str) -> str:
    import importlib.metadata as md

    names = {"onnx2pytorch": ["onnx2pytorch"], "onnx2torch": ["onnx2torch"], "auto_lirpa": ["auto_LiRPA", "onnx2pytorch"],
             "abcrown": ["auto_LiRPA"]}[tool]
    out = []
    if tool == "abcrown":  # the fork is a source folder without its own metadata: the commit its setup wrote beside it
        import onnx2pytorch

        stamp = Path(onnx2pytorch.__file__).parents[1] / "COMMIT"
        out.append(f"onnx2pytorch {stamp.read_text().strip() if stamp.is_file() else '?'} (α,β-CROWN's fork)")
    for n in names:
        try:
            out.append(f"{n} {md.version(n)}")
        except md.PackageNotFoundError:
            mod = __import__(n)
            out.append(f"{n} {getattr(mod, '__version__', '?')}")
    return ", ".join(out) + f"; torch {torch.__version__}"


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def where(e: BaseException) -> str:
    """The innermost frame of the loader's own code that raised (file:line), to tell a refusal from a crash."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "site-packages" in f.filename]
    f = frames[-1] if frames else traceback.extract_tb(e.__traceback__)[-1]
    return f"{f.filename.split('site-packages/')[-1]}:{f.lineno}"


@torch.no_grad()
def outputs(net: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    return np.concatenate([net(torch.from_numpy(x[i:i + 1]).float()).reshape(1, -1).numpy() for i in range(len(x))])


def crown(net: torch.nn.Module, box_lo: np.ndarray, box_hi: np.ndarray) -> dict:
    from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm

    lo, hi = torch.from_numpy(box_lo[None]).float(), torch.from_numpy(box_hi[None]).float()
    x = (lo + hi) / 2
    t0 = time.perf_counter()
    bounded = BoundedModule(net, torch.zeros_like(x), device="cpu")
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    lb, ub = bounded.compute_bounds(x=(BoundedTensor(x, PerturbationLpNorm(x_L=lo, x_U=hi)),), method="CROWN")
    seconds = time.perf_counter() - t0
    lb, ub = lb.detach().reshape(-1).numpy(), ub.detach().reshape(-1).numpy()
    gen = torch.Generator().manual_seed(0)
    u = torch.rand((SOUNDNESS_SAMPLES, *x.shape[1:]), generator=gen)
    u[: SOUNDNESS_SAMPLES // 4] = (u[: SOUNDNESS_SAMPLES // 4] > 0.5).float()  # corners
    ys = outputs(net, (lo + u * (hi - lo)).numpy())
    below, above = float(np.max(lb - ys)), float(np.max(ys - ub))
    finite = bool(np.isfinite(lb).all() and np.isfinite(ub).all())
    return {"finite": finite, "holds": bool(finite and below <= SOUNDNESS_ATOL and above <= SOUNDNESS_ATOL),
            "max_below_lower": below, "max_above_upper": above, "mean_width": float(np.mean(ub - lb)),
            "build_s": round(build, 3), "crown_s": round(seconds, 3), "samples": SOUNDNESS_SAMPLES}


def check(tool: str, job: dict) -> dict:
    data = np.load(job["npz"])
    x, y = data["x"].astype(np.float32), data["y"]
    out: dict = {"name": job["name"], "onnx": job["onnx"]}
    stage = "load"
    try:
        net = load(tool, job["onnx"])
        stage = "run"
        got = outputs(net, x)
        diff = float(np.max(np.abs(got - y.reshape(len(y), -1))))
        out.update(max_abs_diff=diff, tolerance=READ_RTOL * (1 + float(np.max(np.abs(y)))))
        out["same_function"] = diff <= out["tolerance"]
        if tool in ("auto_lirpa", "abcrown") and out["same_function"]:
            stage = "bound"
            out["crown"] = crown(net, data["box_lo"], data["box_hi"])
        out["read"] = out["same_function"] and ("crown" not in out or out["crown"]["holds"])
    except Exception as e:  # noqa: BLE001 (a peer's failure of any kind is the measurement)
        out.update(read=False, stage=stage, error=first_line(e), at=where(e))
    return out


def main(argv: list[str]) -> int:
    tool, jobs, dest = argv[1], json.loads(Path(argv[2]).read_text()), Path(argv[3])
    torch.set_num_threads(1)
    rows = []
    for job in jobs:
        rows.append(check(tool, job))
        r = rows[-1]
        print(f"{tool}: {job['name']}: {'read' if r['read'] else 'not read'}"
              + (f" ({r['error']})" if "error" in r else f" (max |diff| {r['max_abs_diff']:.2g})"), flush=True)
    dest.write_text(json.dumps({"tool": tool, "version": version(tool), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
