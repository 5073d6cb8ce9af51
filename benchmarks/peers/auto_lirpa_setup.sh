#!/usr/bin/env bash
# A repeatable install of auto_LiRPA (α,β-CROWN's bound library) on the CPU torch, in its own venv, for
# benchmarks/peers/readers.py (its convolutional path on our files) and benchmarks/peers/crown_side_by_side.py (one
# CROWN pass beside ours): onnx2pytorch 0.6.0 first (readers_setup.sh: torch 2.13.0+cpu, no torchvision, the
# stand-ins on PYTHONPATH), then auto_LiRPA from its source, without dependencies, and the few packages it imports.
#
# Why from source: PyPI's auto-lirpa is 0.3 (2022), which does not import on torch 2.13; the source release 0.7.1
# (its setup.py asks for torch < 2.9 and torchvision, neither of which it needs to run CROWN on CPU here) does.
# SRC is a checkout of auto_LiRPA's source (Verified-Intelligence/auto_LiRPA on GitHub; measured with its "May 2026
# release", a050a3d) or anything pip installs it from.
#
# Usage: benchmarks/peers/auto_lirpa_setup.sh SRC [VENV]     (VENV default .peers/auto_lirpa, git-ignored)
set -euo pipefail
SRC="${1:?usage: auto_lirpa_setup.sh SRC [VENV]}"
[ -d "$SRC" ] && SRC="$(cd "$SRC" && pwd)"
cd "$(dirname "$0")/../.."
VENV="${2:-.peers/auto_lirpa}"
bash benchmarks/peers/readers_setup.sh onnx2pytorch "$VENV"
"$VENV/bin/python" -m pip install -q --no-deps "$SRC"
CONSTRAINT="$(mktemp)"
trap 'rm -f "$CONSTRAINT"' EXIT
printf 'torch==2.13.0\n' > "$CONSTRAINT"
"$VENV/bin/python" -m pip install -q -c "$CONSTRAINT" packaging appdirs pyyaml tqdm graphviz
PYTHONPATH="$PWD/benchmarks/peers/stand_ins" "$VENV/bin/python" - <<'PY'
import torch
from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm
import auto_LiRPA
net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 2))
x = torch.randn(1, 1, 4, 4)
lb, ub = BoundedModule(net, x).compute_bounds(x=(BoundedTensor(x, PerturbationLpNorm(eps=0.1)),), method="CROWN")
assert bool((lb <= net(x)).all() and (net(x) <= ub).all())
print("auto_LiRPA", auto_LiRPA.__version__, "ready: torch", torch.__version__)
PY
echo "python: $VENV/bin/python"
