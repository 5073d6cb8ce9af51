#!/usr/bin/env bash
# α,β-CROWN's ONNX loader for the reader checks (benchmarks/peers/read_check.py `abcrown`, benchmarks/peers/abcrown_loader.py):
# its fork of onnx2pytorch at the commit its complete_verifier/load_model.py pins (the message it prints on a version
# error: `pip install git+https://github.com/Verified-Intelligence/onnx2pytorch@fe7281b…`), as a source folder
# (default .peers/abcrown_loader, git-ignored) put first on PYTHONPATH before the auto_LiRPA venv's own onnx2pytorch
# 0.6.0 (auto_lirpa_setup.sh), with benchmarks/peers/stand_ins for torchvision as the other loaders have.
#
# Usage: benchmarks/peers/abcrown_loader_setup.sh [SOURCE [DEST]]
#   SOURCE: a git repository holding the fork (default its GitHub address; a local clone or mirror where GitHub is
#   out of reach, e.g. of KaidiXu/onnx2pytorch, the same history).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMIT=fe7281b9b6c8c28f61e72b8f3b0e3181067c7399
SOURCE="${1:-https://github.com/Verified-Intelligence/onnx2pytorch.git}"
DEST="${2:-.peers/abcrown_loader}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
if [ -d "$SOURCE" ]; then
  git -C "$SOURCE" archive "$COMMIT" onnx2pytorch | tar -x -C "$TMP"
else
  git clone -q "$SOURCE" "$TMP/src" && git -C "$TMP/src" archive "$COMMIT" onnx2pytorch | tar -x -C "$TMP"
fi
rm -rf "$DEST" && mkdir -p "$DEST" && mv "$TMP/onnx2pytorch" "$DEST/" && echo "$COMMIT" > "$DEST/COMMIT"
PY="${PYTHON:-.peers/auto_lirpa/bin/python}"
PYTHONPATH="$DEST:$PWD/benchmarks/peers/stand_ins" "$PY" -c "
import inspect, onnx2pytorch
from onnx2pytorch import ConvertModel
assert 'quirks' in inspect.signature(ConvertModel).parameters, 'not the fork: ConvertModel takes no quirks'
print('α,β-CROWN loader ready:', onnx2pytorch.__file__)"
