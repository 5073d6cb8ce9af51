#!/bin/bash
# One locked job: ours, then α,β-CROWN, on the same rows of a VNN-COMP folder at the same per-instance limit:
#   flock /tmp/heavy.lock benchmarks/peers/abcrown_measure.sh FOLDER ROWS.csv LIMIT OUT [abcrown_vnncomp.py flags...]
# FOLDER: a VNN-COMP folder; ROWS.csv: an instance list inside FOLDER; OUT: a folder, each tool's results, witnesses
# and log go to OUT/ours/ and OUT/abcrown/ (results.csv, counterexamples/, run.log); α,β-CROWN from abcrown_setup.sh
# (.peers/abcrown). Both run one instance at a time with one torch thread (pipeline vnncomp --jobs 1;
# abcrown_vnncomp.py one process per instance), never at the same time as each other.
set -u
FOLDER=$1 ROWS=$2 LIMIT=$3 OUT=$4
shift 4
PY=${PYTHON:-.venv/bin/python}
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=$PWD
mkdir -p "$OUT/ours" "$OUT/abcrown"
echo "== ours $(git rev-parse --short HEAD) $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
$PY -m pipeline.cli vnncomp "$FOLDER" --instances "$ROWS" --timeout "$LIMIT" --threads 1 --out "$OUT/ours/results.csv" 2>&1 |
  grep -v Warn > "$OUT/ours/run.log"
tail -n 1 "$OUT/ours/run.log"
echo "== α,β-CROWN $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
$PY -W ignore -m benchmarks.peers.abcrown_vnncomp "$FOLDER" --instances "$ROWS" --timeout "$LIMIT" \
  --out "$OUT/abcrown/results.csv" "$@" > "$OUT/abcrown/run.log" 2>&1
tail -n 1 "$OUT/abcrown/run.log"
echo "== end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
