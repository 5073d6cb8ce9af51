#!/usr/bin/env bash
# One chunk of the stand-in's rows, before and after, in one hold of the heavy-job lock; which runs first alternates.
#   BEFORE, AFTER: source trees (git archive of the two commits); F: the stand-in folder; O: where the CSVs go
set -u
R=$1; ORDER=$2
run() {  # $1 tag, $2 source tree
  cd "$2" && PYTHONPATH="$2" /work/main/.venv/bin/python -m benchmarks.peers.side_by_side project "$F" --timeout 30 \
      --jobs 2 --rows "$R" --out "$O/$1/project.csv"
}
echo "chunk $R start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$ORDER" = old-first ]; then run before "$BEFORE"; run after "$AFTER"; else run after "$AFTER"; run before "$BEFORE"; fi
echo "chunk $R end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
