#!/usr/bin/env bash
# The verifier on a GPU (issue 34): the mnist_fc stand-in through `pipeline vnncomp` on cuda at 30 s per instance,
# 12 worker processes sharing the GPU, every sat witness re-checked in onnxruntime, a summary table printed last.
# Run from the repository root on the GPU machine (python3 with torch+CUDA, onnx, onnxruntime, scipy; no internet),
# with the stand-in carried (runs/standins/mnist_fc: instances.csv, onnx/, vnnlib/; `python -m benchmarks.standins`
# builds it):
#   bash benchmarks/gpu_verify.sh          # writes into $OUT (the device tool's folder) or ./gpu-verify-out
# Knobs (environment): JOBS (12), TIMEOUT (30), DEVICE (cuda), FOLDER (runs/standins/mnist_fc), OPTIONS (verifier
# options K=V,..., e.g. rebound=1 or refine=0), LIMIT (first N instances only), PYTHON (python3), BUDGET (150: wall
# seconds for the whole run, so the table comes out inside gpu.sh's VERIFY_S=170; 0: none), MODELS (0; 1: then the runs
# the README's "decided" column quotes, remade from their committed configs with verify.device=$DEVICE and compared with
# the CPU's: benchmarks/gpu_verify_models.py, ~2-4 min a run; FOLDER=none leaves the stand-in out), ONLY (those runs).
set -uo pipefail
OUT="${OUT:-gpu-verify-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
if [ "${FOLDER:-}" != none ]; then
  "${PYTHON:-python3}" -m benchmarks.gpu_verify --out "$OUT" --folder "${FOLDER:-runs/standins/mnist_fc}" --jobs "${JOBS:-12}" \
    --timeout "${TIMEOUT:-30}" --device "${DEVICE:-cuda}" --limit "${LIMIT:-0}" --budget "${BUDGET:-150}" ${OPTIONS:+--options "$OPTIONS"} 2>&1 \
    | tee "$OUT/log.txt"
  status="${PIPESTATUS[0]}"
fi
if [ "${MODELS:-0}" = 1 ]; then
  "${PYTHON:-python3}" -m benchmarks.gpu_verify_models --out "$OUT" --device "${DEVICE:-cuda}" ${ONLY:+--only "$ONLY"} 2>&1 \
    | tee -a "$OUT/log.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit "$status"
