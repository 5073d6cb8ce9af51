"""The GPU issue's measurements in one process (`benchmarks/gpu.sh` calls this; needs CUDA):

  ceilings   device-to-device copy bandwidth (bytes read + written), the reference for the kernels' share
  op         the LambdaGELU module's forward+backward (λ learned and frozen) ÷ nn.GELU's, CUDA events, 7 interleaved
             rounds (median); host time per forward+backward without waiting for the GPU; each Triton kernel's
             device time (a CUDA graph of repeated launches) and its bandwidth as a share of the copy's
  epochs     training epoch ÷ the GELU epoch, one process, interleaved: the default MLP on Fashion-MNIST, the CNN on
             its 10k subset, ResNet-18 on CIFAR-shaped synthetic data (random images, 10 classes: no CIFAR files on
             the machine; the epoch's cost does not depend on the pixels), each on the train loop's default CUDA path
             (whole-step CUDA graphs) and eager
  compile    the default MLP's epoch with torch.compile(mode="reduce-overhead") against the captured steps
             (--compile; a compile takes tens of seconds per variant)

    python -m benchmarks.gpu OUT_DIR [--sections op,epochs] [--quick]

Writes OUT_DIR/gpu.json and prints a table per section.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from pipeline import kernels
from pipeline.activations import LambdaGELU, s_from_lambda
from pipeline.kernels import triton_gate as tg

from . import common

T = 0.1  # the default temperature
ROUNDS = 7
OP_CASES = [  # name, shape, dtype, λ size (the channel count; channel λ), calls per round
    ("4096x4096 fp32", (4096, 4096), torch.float32, 4096, 30),
    ("4096x4096 bf16", (4096, 4096), torch.bfloat16, 4096, 30),
    ("128x256 fp32", (128, 256), torch.float32, 256, 300),
    ("256x64x32x32 fp32 channel", (256, 64, 32, 32), torch.float32, 64, 30),
    ("256x64x32x32 bf16 channel", (256, 64, 32, 32), torch.bfloat16, 64, 30),
]
GOALS = {"4096x4096 fp32": 1.10, "4096x4096 bf16": 1.10, "256x64x32x32 fp32 channel": 1.10,
         "256x64x32x32 bf16 channel": 1.10, "128x256 fp32": 1.25}


def _events_ms(fn: Callable[[], Any], iters: int) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """GB/s of a device-to-device copy, bytes read plus written (random data: zeros can run faster)."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ms = _events_ms(lambda: dst.copy_(src), iters)
    return 2 * nbytes / ms / 1e6


def _gate(n: int, frozen: bool) -> nn.Module:
    g = LambdaGELU(nn.Parameter(torch.full((n,), s_from_lambda(1.05, T))), T).cuda()
    if frozen:
        g.freeze(torch.tensor(20.0))
    return g


def _fwd_bwd(mod: nn.Module, x: torch.Tensor, gy: torch.Tensor) -> Callable[[], None]:
    params = [p for p in mod.parameters() if p.requires_grad and not getattr(mod, "_frozen", False)]

    def once():
        torch.autograd.grad(mod(x), [x] + params, gy)
    return once


def _kernel_ms(x: torch.Tensor, p: torch.Tensor, from_s: bool, reps: int = 20) -> dict[str, float]:
    """Device time of one forward and one backward kernel launch: `reps` launches captured in a CUDA graph, so
    the host's launch path is not in the number."""
    plan = tg._plan(x, p, 1)  # channel dim 1 of [N, C] and [N, C, H, W]
    gy = torch.randn_like(x)
    fwd = lambda: tg._forward(x, p, T, 0, plan, from_s)  # noqa: E731
    bwd = lambda: tg._backward(gy, x, p, T, 0, plan, from_s, True, from_s)  # noqa: E731
    out = {}
    for name, fn in (("forward", fwd), ("backward", bwd)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        g.replay()
        torch.cuda.synchronize()
        out[name] = _events_ms(g.replay, 5) / reps
    return out


def bench_op(quick: bool = False) -> dict[str, Any]:
    gbps = copy_bandwidth()
    rows = []
    for name, shape, dt, n, iters in OP_CASES:
        if quick:
            iters = max(3, iters // 10)
        x = torch.randn(shape, device="cuda", dtype=dt, requires_grad=True)
        gy = torch.randn_like(x)
        mods = {"gelu": nn.GELU().cuda(), "lambda_gelu": _gate(n, False), "lambda_gelu[frozen]": _gate(n, True)}
        fns = {k: _fwd_bwd(m, x, gy) for k, m in mods.items()}
        for f in fns.values():  # compile, plan, runner
            for _ in range(3):
                f()
        torch.cuda.synchronize()
        t: dict[str, list[float]] = {k: [] for k in fns}
        for r in range(ROUNDS):
            names = list(fns)
            for k in names[r % 3:] + names[:r % 3]:
                t[k].append(_events_ms(fns[k], iters))
        med = {k: statistics.median(v) for k, v in t.items()}
        # host time per call: launches only (the queue is far from full), then one wait
        host = {}
        for k, f in fns.items():
            torch.cuda.synchronize()
            h = 50 if not quick else 5
            t0 = time.perf_counter()
            for _ in range(h):
                f()
            host[k] = (time.perf_counter() - t0) / h * 1e6
            torch.cuda.synchronize()
        s = mods["lambda_gelu"].s.detach()
        lam = mods["lambda_gelu[frozen]"].lam_fixed
        xd = x.detach()
        kern = {"learned": _kernel_ms(xd, s, True), "frozen": _kernel_ms(xd, lam, False)}
        nbytes = x.numel() * x.element_size()
        for v in kern.values():  # forward reads x, writes y; backward reads x and ∂y, writes ∂x
            v["forward_GBps"] = 2 * nbytes / v["forward"] / 1e6
            v["backward_GBps"] = 3 * nbytes / v["backward"] / 1e6
            v["forward_share_of_copy"] = v["forward_GBps"] / gbps
            v["backward_share_of_copy"] = v["backward_GBps"] / gbps
        row = {"case": name, "shape": list(shape), "dtype": str(dt).replace("torch.", ""), "lambda_size": n,
               "ms": med, "ratio_vs_gelu": {k: med[k] / med["gelu"] for k in med},
               "host_us": host, "host_minus_gelu_us": {k: host[k] - host["gelu"] for k in host},
               "kernels_ms": kern, "goal": GOALS[name]}
        rows.append(row)
        print(f"{name:28s} gelu {med['gelu']:.4f} ms  λ {row['ratio_vs_gelu']['lambda_gelu']:.3f}x  "
              f"frozen {row['ratio_vs_gelu']['lambda_gelu[frozen]']:.3f}x  (goal ≤ {GOALS[name]})  host µs "
              + " ".join(f"{k}={v:.1f}" for k, v in host.items())
              + f"  fwd {kern['learned']['forward_share_of_copy']:.0%} bwd {kern['learned']['backward_share_of_copy']:.0%} of copy",
              flush=True)
    return {"copy_GBps": gbps, "cases": rows, "kernel_status": kernels.status()}


# ---------------------------------------------------------------------------------------------
# Epochs


def _epoch_runner(cfg, ds, act: str, frozen: bool, graphs_on: bool, device: str = "cuda"):
    """(one epoch -> seconds) for a fresh model of `act` through the train loop's own `_train_epoch`."""
    from pipeline import step_graph
    from pipeline.activations import hardenable_gates
    from pipeline.data import on_device
    from pipeline.models import build_model, make_spec
    from pipeline.schedule import param_groups
    from pipeline.train_loop import OPTIMIZERS, EpochSums, _train_epoch, fused_optimizer

    device = torch.device(device)
    torch.manual_seed(cfg.seed)
    model = build_model(make_spec(cfg.model, act, cfg.gate, ds.info)).to(device)
    if frozen:
        for gate in hardenable_gates(model):
            gate.freeze(torch.tensor(20.0))
    opt = OPTIMIZERS[cfg.train.optimizer](param_groups(model, cfg.train.lr, cfg.train.weight_decay, cfg.gate.lr_mult),
                                          cfg.train, graphs_on, fused_optimizer(model, device))
    split = on_device(ds.train, device)
    graphs = step_graph.GraphSteps(split.x, split.y, cfg.data.batch_size, EpochSums(device)) if graphs_on else None
    state = {"epoch": 0}

    def epoch() -> float:
        state["epoch"] += 1
        common.sync(device)
        t0 = time.perf_counter()
        _train_epoch(model, opt, split, cfg, state["epoch"], device, graphs=graphs)
        common.sync(device)
        return time.perf_counter() - t0
    return epoch


def _synthetic_cifar(n: int = 10000, seed: int = 0):
    """CIFAR-10-shaped random data (3×32×32 in [0, 1], 10 classes): what an epoch costs does not depend on the pixels."""
    from pipeline.data import DataInfo, Dataset, Split

    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    info = DataInfo("cifar10-synthetic", (3, 32, 32), 10, [0.5, 0.5, 0.5], [0.25, 0.25, 0.25], 0.0, 1.0)
    return Dataset(info, Split(x, y), Split(x[:512], y[:512]), Split(x[:512], y[:512]))


def bench_epochs(quick: bool = False, device: str = "cuda", eager: bool = False) -> dict[str, Any]:
    """Epoch ratios on the default CUDA path for every model; eager beside it for the default MLP (all with `eager`)."""
    from pipeline.config import Config, apply_overrides
    from pipeline.data import dataset_for

    setups = [("default MLP (Fashion-MNIST)", [], None),
              ("CNN (Fashion-MNIST, 10k subset)", ["model.name=cnn", "data.subset=10000", "train.grad_clip=1.0",
                                                    "train.optimizer=adamw", "train.lr=0.001"], None),
              ("ResNet-18 (CIFAR-shaped synthetic, 10k)", ["model.name=resnet18_cifar", "data.batch_size=128",
                                                           "train.optimizer=sgd"], _synthetic_cifar)]
    reps = 1 if quick else 3
    out = []
    for label, over, make in setups:
        cfg = apply_overrides(Config(), ["data.root=data", *over])
        ds = make() if make else dataset_for(cfg)
        if quick:
            from pipeline.data import Split

            ds.train = Split(ds.train.x[:2048], ds.train.y[:2048])
        paths = (("cuda_graph", True), ("eager", False)) if device == "cuda" and (eager or not make and not over) else (
            (("cuda_graph", True),) if device == "cuda" else (("eager", False),))
        for path, graphs_on in paths:
            runners = {name: _epoch_runner(cfg, ds, act, frozen, graphs_on, device)
                       for name, act, frozen in (("gelu", "gelu", False), ("lambda_gelu", "lambda_gelu", False),
                                                 ("lambda_gelu[frozen]", "lambda_gelu", True))}
            for f in runners.values():  # the first epoch compiles, plans, captures
                f()
            times: dict[str, list[float]] = {k: [] for k in runners}
            for r in range(reps):
                names = list(runners)
                for k in names[r % 3:] + names[:r % 3]:
                    times[k].append(runners[k]())
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {"setup": label, "path": path, "train_examples": len(ds.train), "epoch_s": med,
                   "ratio_vs_gelu": {k: common.paired_ratio(times[k], times["gelu"]) for k in times}}
            out.append(row)
            print(f"{label:42s} {path:10s} gelu {med['gelu']:.3f} s  λ {med['lambda_gelu'] / med['gelu']:.3f}x  "
                  f"frozen {med['lambda_gelu[frozen]'] / med['gelu']:.3f}x", flush=True)
    return {"rows": out}


def bench_compile(quick: bool = False) -> dict[str, Any]:
    """The default MLP's epoch: whole-step graphs against torch.compile(mode="reduce-overhead") of the model."""
    from pipeline.config import Config, apply_overrides
    from pipeline.data import dataset_for

    out = {}
    for act in ("gelu", "lambda_gelu"):
        for label, over in (("cuda_graph", []), ("compile_reduce_overhead", ["train.compile=true",
                                                                           "train.compile_mode=reduce-overhead"])):
            cfg = apply_overrides(Config(), ["data.root=data", *over])
            ds = dataset_for(cfg)
            t0 = time.perf_counter()
            if label == "cuda_graph":
                f = _epoch_runner(cfg, ds, act, False, True)
            else:
                f = _compiled_epoch_runner(cfg, ds, act)
            first = f()
            setup_s = time.perf_counter() - t0
            ts = [f() for _ in range(1 if quick else 3)]
            out[f"{act} {label}"] = {"epoch_s": statistics.median(ts), "first_epoch_s": first, "setup_s": setup_s}
            print(f"{act:12s} {label:24s} epoch {statistics.median(ts):.3f} s (first {first:.1f} s)", flush=True)
    return out


def _compiled_epoch_runner(cfg, ds, act: str):
    from pipeline.data import on_device
    from pipeline.models import build_model, make_spec
    from pipeline.schedule import param_groups
    from pipeline.train_loop import OPTIMIZERS, _train_epoch

    device = torch.device("cuda")
    torch.manual_seed(cfg.seed)
    model = build_model(make_spec(cfg.model, act, cfg.gate, ds.info)).to(device)
    opt = OPTIMIZERS[cfg.train.optimizer](param_groups(model, cfg.train.lr, cfg.train.weight_decay, cfg.gate.lr_mult),
                                          cfg.train, False, True)
    net = torch.compile(model, mode="reduce-overhead")  # the gates as torch.ops.lambda_gates (kernels/gate_op.py)
    split = on_device(ds.train, device)
    state = {"epoch": 0}

    def epoch() -> float:
        state["epoch"] += 1
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        _train_epoch(net, opt, split, cfg, state["epoch"], device)
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    return epoch


SECTIONS = {"op": bench_op, "epochs": bench_epochs, "compile": bench_compile}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--sections", default="op,epochs")
    p.add_argument("--quick", action="store_true", help="fewer calls and a 2048-example epoch: checks the script runs")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA device; run it on a GPU machine (bash benchmarks/gpu.sh)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "versions": common.versions(),
                           "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path = args.out / "gpu.json"
    for name in [s.strip() for s in args.sections.split(",") if s.strip()]:
        t0 = time.perf_counter()
        try:
            res[name] = SECTIONS[name](args.quick)
        except Exception as exc:  # one failing section must not lose the others' numbers
            import traceback

            res[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc().splitlines()[-15:]}
            print(f"[{name}] failed: {res[name]['error']}", flush=True)
        res.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
        path.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
