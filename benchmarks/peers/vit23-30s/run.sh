#!/bin/bash
# VNN-COMP 2023 vit, 10 instances (the first 5 of each network in instances.csv), 30 s each: ours, then auto_LiRPA, separate locked jobs
cd /work/wt/lead
export PYTHONPATH=$PWD
PY=/work/main/.venv/bin/python
echo "== ours $(git rev-parse --short HEAD) $(date -u +%T)"
flock /tmp/heavy.lock $PY -m pipeline.cli vnncomp /tmp/vit23 --instances /tmp/vit23/sample10.csv --timeout 30 --out /tmp/vit23/out/ours.csv 2>&1 | grep -v Warn > /tmp/vit23/out/ours.log
tail -n 2 /tmp/vit23/out/ours.log
echo "== lirpa $(date -u +%T)"
PYTHONPATH=$PWD/benchmarks/peers/stand_ins:/tmp/i55s/lirpa_pkgs:$PWD flock /tmp/heavy.lock $PY -W ignore -m benchmarks.peers.lirpa_vnncomp /tmp/vit23 \
  --instances /tmp/vit23/sample10.csv --timeout 30 --out /tmp/vit23/out/lirpa.csv > /tmp/vit23/out/lirpa.log 2>&1
tail -n 3 /tmp/vit23/out/lirpa.log
echo "== end $(date -u +%T)"
