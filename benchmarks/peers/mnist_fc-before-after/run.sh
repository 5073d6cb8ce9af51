#!/usr/bin/env bash
# The mnist_fc stand-in (90 rows, 30 s each) before and after, in six locked chunks of 15 rows (see SUMMARY.md).
#   BEFORE=/path/to/7f02dce-tree AFTER=/path/to/9263d3c-tree F=runs/standins/mnist_fc O=runs/mnist_fc-before-after \
#       bash benchmarks/peers/mnist_fc-before-after/run.sh
set -u
export BEFORE AFTER F O
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$O/before" "$O/after"
i=0
for R in 0:15 15:30 30:45 45:60 60:75 75:90; do
  if [ $((i % 2)) = 0 ]; then ORDER=old-first; else ORDER=new-first; fi
  flock /tmp/heavy.lock bash "$HERE/chunk.sh" "$R" "$ORDER" >> "$O/log.txt" 2>&1
  i=$((i+1))
done
