"""Stand-ins for VNN-COMP verification benchmarks, built here from Fashion-MNIST (the public instances cannot be
downloaded here). Each stand-in is a VNN-COMP folder: onnx/, vnnlib/, instances.csv (onnx, vnnlib, limit per
row), plus standin.json (how it was made: training, accuracy, samples, ε). Deterministic: seeded, one torch
thread. The folders are generated (git-ignored); this module is the recipe.

    .venv/bin/python -m benchmarks.standins --out runs/standins                     # all three
    .venv/bin/python -m benchmarks.standins --out runs/standins --only resnet --resnet-eps 0.01
    .venv/bin/python -m benchmarks.standins --out runs/standins --only conv --calibrate 0.01,0.02,0.03

Stand-ins (`STANDINS`):
- mnist_fc: ReLU MLPs 784-256x{2,4,6}-10 trained normally (not robustly), inputs in [0, 1] and no normalization
  in the graph (as VNN-COMP's mnist_fc nets), Flatten/Gemm/Relu; the first 15 test images all three classify
  correctly; L∞ robustness at two ε per net; limits 120 s (256x2) and 300 s (256x4, 256x6) as VNN-COMP's.
- conv: a 4-layer CNN (2 Conv with stride 2 and padding 1, 2 Gemm); 15 images, two ε; 120 s (our choice).
- resnet: 2 residual blocks (Conv with padding and stride, BatchNorm folded by the export, residual Add, a
  strided 1x1 Conv shortcut, Flatten, Gemm) on Fashion-MNIST; 15 images, one ε (`--resnet-eps`); 120 s.

After writing a folder, each instance is run through the project's attack (`pgd`) and CROWN (`crown`) at
`--measure-timeout` seconds (the first two links of the staged verifier): the share neither decides is the
share that needs more than CROWN ("hard"). The results go into benchmarks/standins.json (committed) under the
stand-in's name. Where the project's reader refuses the graph (residual Add today), CROWN is recorded as not
run with the reader's message, and the attack runs on the torch model itself (float64) through the same
`attack.pgd`. `--calibrate E1,E2,...` measures the same shares for candidate ε without writing instances (how
the defaults were chosen; also recorded in standins.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from analysis.verification import attack
from analysis.verification.ops.base import UnsupportedModel
from analysis.verification.pgd_verifier import PgdVerifier
from analysis.verification.problem import Budget, Problem
from analysis.verification.readers import read
from analysis.verification.registry import get_verifier
from analysis.verification.vnnlib import robustness_spec, write_instances_csv, write_vnnlib
from pipeline.config import DataConfig
from pipeline.data import Dataset, batches, load_fashion_mnist
from quantize import ort as ort_util
from quantize.export import compare, save, to_onnx

from . import common

HERE = Path(__file__).resolve().parent
OPSET = 13  # the opset most VNN-COMP benchmarks and their tools' ONNX converters take
SAMPLES = 15
LO, HI = 0.0, 1.0  # Fashion-MNIST pixels as pipeline.data loads them

# ε per stand-in, chosen from the --calibrate tables in benchmarks/standins.json (rendered in STANDINS.md), by the rule in
# EPS_RULE:
MNIST_FC_EPS = (0.02, 0.03)
CONV_EPS = (0.01, 0.03)
RESNET_EPS = 0.005
EPS_RULE = {
    "mnist_fc": "the grid pair with about half of the instances decided by neither the attack nor CROWN (the hard "
                "half that needs branch and bound), the smaller ε mostly provable and the larger mostly attackable, "
                "like VNN-COMP's 0.03/0.05 on MNIST (Fashion-MNIST nets are less robust)",
    "conv": "the grid pair on which CROWN alone proves about half of the instances",
    "resnet": "the grid ε at which CROWN alone proves about half of the instances (8 of 15 at 0.005, measured through "
              "the engine's graph reader, which reads the residual Add)",
}


# ---------------------------------------------------------------------------------------------
# models


def mlp(depth: int, width: int = 256) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    n = 28 * 28
    for _ in range(depth):
        layers += [nn.Linear(n, width), nn.ReLU()]
        n = width
    return nn.Sequential(*layers, nn.Linear(n, 10))


def cnn4() -> nn.Sequential:
    """Conv(1→8, 4x4, stride 2, pad 1) → ReLU → Conv(8→16, 4x4, stride 2, pad 1) → ReLU → Gemm(784→100) → ReLU →
    Gemm(100→10): 1568 + 784 + 100 ReLUs."""
    return nn.Sequential(nn.Conv2d(1, 8, 4, 2, 1), nn.ReLU(), nn.Conv2d(8, 16, 4, 2, 1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(16 * 7 * 7, 100), nn.ReLU(), nn.Linear(100, 10))


class Block(nn.Module):
    """relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)); the shortcut is the identity, or a strided 1x1 Conv + BN
    where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.short(x))


class ResNet2b(nn.Module):
    """Conv(1→8, 3x3, stride 2, pad 1) + BN + ReLU (8x14x14) → Block(8→8) → Block(8→16, stride 2) (16x7x7) →
    Flatten → Gemm(784→100) → ReLU → Gemm(100→10)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.r1, self.r2 = Block(8, 8, 1), Block(8, 16, 2)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 7 * 7, 100), nn.ReLU(), nn.Linear(100, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.r2(self.r1(self.stem(x))))


# ---------------------------------------------------------------------------------------------
# shared steps


def train(model: nn.Module, ds: Dataset, epochs: int, seed: int, lr: float = 1e-3, batch: int = 128) -> nn.Module:
    """Plain (not robust) training: Adam, cross-entropy, seeded shuffles; eval mode on return."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for x, y in batches(ds.train, batch, gen):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return model.eval()


def export(model: nn.Module, path: Path, ds: Dataset) -> dict[str, Any]:
    """Fixed-batch-1 ONNX (onnxsim; BatchNorm folds into the Conv before it), checked against the model in
    onnxruntime on 256 test images."""
    proto, facts = to_onnx(model, ds.test.x[:1], OPSET, simplify=True, dynamic_batch=False)
    save(proto, path)
    return {"ops": dict(Counter(n.op_type for n in proto.graph.node)), **facts, **compare(path, model, ds.test.x[:256])}


@torch.no_grad()
def _accuracy(model: nn.Module, ds: Dataset) -> float:
    return float((model(ds.test.x).argmax(1) == ds.test.y).float().mean())


def ort_predictions(path: Path, x: torch.Tensor) -> np.ndarray:
    return ort_util.infer(ort_util.session(path), x.numpy()).argmax(-1)


def first_correct(paths: list[Path], ds: Dataset, n: int) -> tuple[list[int], dict[str, float]]:
    """The first n test images every ONNX classifies correctly (onnxruntime), and each one's test accuracy."""
    y = ds.test.y.numpy()
    preds = {p.stem: ort_predictions(p, ds.test.x) for p in paths}
    ok = np.logical_and.reduce([pr == y for pr in preds.values()])
    return [int(k) for k in np.flatnonzero(ok)[:n]], {k: float((pr == y).mean()) for k, pr in preds.items()}


def spec_for(ds: Dataset, k: int, eps: float):
    x = ds.test.x[k].double().numpy().reshape(-1)  # the float32 pixel, exactly
    return robustness_spec(x, eps, LO, HI, int(ds.test.y[k]), 10)


def vnnlib_name(k: int, eps: float) -> str:
    return f"vnnlib/prop_{k}_eps_{eps:g}.vnnlib"


class TorchNet:
    """The `forward(x)` that `attack.pgd` calls, on a torch model in float64: for graphs the project's reader
    refuses (the attack needs nothing else)."""

    def __init__(self, model: nn.Module, shape: tuple[int, ...]):
        import copy

        self.model, self.shape = copy.deepcopy(model).double().eval(), shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.reshape(-1, *self.shape))


def measure(path: Path, model: nn.Module, ds: Dataset, ks: list[int], eps_list: list[float], timeout: float,
            log: Callable[[str], None]) -> dict[str, Any]:
    """Per ε: how many of the images the project's attack (pgd) and CROWN (crown) decide, each run on its own
    at `timeout` wall seconds. "hard": neither."""
    try:
        net = read(path)
        refused = None
    except UnsupportedModel as e:
        net, refused = None, str(e).strip().splitlines()[0]
    pgd_v, crown_v = get_verifier("pgd"), get_verifier("crown")
    pgd_defaults = PgdVerifier()
    out: dict[str, Any] = {"crown": "not run: the reader refuses the graph: " + refused if refused else "run",
                           "per_eps": {}, "load_before": common.load()}
    for eps in eps_list:
        rows = []
        for k in ks:
            spec = spec_for(ds, k, eps)
            if net is not None:
                a = pgd_v.run(Problem([spec], network=net, onnx=path), Budget(timeout))
                c = crown_v.run(Problem([spec], network=net, onnx=path), Budget(timeout))
                pgd_status, crown_status, secs = a.status, c.status, (a.seconds, c.seconds)
            else:  # same attack and settings, on the torch model; the counterexample re-checked in onnxruntime
                t0 = time.perf_counter()
                x, _ = attack.pgd(TorchNet(model, tuple(ds.info.input_shape)), spec, pgd_defaults.steps,
                                  pgd_defaults.restarts, pgd_defaults.margin, pgd_defaults.seed)
                pgd_status = "unknown"
                if x is not None:
                    x32, _, _ = Problem([spec], onnx=path).confirm(0, x)  # strict violation in onnxruntime
                    pgd_status = "sat" if x32 is not None else "unknown"
                crown_status, secs = None, (time.perf_counter() - t0, None)
            rows.append({"sample": k, "pgd": pgd_status, "crown": crown_status,
                         "pgd_seconds": round(secs[0], 4), "crown_seconds": None if secs[1] is None else round(secs[1], 4)})
        n = len(rows)
        sat = sum(r["pgd"] == "sat" for r in rows)
        unsat = sum(r["crown"] == "unsat" for r in rows)
        hard = sum(r["pgd"] != "sat" and r["crown"] != "unsat" for r in rows) if net is not None else None
        out["per_eps"][f"{eps:g}"] = {"instances": n, "pgd_sat": sat, "crown_unsat": unsat if net is not None else None,
                                      "hard": hard, "rows": rows}
        log(f"  {path.stem} eps {eps:g}: pgd sat {sat}/{n}" + (f", crown unsat {unsat}/{n}, hard {hard}/{n}" if net is not None else ""))
    out["load_after"] = common.load()
    return out


# ---------------------------------------------------------------------------------------------
# the stand-ins: (name, model, epochs, limit) per network, and the ε


def nets_mnist_fc() -> list[tuple[str, Callable[[], nn.Module], int, float]]:
    return [(f"mnist-net_256x{d}", lambda d=d: mlp(d), 10, 120.0 if d == 2 else 300.0) for d in (2, 4, 6)]


def nets_conv() -> list[tuple[str, Callable[[], nn.Module], int, float]]:
    return [("fmnist-cnn4", cnn4, 10, 120.0)]


def nets_resnet() -> list[tuple[str, Callable[[], nn.Module], int, float]]:
    return [("fmnist-resnet2b", ResNet2b, 10, 120.0)]


STANDINS: dict[str, Callable[[], list[tuple[str, Callable[[], nn.Module], int, float]]]] = {
    "mnist_fc": nets_mnist_fc, "conv": nets_conv, "resnet": nets_resnet}


def eps_of(name: str, args: argparse.Namespace) -> list[float]:
    return {"mnist_fc": list(args.mnist_fc_eps), "conv": list(args.conv_eps), "resnet": [args.resnet_eps]}[name]


def build(name: str, args: argparse.Namespace, ds: Dataset, log: Callable[[str], None]) -> dict[str, Any]:
    """Train, export, pick the samples; then either write the folder and measure its instances, or (with
    --calibrate) only measure the candidate ε."""
    folder = Path(args.out) / name
    (folder / "onnx").mkdir(parents=True, exist_ok=True)
    models, facts = {}, {}
    for i, (net_name, make, epochs, limit) in enumerate(STANDINS[name]()):
        path = folder / "onnx" / f"{net_name}.onnx"
        weights = folder / "weights" / f"{net_name}.pt"  # a rebuild (other ε) reuses the same training
        recipe = {"epochs": epochs, "seed": args.seed + i}
        t0 = time.perf_counter()
        torch.manual_seed(args.seed + i)
        model = make()
        saved = torch.load(weights) if weights.is_file() else None
        if saved is not None and saved["recipe"] == recipe:
            model.load_state_dict(saved["state"])
            model.eval()
            recipe["weights"] = f"reused {weights.name}"
        else:
            train(model, ds, epochs, args.seed + i)
            weights.parent.mkdir(exist_ok=True)
            torch.save({"recipe": recipe, "state": model.state_dict()}, weights)
        facts[net_name] = {**recipe, "limit_s": limit, "seconds": round(time.perf_counter() - t0, 1),
                           **export(model, path, ds)}
        models[net_name] = (path, model, limit)
        log(f"  {net_name}: {recipe.get('weights', f'trained {epochs} epochs')} in {facts[net_name]['seconds']} s, "
            f"ops {facts[net_name]['ops']}, test accuracy {_accuracy(model, ds):.4f}")
    ks, acc = first_correct([p for p, _, _ in models.values()], ds, SAMPLES)
    for net_name, a in acc.items():
        facts[net_name]["test_accuracy"] = a
    calibrate = [float(e) for e in args.calibrate.split(",")] if args.calibrate else None
    eps_list = calibrate or eps_of(name, args)
    out: dict[str, Any] = {"networks": facts, "samples": ks, "eps": eps_list, "data": "Fashion-MNIST test split",
                           "measure_timeout_s": args.measure_timeout}
    if calibrate is None:
        rows = []
        for net_name, (path, _, limit) in models.items():
            for k in ks:
                for eps in eps_list:
                    rel = vnnlib_name(k, eps)
                    write_vnnlib(folder / rel, spec_for(ds, k, eps),
                                 comment=f"Fashion-MNIST test image {k} (label {int(ds.test.y[k])}), L-inf eps {eps:g}")
                    rows.append((f"onnx/{path.name}", rel, limit))
        write_instances_csv(folder / "instances.csv", rows)
        out["instances"] = len(rows)
        (folder / "standin.json").write_text(json.dumps({"name": name, "argv": sys.argv[1:], **out}, indent=2) + "\n")
        log(f"  {folder}: {len(rows)} instances")
    out["measured"] = {n: measure(p, m, ds, ks, eps_list, args.measure_timeout, log) for n, (p, m, _) in models.items()}
    return out


def markdown(record: dict[str, Any]) -> str:
    """benchmarks/STANDINS.md from benchmarks/standins.json: each stand-in's networks and, per ε, what the attack
    and CROWN alone decide (the built ε, then the calibration grid)."""
    from pipeline.render import table

    out = ["# Verification stand-ins (generated from benchmarks/standins.json by `python -m benchmarks.standins`)",
           "Fashion-MNIST, built here; NOT the public VNN-COMP benchmarks. Folders: `runs/standins/<name>/` (git-ignored), "
           "rebuilt by the command in each section. Per ε: of the 15 images, how many the project's attack alone "
           "(`pgd`, the staged verifier's first link) finds a counterexample for, how many CROWN alone (`crown`) proves, "
           "and how many neither decides (\"hard\": they need α-CROWN, branch and bound or a stronger attack); each run "
           "on its own with the measure limit."]
    for name in STANDINS:
        for key, what in ((name, "built"), (f"{name}.calibrate", "calibration")):
            rec = record.get(key)
            if not rec:
                continue
            nets = ", ".join(f"`{n}` (test accuracy {f['test_accuracy']:.4f}, {f['epochs']} epochs, limit {f['limit_s']:g} s, "
                             f"ops {f['ops']})" for n, f in rec["networks"].items())
            rows = []
            for n, m in rec["measured"].items():
                for eps, e in m["per_eps"].items():
                    rows.append([n, eps, e["instances"], e["pgd_sat"], "—" if e["crown_unsat"] is None else e["crown_unsat"],
                                 "—" if e["hard"] is None else e["hard"]])
            crown_note = next((m["crown"] for m in rec["measured"].values() if m["crown"] != "run"), "")
            per = [e for m in rec["measured"].values() for e in m["per_eps"].values()]
            total = sum(e["instances"] for e in per)
            share = (f" Attack: {sum(e['pgd_sat'] for e in per)} of {total}"
                     + (f"; CROWN: {sum(e['crown_unsat'] for e in per)} of {total} "
                        f"({100 * sum(e['crown_unsat'] for e in per) / total:.0f}%); neither: {sum(e['hard'] for e in per)} "
                        f"of {total} ({100 * sum(e['hard'] for e in per) / total:.0f}%)" if per[0]["hard"] is not None else "")
                     + f". ε chosen as {EPS_RULE[name]}." if what == "built" else "")
            out.append(f"## {name} ({what})\n\n`python -m benchmarks.standins {' '.join(rec['argv'])}`; "
                       f"{rec.get('instances', 0) or 'no'} instances written; samples (test indices) {rec['samples']}; "
                       f"measure limit {rec['measure_timeout_s']:g} s. Networks: {nets}."
                       + (f" CROWN {crown_note}." if crown_note else "") + share + "\n\n"
                       + table(["network", "ε", "images", "attack sat", "CROWN unsat", "neither"], rows))
    return "\n\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/standins", help="where the folders go: OUT/<stand-in>/ (default runs/standins)")
    p.add_argument("--only", default=",".join(STANDINS), help=f"stand-ins, comma-separated: {', '.join(STANDINS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mnist-fc-eps", type=float, nargs=2, default=MNIST_FC_EPS, metavar="EPS")
    p.add_argument("--conv-eps", type=float, nargs=2, default=CONV_EPS, metavar="EPS")
    p.add_argument("--resnet-eps", type=float, default=RESNET_EPS, metavar="EPS")
    p.add_argument("--calibrate", default="", metavar="E1,E2,...",
                   help="measure these candidate ε (attack, CROWN) instead of writing instances")
    p.add_argument("--measure-timeout", type=float, default=30.0, help="wall seconds for each attack / CROWN run")
    p.add_argument("--record", default=str(HERE / "standins.json"), help="where the measurements are merged")
    args = p.parse_args(argv)
    names = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [n for n in names if n not in STANDINS]
    if bad:
        print(f"error: unknown stand-in {bad[0]!r}; choose from {', '.join(STANDINS)}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    ds = load_fashion_mnist(DataConfig())
    record_path = Path(args.record)
    record: dict[str, Any] = json.loads(record_path.read_text()) if record_path.is_file() else {}
    record.update(machine=common.machine(), versions=common.versions())

    def log(msg: str) -> None:
        print(msg, flush=True)

    for name in names:
        log(f"[{name}] load {common.load()}")
        t0 = time.perf_counter()
        res = build(name, args, ds, log)
        key = f"{name}.calibrate" if args.calibrate else name
        record[key] = {**res, "argv": sys.argv[1:] if argv is None else list(argv), "seconds": round(time.perf_counter() - t0, 1)}
        record_path.write_text(json.dumps(record, indent=2) + "\n")
        (record_path.parent / "STANDINS.md").write_text(markdown(record))
        log(f"[{name}] done in {time.perf_counter() - t0:.0f} s, load {common.load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
