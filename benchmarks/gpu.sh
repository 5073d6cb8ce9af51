#!/usr/bin/env bash
# Every GPU goal of the training issue and the verifier's GPU run, in one call on a lent H100/H200: the steps' limits sum
# to 600 s; on an H200 (benchmarks/gpu-results/h200-*) bench took 57 s, the default run 80 s up to its verify stage
# (41 s on older code), the verifier 126 s and the cuda tests 78 s, so a call of 480 s leaves the fast suite ~80 s
# (the device tool's README: few, full calls). From the repository root:
#   bash benchmarks/gpu.sh            # writes into $OUT (the device tool's folder) or ./gpu-out
# Needs torch with CUDA and triton (both on the lent machines); carried along (all git-ignored): the cp312 onnxsim wheel
# in .whl/, the four Fashion-MNIST *-ubyte.gz files in data/fashion_mnist/, and for the verifier the mnist_fc stand-in in
# runs/standins/mnist_fc/ (instances.csv, onnx/, vnnlib/: `python -m benchmarks.standins` builds it).
# Steps in order of what they are for, each under its own time limit: bench (op, kernels, epochs: benchmarks/gpu.py),
# run (the default `pipeline run`, every stage), verify (benchmarks/gpu_verify.sh), tests (-m cuda), suite (the fast
# suite). SKIP="compile ..." leaves steps out; compile (torch.compile reduce-overhead against the captured steps) is
# skipped unless asked for. Files back: at most 8 (the device tool's limit), the verifier's packed in one tar.
set -uo pipefail
OUT="${OUT:-gpu-out}"
SKIP="${SKIP:-compile}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
start=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
skip() { [[ " $SKIP " == *" $1 "* ]]; }
stamp() { echo "[gpu.sh] $1 at $(( $(date +%s) - start )) s"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton, numpy, onnxruntime; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'onnxruntime', onnxruntime.__version__)"
  nproc; } 2>&1 | tee "$OUT/device.txt"

# 1. op and epoch ratios against GELU, kernel bandwidth, host time (benchmarks/gpu.py -> gpu.json)
if ! skip bench; then
  stamp "benchmarks"
  timeout "${BENCH_S:-110}" python3 -m benchmarks.gpu "$OUT" --sections op,epochs 2>&1 | tail -25
fi
if ! skip compile; then
  stamp "compile"
  mkdir -p /tmp/compile-out
  timeout "${COMPILE_S:-150}" python3 -m benchmarks.gpu /tmp/compile-out --sections compile 2>&1 | tail -8
  cp /tmp/compile-out/gpu.json "$OUT/compile.json" 2>/dev/null
fi
# 2. the default run on the GPU machine, every stage, with the stage times, the epochs' times and the swap result
if ! skip run; then
  stamp "default run"
  rm -rf /tmp/gpu-runs
  timeout "${RUN_S:-150}" python3 -m pipeline.cli run data.root=data out_dir=/tmp/gpu-runs name=default > /tmp/default-run.log 2>&1
  tail -60 /tmp/default-run.log > "$OUT/default-run.log"
  cp /tmp/gpu-runs/default/swap/swap.json "$OUT/swap.json" 2>/dev/null
  python3 - "$OUT" <<'PY'
import csv, json, sys
run = "/tmp/gpu-runs/default"
m = json.load(open(f"{run}/manifest.json"))
st = m["stages"]
rows = {s: {"seconds": st[s].get("seconds"), "device": st[s].get("device"), "status": st[s].get("status")} for s in st}
paths = {s: {v: r.get("training_path") for v, r in (st[s].get("metrics") or {}).items() if isinstance(r, dict) and "training_path" in r}
         for s in ("train", "harden") if s in st}
try:
    epochs = [{k: r[k] for k in ("variant", "epoch", "phase", "seconds")} for r in csv.DictReader(open(f"{run}/train/metrics.csv"))]
except OSError:
    epochs = []
json.dump({"stages": rows, "training_path": paths, "total_s": sum(r["seconds"] or 0 for r in rows.values()), "epochs": epochs},
          open(f"{sys.argv[1]}/stage-seconds.json", "w"), indent=1)
print(json.dumps(rows), json.dumps(paths))
PY
fi
# 3. the verifier on the GPU: the mnist_fc stand-in at 30 s per instance (benchmarks/gpu_verify.sh), packed in one file
if ! skip verify && [ -f benchmarks/gpu_verify.sh ] && [ -d runs/standins/mnist_fc ]; then
  stamp "verifier"
  OUT=/tmp/verify-out timeout "${VERIFY_S:-140}" bash benchmarks/gpu_verify.sh 2>&1 | tail -22
  tar czf "$OUT/verify.tar.gz" -C /tmp verify-out 2>/dev/null
fi
# 4. the cuda-marked tests (compiled Triton kernels, whole-step graphs, the compiled op, devices), then the fast suite
if ! skip tests; then
  stamp "cuda tests"
  # the whole log, tracebacks included: a failure seen only on the GPU must be readable from what comes back
  timeout "${TESTS_S:-100}" python3 -m pytest -m cuda -q -p no:cacheprovider --tb=long -rfE tests > "$OUT/cuda-tests.log" 2>&1
  tail -5 "$OUT/cuda-tests.log"
fi
if ! skip suite; then
  stamp "fast suite"
  # one torch thread per worker: 12 workers of 16 threads each (192 on 16 cores) reached only 38% in 170 s
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout "${SUITE_S:-100}" python3 -m pytest -m "not slow" -q -p no:cacheprovider \
    -n "${SUITE_WORKERS:-14}" --dist loadfile --tb=short -rfE tests 2>&1 | tail -120 > "$OUT/fast-suite.log"
  tail -8 "$OUT/fast-suite.log"
fi
stamp "done"
