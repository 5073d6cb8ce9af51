"""Branch and bound against the MILP on small CNNs, the case where an earlier branch and bound lost to the MILP.

    .venv/bin/python -m benchmarks.small_cnn [LIMIT_S] [SEEDS]   # -> benchmarks/standin-results/small-cnn.jsonl

Networks: 1×5×5 input, Conv(1→3, 3×3, padding 1)+ReLU (75 units), Linear(75→16)+ReLU (16): 91 ReLUs, random weights
(seeded), one random input per seed, ε ∈ {0.3, 0.5, 0.8} on [0, 1] (46–89 unstable ReLUs under interval bounds).
Each property is decided by `auto` (attack, CROWN, α-CROWN, branch and bound) and by `milp` (HiGHS) on their own,
one torch thread, wall seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from analysis.verification.bounds import Bounder
from analysis.verification.problem import Budget, Problem
from analysis.verification.readers import from_torch
from analysis.verification.registry import get_verifier
from analysis.verification.vnnlib import robustness_spec

from . import common

OUT = Path(__file__).resolve().parent / "standin-results" / "small-cnn.jsonl"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    limit = float(argv[0]) if argv else 20.0
    seeds = int(argv[1]) if len(argv) > 1 else 4
    torch.set_num_threads(1)
    lines = [json.dumps({"limit_s": limit, "load_before": common.load(), "commit": common.commit()})]
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(75, 16), nn.ReLU(),
                              nn.Linear(16, 3)).eval()
        net = from_torch(model, (1, 5, 5))
        x0 = np.random.default_rng(seed).uniform(0, 1, 25)
        c = int(np.argmax(net.forward(x0).numpy()))
        for eps in (0.3, 0.5, 0.8):
            spec = robustness_spec(x0, eps, 0.0, 1.0, c, 3)
            row = {"seed": seed, "eps": eps, "unstable_ibp": int(sum(Bounder(net, spec.lb, spec.ub).result().unstable()))}
            for name in ("auto", "milp"):
                r = get_verifier(name).run(Problem([spec], network=net), Budget(limit))
                row.update({name: r.status, f"{name}_s": round(r.seconds, 3), f"{name}_stage": r.stage})
            print(json.dumps(row), flush=True)
            lines.append(json.dumps(row))
    lines.append(json.dumps({"load_after": common.load()}))
    OUT.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
