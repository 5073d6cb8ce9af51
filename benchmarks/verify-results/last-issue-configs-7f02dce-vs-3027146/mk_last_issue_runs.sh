#!/bin/bash
# the last issue's three configs (benchmarks/verify-results/README.md), built by 7f02dce, up to the verify stage
set -e
cd /work/wt/old7f
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=/work/main/.venv/bin/python
mkdir -p /work/runs-lead/last
S=stages=train,harden,check,swap,export,int8,sparsity,verify
$PY -m pipeline.cli run -c configs/digits-tiny.toml out_dir=/work/runs-lead/last $S name=$1 "${@:2}" > /work/runs-lead/last/$1.log 2>&1
