#!/bin/bash
# One CROWN pass before and after, in one locked job: a random-weight preact_resnet [16,32] (8×8 digits' shape) in
# the verifiers' form, 3 boxes of ε 0.01, 5 passes each, the two trees' engines alternating over 3 rounds.
#   flock /tmp/heavy.lock benchmarks/verify-results/crown-before-after/run.sh OLD_TREE NEW_TREE > result.txt
set -e
HERE="$(cd "$(dirname "$0")" && pwd)"
OLD="${1:?old tree (a worktree of the commit before)}"
NEW="${2:?new tree}"
PY="${PY:-/work/main/.venv/bin/python}"
PYTHONPATH="$NEW" OMP_NUM_THREADS=1 "$PY" "$HERE/build.py" /tmp/p1632.onnx /tmp/p1632-boxes.npy
for r in 1 2 3; do
  for tree in "$OLD" "$NEW"; do
    echo "round $r $tree $(git -C "$tree" rev-parse --short HEAD) $(cd "$tree" && OMP_NUM_THREADS=1 PYTHONPATH="$tree" "$PY" "$HERE/time_crown.py" /tmp/p1632.onnx /tmp/p1632-boxes.npy 0.01 5 2>/dev/null)"
  done
done
uptime
