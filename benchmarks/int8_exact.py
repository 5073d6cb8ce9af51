"""A bit-exact reference for the int8 verdicts (issue 41, item 3): tiny int8 MLPs on digits, a box that moves a few
pixels by a few input grid steps, and the exact answer by enumeration.

Each instance: a 64 → h1 → h2 → 10 ReLU MLP (a few dozen units) trained on sklearn's digits for a few epochs, its
input normalization folded into the first Linear and quantized by the int8 stage's own recipe (`quantize.int8.
quantize_file` with the default `Config()`: QDQ, per-channel 7-bit weights, int8 activations, percentile calibration on
training inputs), as the int8 stage does. The box around a test image x0 moves `pixels` pixels (the ones whose
float-gradient of the margin is largest) by ±eps and keeps every other pixel at x0.

The exact answer: the graph reads its input only through the first QuantizeLinear, which is monotone per pixel, so
the values the runtime computes over the box are those at the product of each pixel's grid points between the
images of its box ends. `grid_points` finds, per pixel, one float32 input inside the box for each of those grid
points (and checks that the runtime's rounding, `quantized.grid_index`, maps it there and that they cover the whole
range); onnxruntime runs every combination. Robust ("unsat") when no combination has another logit ≥ the label's;
"sat" when one has one strictly above; "tie" when the only violations are equal logits (the property's unsafe set is
closed, so no certificate exists, and no counterexample is strict either: the verifier's only sound answer is open).

The verifier's answer: `registry.get_verifier(verifier).verify` on the int8 ONNX and the property's VNN-LIB file,
the verify stage's chain ("auto": CROWN, the attack as a probe, α-CROWN, branch and bound with the grid's integers
in its leaf MILPs). A disagreement is a sat against an exact unsat, or an unsat against an exact sat or tie; every sat
witness is re-run in onnxruntime.

    python -m benchmarks.int8_exact [--instances 24] [--timeout 20] [--pixels 12] [--steps 1.2 1.6 2.2 3.6]
        [--max-points 600000] [--seed 0] [--out benchmarks/int8-results/exact.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

SHAPES = [(24, 16), (32, 16), (16, 16), (24, 12)]
MAX_POINTS = 600_000  # grid points per box at most (onnxruntime runs each)
BACK_OFF = (0.8, 0.9, 0.95, 1.0)  # where on the segment to the class change a near-boundary centre lies


def build(workdir: Path, seed: int, hidden: tuple[int, int], epochs: int = 6) -> Path:
    """The int8 ONNX file of a trained digits MLP, made as the export and int8 stages make it."""
    from pipeline.config import Config
    from pipeline.onnx_io import to_onnx
    from quantize import export as export_mod
    from quantize.int8 import quantize_file
    from tests._digits import digits, trained

    ds = digits()
    net, spec = trained("relu", epochs=epochs, lam=None, seed=seed, hidden=hidden)
    folded = export_mod.fold_normalization(net, tuple(spec["input_shape"]))
    assert folded is not None
    proto, _ = to_onnx(folded, ds.val.x[:2], 20, True)
    fp32 = workdir / f"mlp{seed}.fp32.onnx"
    export_mod.save(proto, fp32)
    int8 = workdir / f"mlp{seed}.int8.onnx"
    quantize_file(fp32, int8, ds.train.x[:512].numpy(), Config().quantize, workdir)
    return int8


def grid_points(qin, lb: np.ndarray, ub: np.ndarray) -> list[np.ndarray]:
    """Per input unit, float32 inputs inside [lb, ub], one for each grid point the runtime's first QuantizeLinear
    reaches over the interval (checked: their grid indices are exactly q(lb)..q(ub))."""
    from analysis.verification.quantized import grid_index

    s, z = qin.scale.numpy(), qin.zero.numpy()
    assert qin.pre_scale is None, "the MLP's normalization is folded: the input is quantized as it is"
    lb32, ub32 = lb.astype(np.float32), ub.astype(np.float32)
    assert np.all(lb32 == lb) and np.all(ub32 == ub), "the box's ends are float32 values"
    qlo = grid_index(lb32.astype(np.float64), s, z, qin.qmin, qin.qmax)
    qhi = grid_index(ub32.astype(np.float64), s, z, qin.qmin, qin.qmax)
    out = []
    for i in range(lb.size):
        ks = np.arange(qlo[i], qhi[i] + 1)
        on_grid = np.float32(s[i]) * (ks - z[i]).astype(np.float32)
        cand = np.concatenate([[lb32[i], ub32[i]], np.clip(on_grid, lb32[i], ub32[i])])
        cand = np.unique(cand.astype(np.float32))
        q = grid_index(cand.astype(np.float64), np.full(cand.size, s[i]), np.full(cand.size, z[i]), qin.qmin, qin.qmax)
        _, first = np.unique(q, return_index=True)
        assert np.array_equal(np.unique(q), ks), (i, q, ks)
        out.append(cand[first])
    return out


def exact(sess, qin, lb: np.ndarray, ub: np.ndarray, label: int, chunk: int = 1 << 16) -> dict:
    """Every grid point of the box through onnxruntime: {"answer": unsat | sat | tie, "points", "margin": the smallest
    label logit − best other logit, "witness": a float32 input with the smallest margin}."""
    from quantize import ort as ort_util

    axes = grid_points(qin, lb, ub)
    moving = [i for i, a in enumerate(axes) if a.size > 1]
    base = np.array([a[0] for a in axes], dtype=np.float32)
    combos = itertools.product(*(axes[i] for i in moving))
    total = int(np.prod([axes[i].size for i in moving], dtype=np.int64))
    best, witness = np.inf, None
    done = 0
    while done < total:
        block = np.array(list(itertools.islice(combos, chunk)), dtype=np.float32).reshape(-1, len(moving))
        xs = np.repeat(base[None], len(block), 0)
        xs[:, moving] = block
        ys = ort_util.infer(sess, xs.reshape(len(xs), 1, 8, 8)).reshape(len(xs), -1)
        m = ys[:, label] - np.delete(ys, label, 1).max(1)
        j = int(np.argmin(m))
        if m[j] < best:
            best, witness = float(m[j]), xs[j]
        done += len(block)
    answer = "unsat" if best > 0 else ("sat" if best < 0 else "tie")
    return {"answer": answer, "points": total, "margin": best, "witness": witness}


def properties(path: Path, rng: np.random.Generator, count: int, pixels: int, steps: tuple[float, ...],
               max_points: int = 0) -> list[dict]:
    """`count` boxes, one in four on a test image, three in four near a class change (on the segment from a test
    image to another of another int8 class, at a `BACK_OFF` share of the way to where the class first changes): the
    `pixels` pixels with the largest margin gradient of the float surrogate move
    by ±eps = (a step count drawn from `steps`) input grid steps (the last one, 3.6 steps, meant to reach a class
    change). Label: the int8 model's own class at the centre x0."""
    from analysis.verification.quantized import grid_index
    from analysis.verification.readers import from_onnx
    from quantize import ort as ort_util
    from tests._digits import digits

    ds = digits()
    graph = from_onnx(path)
    qin = graph.nodes[1].op
    sess = ort_util.session(path)
    s = float(qin.scale[0])
    qs, qz = qin.scale.numpy(), qin.zero.numpy()
    xs = ds.val.x.reshape(len(ds.val.x), -1).numpy().astype(np.float64)
    order = rng.permutation(len(xs))
    out = []

    def cls(x: np.ndarray) -> int:
        return int(np.argmax(ort_util.infer(sess, x[None].astype(np.float32).reshape(1, 1, 8, 8)).reshape(-1)))

    for n, i in enumerate(order):
        x0 = xs[i]
        label = cls(x0)
        if n % 4:  # three in four near a class change: on the segment to another image, where the int8 class changes
            j = next(j for j in order[n + 1:] if cls(xs[j]) != label)
            a, b = 0.0, 1.0
            for _ in range(30):
                t = (a + b) / 2
                a, b = (t, b) if cls(x0 + t * (xs[j] - x0)) == label else (a, t)
            a *= float(rng.choice(BACK_OFF))  # back towards the image: some boxes then reach the change, some not
            x0 = (x0 + a * (xs[j] - x0)).astype(np.float32).astype(np.float64)
            label = cls(x0)
        x = torch.tensor(x0[None], requires_grad=True)
        y = graph.forward(x)
        other = torch.cat([y[0, :label], y[0, label + 1:]])
        (y[0, label] - other.max()).backward()
        g = x.grad[0].abs().numpy()
        pick = np.argsort(-g)[:pixels]
        eps = float(rng.choice(steps)) * s
        lb, ub = x0.copy(), x0.copy()
        lb[pick], ub[pick] = np.clip(x0[pick] - eps, 0, 1), np.clip(x0[pick] + eps, 0, 1)
        lb, ub = lb.astype(np.float32).astype(np.float64), ub.astype(np.float32).astype(np.float64)
        lb, ub = np.minimum(lb, x0.astype(np.float32)), np.maximum(ub, x0.astype(np.float32))
        points = grid_index(ub, qs, qz, qin.qmin, qin.qmax) - grid_index(lb, qs, qz, qin.qmin, qin.qmax) + 1
        while np.prod(points[pick]) > (max_points or MAX_POINTS):  # pixels of least gradient stay at x0 until it fits
            lb[pick[-1]] = ub[pick[-1]] = np.float32(x0[pick[-1]])
            pick = pick[:-1]
        out.append({"sample": int(i), "boundary": bool(n % 4), "label": label, "lb": lb, "ub": ub, "eps_steps": eps / s,
                    "pixels": pick.tolist()})
        if len(out) == count:
            break
    return out


def verdict(path: Path, prop: dict, workdir: Path, name: str, verifier: str, timeout: float) -> dict:
    from analysis.verification.registry import get_verifier
    from analysis.verification.vnnlib import VnnlibSpec, robustness_spec, write_vnnlib
    from quantize import ort as ort_util

    spec = robustness_spec(prop["lb"], 0.0, -np.inf, np.inf, prop["label"], 10)
    spec = dataclasses.replace(spec, lb=prop["lb"], ub=prop["ub"])
    assert isinstance(spec, VnnlibSpec)
    vnn = write_vnnlib(workdir / f"{name}.vnnlib", spec)
    res = get_verifier(verifier).verify(path, vnn, timeout_s=timeout)
    out = {"status": res.status, "seconds": round(res.seconds, 3), "stage": res.stage, "message": res.message,
           "margin_lb": res.info.get("margin_lb")}
    if res.status == "sat":
        x = np.asarray(res.counterexample, dtype=np.float32).reshape(-1)
        y = ort_util.infer(ort_util.session(path), x.reshape(1, 1, 8, 8)).reshape(-1)
        out["witness_in_box"] = bool(np.all(x >= prop["lb"]) and np.all(x <= prop["ub"]))
        out["witness_misclassified"] = bool(np.max(np.delete(y, prop["label"])) > y[prop["label"]])
    return out


def agree(exact_answer: str, got: dict) -> bool:
    """No disagreement: an unsat only where the exact check finds no violation, a sat only where it finds a strict one
    (and its witness reproduces in onnxruntime)."""
    if got["status"] == "unsat":
        return exact_answer == "unsat"
    if got["status"] == "sat":
        return exact_answer == "sat" and got["witness_in_box"] and got["witness_misclassified"]
    return True


def run(instances: int, props_per: int, pixels: int, timeout: float, verifier: str, seed: int = 0,
        steps: tuple[float, ...] = (1.2, 1.6, 2.2, 3.6), max_points: int = 0) -> dict:
    from analysis.verification.readers import from_onnx
    from quantize import ort as ort_util

    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        nets = max(1, -(-instances // props_per))
        for n in range(nets):
            path = build(work, seed + n, SHAPES[n % len(SHAPES)])
            qin = from_onnx(path).nodes[1].op
            sess = ort_util.session(path)
            rng = np.random.default_rng(seed + 1000 + n)
            props = properties(path, rng, min(props_per, instances - len(rows)), pixels, steps, max_points)
            for j, prop in enumerate(props):
                ex = exact(sess, qin, prop["lb"], prop["ub"], prop["label"])
                got = verdict(path, prop, work, f"n{n}p{j}", verifier, timeout)
                rows.append({"net": n, "hidden": list(SHAPES[n % len(SHAPES)]), "sample": prop["sample"],
                             "boundary": prop["boundary"],
                             "label": prop["label"], "eps_steps": prop["eps_steps"], "pixels": len(prop["pixels"]),
                             "grid_points": ex["points"], "exact": ex["answer"], "exact_margin": ex["margin"], **got,
                             "agree": agree(ex["answer"], got),
                             "complete": got["status"] == ex["answer"] if ex["answer"] != "tie" else None})
                r = rows[-1]
                print(f"net {n} {r['hidden']} sample {r['sample']:4d} eps {r['eps_steps']:.1f} steps, "
                      f"{r['grid_points']:6d} grid points: exact {r['exact']:5s} (margin {r['exact_margin']:+.4f}), "
                      f"ours {r['status']:7s} in {r['seconds']:.2f} s ({r['stage']})", flush=True)
    decided = [r for r in rows if r["exact"] != "tie"]
    return {"verifier": verifier, "timeout_s": timeout, "pixels": pixels, "steps": list(steps), "seed": seed,
            "max_points": max_points or MAX_POINTS, "instances": len(rows),
            "disagreements": sum(not r["agree"] for r in rows),
            "exact": {a: sum(r["exact"] == a for r in rows) for a in ("unsat", "sat", "tie")},
            "ours": {a: sum(r["status"] == a for r in rows) for a in ("unsat", "sat", "timeout", "unknown", "error")},
            "complete": f"{sum(bool(r['complete']) for r in decided)}/{len(decided)}",
            "exact_sat_found": f"{sum(r['status'] == 'sat' for r in rows if r['exact'] == 'sat')}/"
                               f"{sum(r['exact'] == 'sat' for r in rows)}",
            "seconds": round(time.perf_counter() - t0, 1), "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=24)
    p.add_argument("--per-net", type=int, default=4, help="properties per trained network")
    p.add_argument("--pixels", type=int, default=12)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--verifier", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=float, nargs="+", default=[1.2, 1.6, 2.2, 3.6], help="box half-widths, in input grid steps")
    p.add_argument("--max-points", type=int, default=MAX_POINTS, help="grid points per box at most")
    p.add_argument("--out", type=Path, default=Path("benchmarks/int8-results/exact.json"))
    a = p.parse_args()
    res = run(a.instances, a.per_net, a.pixels, a.timeout, a.verifier, a.seed, tuple(a.steps), a.max_points)
    summary = {k: v for k, v in res.items() if k != "rows"}
    print(json.dumps(summary, indent=1))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
