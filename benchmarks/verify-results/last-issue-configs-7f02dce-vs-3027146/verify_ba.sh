#!/bin/bash
# the verify stage of one of the last issue's runs (built by 7f02dce): 7f02dce redoes verify; main redoes export (its verify reads the export stage's verifiers' form), int8, sparsity and verify
# each on its own copy, alternating, in one hold of the lock; prints each redo's stage line and final counts
M=$1; ROUNDS=${2:-1}
PY=/work/main/.venv/bin/python
for r in $(seq $ROUNDS); do
  for side in before after; do
    tree=/work/wt/old7f; REDO=verify; [ $side = after ] && tree=/work/wt/lead && REDO=export
    D=/tmp/ba_${M}_${side}_$r; rm -rf $D; cp -r /work/runs-lead/last/$M $D
    (cd $tree && PYTHONPATH=$PWD OMP_NUM_THREADS=1 $PY -m pipeline.cli run --resume $D --redo $REDO > $D.log 2>&1)
    echo "$M $side round $r: $(grep -E 'properties final' $D.log | tail -1 | sed 's/^ *//') | $(grep -E '\[verify\] done' $D.log)"
  done
done
