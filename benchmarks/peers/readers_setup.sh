#!/usr/bin/env bash
# A repeatable install of one ONNX loader from PyPI on the CPU torch, in its own venv, for the reader check of
# benchmarks/peers/readers.py: `onnx2pytorch` 0.6.0 (PyPI's release of the loader α,β-CROWN uses in a fork; default
# venv .peers/onnx2pytorch, git-ignored) or `onnx2torch` 1.5.15 (.peers/onnx2torch). neuralsat has its own script
# (neuralsat_setup.sh), and so has auto_LiRPA (auto_lirpa_setup.sh).
#
# Why not a plain `pip install onnx2pytorch`: both loaders require torchvision, and PyPI's torchvision 0.28.0 (the
# build for torch 2.13) fails at import on the CPU torch ("operator torchvision::nms does not exist"); both import
# it at the top of their modules for ops none of our graphs has (NonMaxSuppression, RoiAlign, MaxRoiPool,
# DeformConv, ImageDecoder). So: torch 2.13.0 first, then the loader without dependencies, then its other
# requirements with torch held by a constraint; torchvision stays out, and every run of the loader puts
# benchmarks/peers/stand_ins first on PYTHONPATH (a torchvision whose names exist and raise when called: a graph with
# one of those ops fails with that message; none of ours has one).
# pip then says the loader requires torchvision, which is not installed: expected. Idempotent.
#
# Usage: benchmarks/peers/readers_setup.sh onnx2pytorch|onnx2torch [VENV]
set -euo pipefail
cd "$(dirname "$0")/../.."
STAND_INS="$PWD/benchmarks/peers/stand_ins"
TOOL="${1:?usage: readers_setup.sh onnx2pytorch|onnx2torch [VENV]}"
case "$TOOL" in
  onnx2pytorch) PKG="onnx2pytorch==0.6.0"; REQS=("onnx>=1.6.0") ;;
  onnx2torch) PKG="onnx2torch==1.5.15"; REQS=("numpy>=1.16.4" "onnx>=1.9.0") ;;
  *) echo "error: unknown loader '$TOOL' (onnx2pytorch or onnx2torch)" >&2; exit 2 ;;
esac
VENV="${2:-.peers/$TOOL}"
PY="${PYTHON:-python3}"
TORCH=2.13.0
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
CONSTRAINT="$(mktemp)"
trap 'rm -f "$CONSTRAINT"' EXIT
printf 'torch==%s\n' "$TORCH" > "$CONSTRAINT"
"${PIP[@]}" "torch==$TORCH"
"$VENV/bin/python" -m pip uninstall -q -y torchvision 2>/dev/null || true
"${PIP[@]}" --no-deps "$PKG" 2>&1 | grep -v "dependency\|requires" || true
for req in "${REQS[@]}"; do
  "${PIP[@]}" -c "$CONSTRAINT" "$req"
done
# The check: CPU torch as pinned, the loader imports, and a Conv → Relu graph loads and computes what torch does.
PYTHONPATH="$STAND_INS" "$VENV/bin/python" - "$TOOL" <<PY
import sys
import onnx, torch
from onnx import helper, numpy_helper, TensorProto
assert torch.__version__ == "$TORCH+cpu", torch.__version__
w = torch.randn(2, 1, 3, 3)
g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])], [numpy_helper.from_array(w.numpy(), "w")])
model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
if sys.argv[1] == "onnx2pytorch":
    from onnx2pytorch import ConvertModel
    net = ConvertModel(model, experimental=False)
else:
    from onnx2torch import convert
    net = convert(model)
x = torch.randn(1, 1, 4, 4)
assert torch.allclose(net(x), torch.relu(torch.nn.functional.conv2d(x, w)), atol=1e-6)
import importlib.metadata as md
print(sys.argv[1], md.version(sys.argv[1]), "ready: torch", torch.__version__)
PY
echo "python: $VENV/bin/python"
