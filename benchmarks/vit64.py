"""A 64-token ViT through `analysis.api.verify` (issue 40, item 2's ViT goal): timm's `vit_tiny_patch16_224` shrunk to
64 tokens (img 32, patch 4, embed_dim 64, depth 2, 2 heads, ReLU MLPs), trained briefly on sklearn's digits upscaled
to 32×32 (3 channels), then verified at ε 0.002 with `timeout_s=60` on the first test samples; every sat's witness
re-run in onnxruntime, every unsat attacked (PGD in float64 and random points through onnxruntime).

    flock /tmp/heavy.lock python -m benchmarks.vit64 train            # the model, seeded (writes --model)
    flock /tmp/heavy.lock python -m benchmarks.vit64 profile          # one CROWN pass, site by site
    flock /tmp/heavy.lock python -m benchmarks.vit64 verify --tag after   # api.verify on --samples test samples
    flock /tmp/heavy.lock python -m benchmarks.vit64 deit --epochs 4 --samples 5 --timeout 10 --tag after  # deit_tiny 32×2

`verify` merges its result under `--tag` into benchmarks/verify-results/vit64.json (run it from another checkout's
code for a "before": `PYTHONPATH=OTHER python -m benchmarks.vit64 verify --tag before --code OTHER`)."""

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

HERE = Path(__file__).resolve().parent
OUT = HERE / "verify-results"
MODEL = Path("/tmp/vit64-model.pt")
HEADS = 2
MODEL_NOTE = "40 epochs of AdamW (one-cycle, max lr 2e-3, batch 64, seed 0) on sklearn digits upscaled to 32×32"


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """sklearn's digits in [0, 1] as [N, 1, 8, 8]: the first 1400 train, the other 397 test."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(y)
    return x[:1400], y[:1400], x[1400:], y[1400:]


def _attack_float(model: torch.nn.Module, x0: np.ndarray, label: int, eps: float, restarts: int = 40, steps: int = 100) -> bool:
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


def timm_vit(img: int = 32, patch: int = 4, chans: int = 3, dim: int = 64, depth: int = 2, heads: int = HEADS,
             classes: int = 10) -> torch.nn.Module:
    """timm's `vit_tiny_patch16_224` at this size with ReLU MLPs, seeded (the defaults: the 64-token ViT)."""
    from torch import nn

    from pipeline.extras import import_timm

    timm = import_timm()
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=img, patch_size=patch, in_chans=chans,
                             embed_dim=dim, depth=depth, num_heads=heads, num_classes=classes, act_layer=nn.ReLU).eval()


def digits_rgb(img: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """sklearn's digits in [0, 1], bilinearly upscaled to img×img, 3 equal channels: the first 1400 train, 397 test."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16, dtype=torch.float32).reshape(-1, 1, 8, 8)
    x = F.interpolate(x, size=(img, img), mode="bilinear", align_corners=False).clamp(0, 1).repeat(1, 3, 1, 1)
    y = torch.tensor(y)
    return x[:1400], y[:1400], x[1400:], y[1400:]


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model.eval()(x).argmax(1) == y).float().mean())


def fit(model: torch.nn.Module, xtr: torch.Tensor, ytr: torch.Tensor, epochs: int, seed: int, opt, sched=None) -> None:
    """Cross-entropy in batches of 64 in a seeded order, `sched` stepped per batch; leaves the model in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for i in torch.randperm(len(xtr), generator=gen).split(64):
            opt.zero_grad()
            F.cross_entropy(model(xtr[i]), ytr[i]).backward()
            opt.step()
            if sched is not None:
                sched.step()
    model.eval()


def section_train(a) -> dict:
    torch.manual_seed(a.seed)
    model = timm_vit(heads=a.heads)
    xtr, ytr, xte, yte = digits_rgb()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    steps = a.epochs * math.ceil(len(xtr) / 64)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    t0 = time.perf_counter()
    fit(model, xtr, ytr, a.epochs, a.seed, opt, sched)
    out = {"epochs": a.epochs, "heads": a.heads, "train_seconds": round(time.perf_counter() - t0, 1),
           "acc_train": accuracy(model, xtr, ytr), "acc_test": accuracy(model, xte, yte)}
    torch.save(model.state_dict(), a.model)
    print(out)
    return out


def load(a) -> torch.nn.Module:
    m = timm_vit(heads=a.heads)
    m.load_state_dict(torch.load(a.model))
    return m.eval()


def section_profile(a) -> dict:
    """One `Bounder.crown()` on test sample --start at --eps, each CROWN query timed (node, op, units, seconds, widths),
    then every site's interval and the margin's CROWN bound (or what stopped it)."""
    from analysis.verification.bounds import Bounder, Spec
    from analysis.verification.readers import from_torch

    model = load(a)
    net = from_torch(model, (3, 32, 32))
    _, _, xte, yte = digits_rgb()
    x0, label = xte[a.start].reshape(-1).double(), int(yte[a.start])
    b = Bounder(net, (x0 - a.eps).clamp(0, 1), (x0 + a.eps).clamp(0, 1))
    if a.cut_depth != "default":
        b.cut_depth = None if a.cut_depth == "none" else int(a.cut_depth)
    queries = []
    orig = b._rows

    def timed(j, idx, n, float32=False, cuts=None):
        t = time.perf_counter()
        lo, hi = orig(j, idx, n, float32, cuts)
        queries.append({"node": j, "op": type(b.net.nodes[j].op).__name__, "units": idx.numel(),
                        "seconds": round(time.perf_counter() - t, 2), "max_width": float((hi - lo).max())})
        return lo, hi

    b._rows = timed
    t0 = time.perf_counter()
    error = ""
    try:
        b.crown()
    except Exception as e:  # an OutOfDomain is the finding
        error = f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    sites = []
    for s in range(len(b.sites)):
        lo, hi = b.pre[s]
        op = b.op(s)
        on = b.needed()[b.site_input[s]]  # the units the output depends on (the rest keep interval arithmetic's)
        sites.append({"site": s, "op": type(op).__name__, "source": getattr(op, "source", ""), "units": lo.numel(),
                      "needed": int(on.sum()), "max_width": float((hi - lo)[on].max()), "min": float(lo[on].min()),
                      "max": float(hi[on].max())})
    C = -torch.eye(10, dtype=torch.float64)[[j for j in range(10) if j != label]]
    C[:, label] = 1.0
    try:
        margin = float(b.spec_bounds(Spec(C, torch.zeros(9))).min())
    except Exception as e:
        margin = f"{type(e).__name__}: {e}"
    out = {"sample": a.start, "eps": a.eps, "cut_depth": b.cut_depth, "crown_seconds": round(seconds, 1),
           "crown_error": error, "queries": queries, "query_units": sum(q["units"] for q in queries), "sites": sites,
           "margin_lb": margin}
    for q in queries:
        print(q)
    for s in sites:
        print(s)
    print({k: v for k, v in out.items() if k not in ("queries", "sites")})
    return out


def section_deit(a) -> dict:
    """The `deit_tiny` built-in at dim 32, depth 2, 4 heads, patch 4 with ReLU, trained --epochs on sklearn's 8×8
    digits (seeded), then `api.verify` at ε --eps on the first --samples test samples, `timeout_s` --timeout."""
    from torch import nn

    from analysis import api
    from pipeline.config import ModelConfig
    from pipeline.models import deit_tiny

    torch.manual_seed(a.seed)
    def relu(ch: int) -> nn.Module:
        return nn.ReLU()

    relu.expansion = 1  # type: ignore[attr-defined]  # outputs per input unit (`pipeline.models.MakeAct`)
    model = deit_tiny(ModelConfig(name="deit_tiny", dim=32, depth=2, heads=4, patch_size=4), (1, 8, 8), 10, relu)
    xtr, ytr, xte, yte = digits()
    fit(model, xtr, ytr, a.epochs, a.seed, torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4))
    t0 = time.perf_counter()
    res = api.verify(model, (xte, yte), epsilons=[a.eps], low=0.0, high=1.0, samples=a.samples, timeout_s=a.timeout,
                     progress=False)
    rows = [{k: r.get(k) for k in ("sample", "result", "reason", "seconds", "margin_lb")} for r in res["rows"]]

    for r in rows:  # every unsat attacked (PGD in float64, 40 restarts × 100 steps): a counterexample would be a wrong answer
        if r["result"] == "unsat":
            r["attack_broke_it"] = _attack_float(model, xte[r["sample"]].numpy().astype(np.float64), int(yte[r["sample"]]),
                                                 a.eps)
    out = {"acc_test": accuracy(model, xte, yte), "epochs": a.epochs, "eps": a.eps, "timeout_s": a.timeout,
           "wall_s": round(time.perf_counter() - t0, 1), "first_pass": res.get("first_pass"), "rows": rows,
           "decided": sum(r["result"] in ("sat", "unsat") for r in rows), "code": a.code}
    print(out)
    return out


def _witness_ok(path, x, x0, eps, label) -> bool:
    """onnxruntime on the float32 witness: inside the box and strictly misclassified."""
    from quantize import ort as ort_util

    sess = ort_util.session(path)
    x = np.asarray(x, dtype=np.float32).reshape(1, *x0.shape)
    inside = bool(np.all(x >= np.clip(x0 - eps, 0, 1).astype(np.float32)) and np.all(x <= np.clip(x0 + eps, 0, 1).astype(np.float32)))
    y = sess.run(None, {sess.get_inputs()[0].name: x})[0][0].astype(np.float64)
    return inside and float(np.delete(y, label).max()) > float(y[label])


def section_verify(a) -> dict:
    from analysis import api


    model = load(a)
    _, _, xte, yte = digits_rgb()
    x, y = xte[a.start:a.start + a.samples], yte[a.start:a.start + a.samples]
    t0 = time.perf_counter()
    res = api.verify(model, (x, y), epsilons=[a.eps], low=0.0, high=1.0, samples=len(x), timeout_s=a.timeout,
                     progress=False)
    wall = time.perf_counter() - t0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vit64.onnx"
        api.export_onnx(model, x[:1], path)
        for r in res["rows"]:
            i = r["sample"]
            x0, label = x[i].numpy().astype(np.float64), int(y[i])
            row = {k: r.get(k) for k in ("result", "reason", "seconds", "margin_lb", "message")}
            row["sample"] = a.start + i
            if r["result"] == "sat":
                row["witness_strictly_unsafe_in_onnxruntime"] = _witness_ok(path, r["counterexample"], x0, a.eps, label)
            if r["result"] == "unsat":
                row["attack_broke_it"] = _attack_float(model, x0, label, a.eps) or _attack_onnx(path, x0, label, a.eps, n=500)
            rows.append(row)
    out = {"wall_s": round(wall, 1), "first_pass": res.get("first_pass"), "note": res.get("note"), "rows": rows}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, default=str))
    for r in rows:
        print(r)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("section", choices=["train", "profile", "verify", "deit"])
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--heads", type=int, default=HEADS)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--eps", type=float, default=0.002)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--tag", default="after")
    p.add_argument("--start", type=int, default=0, help="verify: the first test sample; profile: the sample")
    p.add_argument("--cut-depth", default="default", help="profile: Bounder.cut_depth (an int, none, or default)")
    p.add_argument("--code", default="", help="verify: the checkout whose analysis/ runs (recorded)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    res = {"train": section_train, "verify": section_verify, "profile": section_profile,
           "deit": section_deit}[a.section](a)
    if a.section == "deit":
        path = OUT / "vit64.json"
        allres = json.loads(path.read_text()) if path.exists() else {}
        allres.setdefault("deit_tiny", {})[a.tag] = res
        path.write_text(json.dumps(allres, indent=1, default=str) + "\n")
    if a.section == "profile":
        path = OUT / "vit64.json"
        allres = json.loads(path.read_text()) if path.exists() else {}
        allres.setdefault("profile", {})[f"{a.tag}-sample{a.start}-depth{a.cut_depth}"] = res
        path.write_text(json.dumps(allres, indent=1, default=str) + "\n")
    if a.section == "verify":
        import analysis

        path = OUT / "vit64.json"
        allres = json.loads(path.read_text()) if path.exists() else {}
        part = allres.setdefault(a.tag, {"model": f"timm vit_tiny_patch16_224, img 32, patch 4, dim 64, depth 2, "
                                                  f"{a.heads} heads, ReLU; trained {MODEL_NOTE}",
                                         "eps": a.eps, "timeout_s": a.timeout, "code": a.code or str(Path(analysis.__file__).parent.parent),
                                         "machine": {"cpus": __import__("os").cpu_count(), "torch_threads": 1,
                                                     "python": platform.python_version(), "torch": torch.__version__},
                                         "chunks": {}})
        part["chunks"][str(a.start)] = res
        part["rows"] = sorted((r for c in part["chunks"].values() for r in c["rows"]), key=lambda r: r["sample"])
        n = len(part["rows"])
        part["decided"] = sum(r["result"] in ("sat", "unsat") for r in part["rows"])
        part["budget"] = sum(r.get("reason") == "budget" for r in part["rows"])
        part["summary"] = f"{part['decided']}/{n} decided, {part['budget']} without a bound pass (budget)"
        path.write_text(json.dumps(allres, indent=1, default=str) + "\n")
        print(part["summary"])


if __name__ == "__main__":
    main()
