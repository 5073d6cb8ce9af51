"""Branch-and-bound settings side by side on the hard mnist_fc stand-ins, one instance at a time (results appended by
hand to benchmarks/standin-results/bab-knobs-30s.txt, with the commit each line was measured on):

    .venv/bin/python -m benchmarks.bab_knobs TAG [--timeout 30] [--opts bab_steps=5,candidates=3] [NET:PROP ...]

Each line: the tag, the instance, the answer, wall seconds and the tail of the chain's message (domains, global lower
bound). Run nothing else meanwhile: the domain counts are the measurement."""

from __future__ import annotations

import argparse
import time

import torch

HARD = ["256x2:prop_7_eps_0.02", "256x2:prop_9_eps_0.02", "256x4:prop_0_eps_0.02", "256x4:prop_4_eps_0.02"]


def main(argv: list[str] | None = None) -> int:
    from analysis.verification.registry import STAGED, get_verifier

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tag")
    p.add_argument("instances", nargs="*", default=HARD, help="NET:PROP, e.g. 256x4:prop_0_eps_0.02")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--opts", default="", help="verifier options K=V,... (integers), e.g. bab_steps=5")
    p.add_argument("--folder", default="runs/standins/mnist_fc", help="where benchmarks.standins wrote mnist_fc")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    opts = {k: int(v) for k, v in (kv.split("=") for kv in args.opts.split(",") if kv)}
    for item in args.instances:
        net, prop = item.split(":")
        t0 = time.perf_counter()
        r = get_verifier(STAGED, **opts).verify(f"{args.folder}/onnx/mnist-net_{net}.onnx",
                                                f"{args.folder}/vnnlib/{prop}.vnnlib", timeout_s=args.timeout)
        print(args.tag, net, prop, r.status, f"{time.perf_counter() - t0:.1f}", r.message[-160:], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
