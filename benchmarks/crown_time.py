"""Our side of `benchmarks.peers.crown_side_by_side` alone (no auto_LiRPA venv needed): one CROWN pass (IBP, `crown()`,
the spec rows) on a run's first 3 properties of verify/onnx/lambda_gelu.onnx, 5 passes each, printing the minimum
and median seconds, the spec rows' mean lower bound and the unstable ReLUs per site, tagged for side-by-side runs:

    flock /tmp/heavy.lock .venv/bin/python -m benchmarks.crown_time runs/preact1632 after
"""

import statistics
import sys
from pathlib import Path

import torch

from benchmarks.peers import crown_side_by_side as c


def main() -> None:
    torch.set_num_threads(1)
    for r in c.ours(c.properties(Path(sys.argv[1]), "lambda_gelu.onnx", 3), 5):
        print(f"RESULT {sys.argv[2]} {r['name']} min {min(r['seconds']):.4f} median {statistics.median(r['seconds']):.4f} "
              f"spec_lower_mean {sum(r['spec_lower']) / len(r['spec_lower']):.10f} unstable {r['unstable']}")


if __name__ == "__main__":
    main()
