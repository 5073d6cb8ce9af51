#!/usr/bin/env bash
# Every GPU goal of the training issue (and the verifier's GPU run when its script is there), in one call of at most
# 8 minutes on a lent H100/H200 (the device tool's README: few, full calls). From the repository root:
#   bash benchmarks/gpu.sh            # writes into $OUT (the device tool's folder) or ./gpu-out
# Needs torch with CUDA and triton (both on the lent machines); carried along: the cp312 onnxsim wheel in .whl/ and
# the four Fashion-MNIST *-ubyte.gz files in data/fashion_mnist/ (both git-ignored). SKIP="tests suite ..." leaves
# steps out (tests, suite, bench, run, verify, compile).
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

# 1. the cuda-marked tests (compiled Triton kernels, whole-step graphs), then the whole fast suite
if ! skip tests; then
  stamp "cuda tests"
  timeout 240 python3 -m pytest -m cuda -q -p no:cacheprovider -x tests 2>&1 | tail -40 | tee "$OUT/cuda-tests.log"
fi
if ! skip suite; then
  stamp "fast suite"
  timeout 300 python3 -m pytest -m "not slow" -q -p no:cacheprovider -n 8 --dist loadfile tests 2>&1 | tail -40 | tee "$OUT/fast-suite.log"
fi
# 2. op and epoch ratios against GELU, kernel bandwidth, host time (benchmarks/gpu.py -> gpu.json)
if ! skip bench; then
  stamp "benchmarks"
  timeout 300 python3 -m benchmarks.gpu "$OUT" --sections op,epochs 2>&1 | tail -40 | tee "$OUT/bench.log"
fi
if ! skip compile; then
  stamp "compile"
  mkdir -p "$OUT/compile"
  timeout 300 python3 -m benchmarks.gpu "$OUT/compile" --sections compile 2>&1 | tail -20 | tee "$OUT/compile.log"
fi
# 3. the default run on the GPU machine, every stage, with the stage times and the swap result
if ! skip run; then
  stamp "default run"
  rm -rf /tmp/gpu-runs
  /usr/bin/time -v python3 -m pipeline.cli run data.root=data out_dir=/tmp/gpu-runs name=default 2>&1 | tail -80 > "$OUT/default-run.log"
  cp /tmp/gpu-runs/default/swap/swap.json "$OUT/swap.json" 2>/dev/null
  python3 - "$OUT" <<'PY'
import json, sys
m = json.load(open("/tmp/gpu-runs/default/manifest.json"))
st = m["stages"]
rows = {s: {"seconds": st[s].get("seconds"), "device": st[s].get("device"), "status": st[s].get("status")} for s in st}
paths = {s: {v: r.get("training_path") for v, r in (st[s].get("metrics") or {}).items() if isinstance(r, dict) and "training_path" in r}
         for s in ("train", "harden") if s in st}
json.dump({"stages": rows, "training_path": paths, "total_s": sum(r["seconds"] or 0 for r in rows.values())},
          open(f"{sys.argv[1]}/stage-seconds.json", "w"), indent=1)
print(json.dumps(rows), json.dumps(paths))
PY
fi
# 4. the verifier on the GPU (its own script, when the verifier issue's work is in the tree)
if ! skip verify && [ -f benchmarks/gpu_verify.sh ]; then
  stamp "verifier"
  bash benchmarks/gpu_verify.sh 2>&1 | tail -30
fi
stamp "done"
