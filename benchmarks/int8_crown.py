"""One CROWN pass of ours on an int8 network of a verify stage's run, timed, for comparing two trees of the engine side by
side (run each tree as a script with its own PYTHONPATH, alternating, in one hold of the shared lock):

    PYTHONPATH=TREE python benchmarks/int8_crown.py RUN VARIANT TAG [TIMED] [DECIDED]

RUN is a run directory with verify/onnx/VARIANT-int8.onnx and verify/vnnlib/VARIANT_<sample>_<eps>.vnnlib (the verify
stage's files). TIMED properties (default 8: samples 1.. at ε 0.002 and 0.005, half each) are passed through
`Bounder.crown()` and the spec rows, one torch thread, min of two passes each; then the first DECIDED samples (default
20; 0 skips them) at ε 0.002 and 0.005 are bounded once each, a property counted decided by CROWN when every disjunct of its unsafe set
is excluded (some row's lower bound > 0, the verify stage's first-pass rule). Prints `RESULT TAG ...` lines: seconds
per pass, the smallest row bound per property (the margin of a robustness property, one row per disjunct), the decided count, the units CROWN queried per pass.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

EPS = (0.002, 0.005)


def _properties(run: Path, variant: str, samples: range):
    from analysis.verification.vnnlib import read_vnnlib

    for eps in EPS:
        for k in samples:
            yield f"{variant}_{k}_{eps}", read_vnnlib(run / "verify" / "vnnlib" / f"{variant}_{k}_{eps}.vnnlib")


def _bound(graph, spec) -> tuple[float, bool, float]:
    from analysis.verification.bounds import Bounder, Spec, excluded

    S, owner = Spec.from_disjuncts(spec.disjuncts)
    t0 = time.perf_counter()
    b = Bounder(graph, spec.lb, spec.ub)
    b.crown()
    lower = b.spec_bounds(S)
    seconds = time.perf_counter() - t0
    return seconds, all(excluded(lower, owner, len(spec.disjuncts))), float(lower.min())


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        raise SystemExit("usage: int8_crown.py RUN VARIANT TAG [TIMED] [DECIDED]")
    from analysis.verification import crown
    from analysis.verification.readers import from_onnx

    torch.set_num_threads(1)
    run, variant, tag = Path(argv[0]), argv[1], argv[2]
    timed = int(argv[3]) if len(argv) > 3 else 8
    decided_n = int(argv[4]) if len(argv) > 4 else 20
    onnx_path = run / "verify" / "onnx" / f"{variant}-int8.onnx"
    if not onnx_path.is_file():
        raise SystemExit(f"error: {onnx_path} does not exist; RUN must be a run with a finished verify stage")
    graph = from_onnx(onnx_path)
    queried = [0]
    rows = crown.CrownPass._rows

    def counting(self, j, idx, n, *a, **k):
        queried[0] += idx.numel()
        return rows(self, j, idx, n, *a, **k)

    crown.CrownPass._rows = counting
    per_eps = timed // len(EPS)
    times = []
    for name, spec in _properties(run, variant, range(1, 1 + per_eps)):
        queried[0] = 0
        runs = [_bound(graph, spec) for _ in range(2)]
        times.append(min(r[0] for r in runs))
        print(f"RESULT {tag} {name} seconds {times[-1]:.3f} margin {runs[0][2]:.6f} queried {queried[0] // 2}",
              flush=True)
    decided, margins = 0, []
    if not decided_n:
        print(f"RESULT {tag} {variant}-int8 seconds_per_pass {sum(times) / len(times):.3f} over {len(times)}", flush=True)
        return
    for name, spec in _properties(run, variant, range(decided_n)):
        _, ok, m = _bound(graph, spec)
        decided += ok
        margins.append(m)
    print(f"RESULT {tag} {variant}-int8 seconds_per_pass {sum(times) / len(times):.3f} over {len(times)}; decided by "
          f"CROWN {decided}/{len(margins)}; margin sum {sum(margins):.6f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
