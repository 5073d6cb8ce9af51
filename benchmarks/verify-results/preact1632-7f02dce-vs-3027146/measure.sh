#!/bin/bash
# preact [16,32] CROWN pass, 7f02dce (before) vs main (after), interleaved, one lock hold, one torch thread
RUN=/work/runs-lead/preact1632
for i in 1 2 3; do
  (cd /work/wt/old7f && PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python benchmarks/crown_time.py preact $RUN before) | grep RESULT
  (cd /work/wt/lead && PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m benchmarks.crown_time preact $RUN after) | grep RESULT
done
# the same, order reversed (after first), five rounds
RUN=/work/runs-lead/preact1632
for i in 1 2 3 4 5; do
  (cd /work/wt/lead && PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m benchmarks.crown_time preact $RUN after) | grep RESULT
  (cd /work/wt/old7f && PYTHONPATH=$PWD OMP_NUM_THREADS=1 /work/main/.venv/bin/python benchmarks/crown_time.py preact $RUN before) | grep RESULT
done
