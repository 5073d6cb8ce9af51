#!/usr/bin/env bash
# α,β-CROWN itself (the whole verifier, CPU only) for benchmarks/peers/abcrown_vnncomp.py: its "Dec 2025 release"
# (8250d5f), its auto_LiRPA submodule at the commit that release pins (9d100ec) and the onnx2pytorch fork its
# complete_verifier/load_model.py asks for (fe7281b), assembled from source into DEST (default .peers/abcrown,
# git-ignored):
#   DEST/src    α,β-CROWN's tree with auto_LiRPA in its submodule's place (complete_verifier/auto_LiRPA links there)
#   DEST/pkgs   pip --target: the fork, and those of α,β-CROWN's requirements the interpreter cannot import
# Run it as `PYTHONPATH=DEST/pkgs:benchmarks/peers/stand_ins $PY DEST/src/complete_verifier/abcrown.py --config …`.
#
# Why not its install_tool.sh / environment yaml: they build a conda env with CUDA torch 2.8 and Gurobi. Here the
# interpreter's own CPU torch stays (PYTHON, default .venv/bin/python: torch 2.13; α,β-CROWN's setup.py asks for
# torch < 2.9, which it does not need at runtime here), the requirements go in --no-deps so that torch and numpy are
# never replaced. gurobipy (PyPI's wheel, with its size-limited licence) is installed because α,β-CROWN imports it
# at module level (lp_mip_solver), though the configs used here leave MIP off. torchvision stays out: PyPI's build for
# torch 2.13 fails at import on the CPU torch, and α,β-CROWN imports it only for its built-in datasets, so every run
# puts benchmarks/peers/stand_ins first on PYTHONPATH (readers_setup.sh says why). Files the SOURCE lacks (a partial
# mirror: the repository's example weights under complete_verifier/models, datasets) are left out and listed.
#
# Usage: benchmarks/peers/abcrown_setup.sh [ABCROWN_SRC [AUTOLIRPA_SRC [ONNX2PYTORCH_SRC [DEST]]]]
#   each SRC: a git repository holding that commit (default its GitHub address; a local clone or bare mirror where
#   GitHub is out of reach). Idempotent: DEST is rebuilt each time.
set -euo pipefail
cd "$(dirname "$0")/../.."
ABCROWN_COMMIT=8250d5fbd530c76e5e3243db28b3cad5fbaef740
AUTOLIRPA_COMMIT=9d100ec070868440b48d34e2f1dd21b97aab9172
ONNX2PYTORCH_COMMIT=fe7281b9b6c8c28f61e72b8f3b0e3181067c7399
ABCROWN_SRC="${1:-https://github.com/Verified-Intelligence/alpha-beta-CROWN.git}"
AUTOLIRPA_SRC="${2:-https://github.com/Verified-Intelligence/auto_LiRPA.git}"
ONNX2PYTORCH_SRC="${3:-https://github.com/Verified-Intelligence/onnx2pytorch.git}"
DEST="${4:-.peers/abcrown}"
PY="${PYTHON:-.venv/bin/python}"
STAND_INS="$PWD/benchmarks/peers/stand_ins"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# repo SRC NAME: a git directory holding SRC's history (SRC itself when it is a local repository, else a clone).
repo() {
  if [ -d "$1" ]; then echo "$1"; else git clone -q --bare "$1" "$TMP/$2.git" && echo "$TMP/$2.git"; fi
}
# export GITDIR COMMIT OUT: COMMIT's tree into OUT, without the blobs GITDIR lacks (named on stderr).
export_tree() {
  local gitdir="$1" commit="$2" out="$3" full missing
  full="$(git -C "$gitdir" rev-parse --verify "$commit^{commit}")" || {
    echo "error: $gitdir has no commit $commit (fetch it, or pass a clone that has it)" >&2; exit 2; }
  missing="$(git -C "$gitdir" ls-tree -r "$full" | awk '$2 == "blob" {print $3, $4}' |
    while read -r sha path; do git -C "$gitdir" cat-file -e "$sha" 2>/dev/null || echo "$path"; done)"
  local excludes=()
  if [ -n "$missing" ]; then
    echo "note: $(wc -l <<<"$missing") file(s) absent from $gitdir, left out: $(tr '\n' ' ' <<<"$missing")" >&2
    while read -r path; do excludes+=(":(exclude)$path"); done <<<"$missing"
  fi
  mkdir -p "$out"
  # git archive still names an excluded absent blob on stderr and exits 0: its stderr is shown only on failure.
  git -C "$gitdir" archive "$full" -- . "${excludes[@]}" 2>"$TMP/archive.err" | tar -x -C "$out" ||
    { cat "$TMP/archive.err" >&2; exit 2; }
}

ABCROWN_GIT="$(repo "$ABCROWN_SRC" abcrown)"
AUTOLIRPA_GIT="$(repo "$AUTOLIRPA_SRC" auto_lirpa)"
ONNX2PYTORCH_GIT="$(repo "$ONNX2PYTORCH_SRC" onnx2pytorch)"
export_tree "$ABCROWN_GIT" "$ABCROWN_COMMIT" "$TMP/src"
pinned="$(git -C "$ABCROWN_GIT" ls-tree "$ABCROWN_COMMIT" auto_LiRPA | awk '{print $3}')"
[ "$pinned" = "$AUTOLIRPA_COMMIT" ] || { echo "error: α,β-CROWN pins auto_LiRPA $pinned, not $AUTOLIRPA_COMMIT" >&2; exit 2; }
rm -rf "$TMP/src/auto_LiRPA" && export_tree "$AUTOLIRPA_GIT" "$AUTOLIRPA_COMMIT" "$TMP/src/auto_LiRPA"
export_tree "$ONNX2PYTORCH_GIT" "$ONNX2PYTORCH_COMMIT" "$TMP/onnx2pytorch"
rm -rf "$DEST" && mkdir -p "$DEST/pkgs" && mv "$TMP/src" "$DEST/src" && mv "$TMP/onnx2pytorch/onnx2pytorch" "$DEST/pkgs/"
printf 'alpha-beta-CROWN %s\nauto_LiRPA %s\nonnx2pytorch %s\n' "$ABCROWN_COMMIT" "$AUTOLIRPA_COMMIT" \
  "$ONNX2PYTORCH_COMMIT" > "$DEST/COMMITS"

# α,β-CROWN's requirements (complete_verifier/requirements.txt, setup.py's runtime ones, auto_LiRPA's) and what
# those need, as import name:distribution; only the ones the interpreter lacks are installed.
NEEDS="onnxruntime:onnxruntime onnxsim:onnxsim skl2onnx:skl2onnx sklearn:scikit-learn termcolor:termcolor
onnxoptimizer:onnxoptimizer psutil:psutil yaml:pyyaml sortedcontainers:sortedcontainers pandas:pandas pytz:pytz
dateutil:python-dateutil tzdata:tzdata appdirs:appdirs graphviz:graphviz tqdm:tqdm packaging:packaging onnx:onnx
sympy:sympy scipy:scipy gurobipy:gurobipy"
missing=()
for need in $NEEDS; do
  "$PY" -c "import ${need%%:*}" 2>/dev/null || missing+=("${need##*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing into $DEST/pkgs: ${missing[*]}"
  "$PY" -m pip install -q --no-deps --target "$DEST/pkgs" "${missing[@]}"
fi

# The check: α,β-CROWN's modules import on this interpreter with the fork and CPU torch.
(cd "$DEST/src/complete_verifier" && PYTHONPATH="$PWD/../../pkgs:$STAND_INS" "$PY" -W ignore -c "
import inspect, sys
import torch, onnx2pytorch, auto_LiRPA
assert 'quirks' in inspect.signature(onnx2pytorch.ConvertModel).parameters, 'not the fork: ConvertModel takes no quirks'
sys.argv = ['abcrown.py', '--device', 'cpu']
import abcrown, arguments
print('α,β-CROWN', arguments.__file__.rsplit('/', 2)[0], 'imports: torch', torch.__version__, 'auto_LiRPA',
      auto_LiRPA.__version__, 'onnx2pytorch', onnx2pytorch.__file__)")
