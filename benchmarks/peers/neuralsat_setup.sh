#!/usr/bin/env bash
# A repeatable install of the peer verifier neuralsat 0.2.17 (PyPI) on the CPU torch, in its own venv
# (default .peers/neuralsat, git-ignored), for the side-by-side of benchmarks/peers/run_neuralsat.py.
#
# Why not `pip install neuralsat==0.2.17`: its requirements pull a CUDA torch over the CPU build, plus
# torchvision and torchaudio. So: torch 2.13.0 first, then neuralsat without dependencies, then its listed
# requirements one by one with torch held by a constraint. torchvision is left out: the build matching
# torch 2.13.0+cpu fails at import ("operator torchvision::nms does not exist"), and neuralsat imports it only
# in its ONNX NonMaxSuppression operator, so that import is moved into the operator's forward (a network with
# NonMaxSuppression then fails with ImportError; none of ours has one). torchaudio is never imported by the
# verifier (only its training and example scripts). gurobipy from PyPI carries a size-limited licence: run
# neuralsat with --disable_stabilize (run_neuralsat.py does), or its MIP tightening overruns the limit.
# Idempotent: a second call only checks.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.peers/neuralsat}"
PY="${PYTHON:-python3}"
TORCH=2.13.0
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
CONSTRAINT="$(mktemp)"
trap 'rm -f "$CONSTRAINT"' EXIT
# protobuf<6 is neuralsat's own cap, held from the first step: without it the newest onnx comes in (its
# generated code needs protobuf 6 and fails to import on 5), and pip settles on an onnx that runs on 5.
printf 'torch==%s\nprotobuf<6.0\n' "$TORCH" > "$CONSTRAINT"
"${PIP[@]}" "torch==$TORCH"
"${PIP[@]}" --no-deps "neuralsat==0.2.17"
# neuralsat 0.2.17's Requires-Dist, less torch (installed above), torchvision and torchaudio (see the top)
for req in "beartype>=0.16.4" "certifi>=2022.12.7" "charset-normalizer>=2.1.1" "coloredlogs>=15.0.1" \
    "filelock>=3.9.0" "flatbuffers>=23.5.26" "fsspec>=2023.4.0" "gurobipy>=11.0.0" "humanfriendly>=10.0" \
    "idna>=3.4" "Jinja2>=3.1.2" "MarkupSafe>=2.1.3" "mpmath>=1.2.1" "networkx>=3.0" "numpy>=1.24.2" \
    "onnx>=1.15.0" "onnxsim>=0.4.36" "onnxruntime>=1.16.3" "packaging>=23.2" "Pillow>=9.3.0" \
    "protobuf>=4.25.1,<6.0" "psutil>=5.9.6" "requests>=2.28.1" "sortedcontainers>=2.4.0" "sympy>=1.11.1" \
    "tqdm>=4.66.1" "typing_extensions>=4.8.0" "urllib3>=1.26.13" "termcolor>=2.4.0" "joblib>=1.4.2" \
    "scipy>=1.10.1"; do
  "${PIP[@]}" -c "$CONSTRAINT" "$req"
done
SRC="$("$VENV/bin/python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("src").origin))')"
"$VENV/bin/python" - "$SRC/helper/network/onnx2pytorch/operations/nonmaxsuppression.py" <<'PY'
import sys
from pathlib import Path

path = Path(sys.argv[1])
text = path.read_text()
top, lazy = "from torch import nn\nimport torchvision\nimport torch\n", "from torch import nn\nimport torch\n"
if text.startswith(top):
    body = text[len(top):]
    needle = "        nms_rs_list = []\n"
    if body.count(needle) != 1:
        sys.exit(f"{path}: unexpected layout; cannot move the torchvision import (is this neuralsat 0.2.17?)")
    path.write_text(lazy + body.replace(needle, "        import torchvision  # only this operator needs it\n" + needle))
elif not text.startswith(lazy):
    sys.exit(f"{path}: unexpected layout; cannot move the torchvision import (is this neuralsat 0.2.17?)")
PY
# The check: CPU torch as pinned, no torchvision, and the verifier's modules import from its source folder.
VPY="$(cd "$VENV" && pwd)/bin/python"
(cd "$SRC" && "$VPY" -c "
import importlib.util, torch
assert torch.__version__ == '$TORCH+cpu', torch.__version__
assert importlib.util.find_spec('torchvision') is None, 'torchvision is installed; remove it (see the top of this script)'
import setting, verifier.verifier, helper.network.read_onnx, helper.spec.objective
print('neuralsat 0.2.17 ready: torch', torch.__version__, '(Gurobi licence found)' if setting.USE_GUROBI else '(no Gurobi licence)')
")
echo "python: $VPY; source: $SRC"
