#!/usr/bin/env bash
# Everything the GPU issue asks to check and time on a lent GPU machine, in one call (the device tool's
# README: few, full calls). Run from the repository root on the GPU machine:
#   bash benchmarks/gpu.sh            # writes into $OUT (the device tool's folder) or ./gpu-out
# Needs: torch with CUDA, triton (both on the lent machines); onnxsim and the Fashion-MNIST IDX files
# carried along (put the cp312 onnxsim wheel in .whl/ and the four *-ubyte.gz files in data/fashion_mnist/).
set -uo pipefail
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
# 1. the cuda-marked tests (Triton kernels compiled, not interpreted), then the whole fast suite
python3 -m pytest -m cuda -q -p no:cacheprovider tests 2>&1 | tee "$OUT/cuda-tests.log"
python3 -m pytest -m "not slow" -q -p no:cacheprovider -x --ignore=tests/test_triton_kernel.py tests 2>&1 | tail -30 | tee "$OUT/fast-suite.log"
# 2. op and epoch ratios against GELU, side by side in one process (results-gpu.json / RESULTS-gpu.md)
python3 -m benchmarks.run --only gpu --out-dir "$OUT" 2>&1 | tail -40 | tee "$OUT/bench.log"
# 3. the default run's train + harden on the GPU, and its swap result next to the CPU run's
/usr/bin/time -v python3 -m pipeline.cli run device=cuda data.root=data out_dir=/tmp/gpu-runs name=default \
  stages=train,harden,swap 2>&1 | tail -60 | tee "$OUT/default-run.log"
cp /tmp/gpu-runs/default/swap/swap.json "$OUT/swap.json" 2>/dev/null
python3 - "$OUT" <<'PY'
import json, sys
m = json.load(open("/tmp/gpu-runs/default/manifest.json"))
st = m["stages"]
print(json.dumps({s: st[s]["seconds"] for s in ("train", "harden", "swap") if s in st}, indent=1))
json.dump({s: st[s].get("seconds") for s in st}, open(f"{sys.argv[1]}/stage-seconds.json", "w"))
PY
