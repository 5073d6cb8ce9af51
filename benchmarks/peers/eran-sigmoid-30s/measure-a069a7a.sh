#!/bin/bash
# One locked job: ours, then auto_LiRPA, on the same rows at 30 s each (how the a069a7a rows here were made):
#   flock /tmp/heavy.lock benchmarks/peers/eran-sigmoid-30s/measure-a069a7a.sh FOLDER ROWS.csv OUT LIRPA_PKGS
# FOLDER: the fetched eran benchmark folder (nets/, specs/); ROWS.csv: instances.csv here, inside FOLDER;
# LIRPA_PKGS: a pip --target folder with auto_LiRPA 0.7.1 and onnx2pytorch (benchmarks/peers/README.md)
set -u
FOLDER=$1 ROWS=$2 OUT=$3 LIRPA=$4
PY=${PYTHON:-.venv/bin/python}
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=$PWD
echo "== ours $(git rev-parse --short HEAD) $(date -u +%T)"
$PY -m pipeline.cli vnncomp "$FOLDER" --instances "$ROWS" --timeout 30 --out "${OUT}_ours.csv" 2>&1 | grep -v Warn > "${OUT}_ours.log"
tail -n 2 "${OUT}_ours.log"
echo "== lirpa $(date -u +%T)"
PYTHONPATH=$PWD/benchmarks/peers/stand_ins:$LIRPA:$PWD $PY -W ignore -m benchmarks.peers.lirpa_vnncomp "$FOLDER" \
  --instances "$ROWS" --timeout 30 --out "${OUT}_lirpa.csv" 2>&1 | grep "lirpa:" > "${OUT}_lirpa.log"
echo "== end $(date -u +%T)"
