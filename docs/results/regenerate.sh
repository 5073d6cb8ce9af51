#!/usr/bin/env bash
# Regenerate every table and figure under docs/results/ from the current code, in one command:
#
#   docs/results/regenerate.sh            # hours on 2 CPU cores (JOBS=2 uses both); a rerun skips every finished point
#
# study/         Table II as a reviewer asks for it: 5 seeds, mean ± 95% t-interval, validation and
#                test, ReLU trained from scratch, ablations (λ not learned; GELU swapped at e_s then fine-tuned),
#                paired comparisons: configs/sweeps/study-*.toml
# paper-offline/ the paper's Tables I/II, Figure 3 and λ profiles at 3 seeds: configs/sweeps/offline-*.toml
# paper-tc-grid/ the paper's Figure 1, the (t, c) grid: configs/sweeps/offline-tc-grid-fmnist.toml
# downstream/    does hardening pay downstream (int8, pruning, verification, certified radii): 5 benchmarks × 5 seeds ×
#                5 variants, configs/sweeps/downstream-*.toml; only with ONLY=downstream (docs/results/downstream.md
#                states its measured cost)
#
# Environment (all optional):
#   ONLY="study paper"   which groups to run (default both; "downstream" runs the downstream study)
#   RUNS=runs-paper      where the run directories go (one folder per sweep below it)
#   RESULTS=docs/results where the reports go
#   OPTS=                options for every `pipeline sweep`, e.g. "--grid seed=0,1" or "--shard 0/4"
#   JOBS=1               shards of each sweep run side by side on this machine, one core each (JOBS=2 on 2 cores);
#                        not with a --shard in OPTS (a cluster task runs one shard)
#   OVERRIDES=           config overrides for every point, e.g. "train.epochs=2 data.subset=500"
#   PIPELINE=".venv/bin/python -m pipeline.cli"
#   LIRPA_PYTHON=.peers/auto_lirpa/bin/python, LIRPA_PATH=   auto_LiRPA's interpreter and an extra PYTHONPATH entry
#                        for it (ONLY=downstream: its view of the same networks)
# A smoke test of the whole chain (minutes):
#   ONLY=study RUNS=/tmp/study RESULTS=/tmp/results OPTS="--grid seed=0,1" OVERRIDES="train.epochs=2 data.subset=500" \
#     docs/results/regenerate.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PIPELINE=${PIPELINE:-.venv/bin/python -m pipeline.cli}
ONLY=${ONLY:-study paper}
RUNS=${RUNS:-runs-paper}
RESULTS=${RESULTS:-docs/results}
OPTS=${OPTS:-}
OVERRIDES=${OVERRIDES:-}

JOBS=${JOBS:-1}
if [[ ! "$JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "regenerate: JOBS must be a positive integer (shards side by side), got '$JOBS'" >&2; exit 2
fi
if (( JOBS > 1 )) && [[ "$OPTS" == *--shard* ]]; then
  echo "regenerate: JOBS=$JOBS and a --shard in OPTS: choose one (JOBS shards here, or one --shard per cluster task)" >&2; exit 2
fi

sweep() {  # sweep FILE-STEM OUT-SUBDIR: options before the file, overrides after it (argparse takes them in that order)
  if (( JOBS == 1 )); then
    # shellcheck disable=SC2086  # word splitting of PIPELINE, OPTS and OVERRIDES is intended
    nice -n 19 $PIPELINE sweep --out "$RUNS/$2" $OPTS "configs/sweeps/$1.toml" $OVERRIDES
    return
  fi
  local k rc=0 pids=()
  for ((k = 0; k < JOBS; k++)); do  # the shards share the out folder, each writing its own index
    # shellcheck disable=SC2086
    nice -n 19 $PIPELINE sweep --out "$RUNS/$2" $OPTS --shard "$k/$JOBS" "configs/sweeps/$1.toml" $OVERRIDES &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || rc=1; done
  return $rc
}
report() {  # report OUT TITLE DIR...
  local out=$1 title=$2
  shift 2
  # shellcheck disable=SC2086
  $PIPELINE report "$@" --out "$out" --title "$title"
}

if [[ " $ONLY " == *" study "* ]]; then
  studies=(digits-mlp breast-cancer-mlp adult-mlp fmnist-mlp fmnist-cnn)
  for s in "${studies[@]}"; do
    sweep "study-$s" "study/$s"
  done
  report "$RESULTS/study" "λ-GELU → ReLU: Table II with intervals, test split, ReLU from scratch and ablations" \
    "${studies[@]/#/$RUNS/study/}"
fi

if [[ " $ONLY " == *" downstream "* ]]; then
  downstream=(digits-mlp breast-cancer-mlp adult-mlp fmnist-mlp fmnist-cnn)
  for s in "${downstream[@]}"; do
    sweep "downstream-$s" "downstream/$s"
  done
  # auto_LiRPA's view of the same networks (benchmarks/peers/auto_lirpa_setup.sh builds its interpreter)
  LIRPA_PYTHON=${LIRPA_PYTHON:-.peers/auto_lirpa/bin/python}
  if [[ -x "$LIRPA_PYTHON" ]]; then
    # shellcheck disable=SC2086
    nice -n 19 ${PIPELINE% -m pipeline.cli} benchmarks/peers/lirpa_downstream.py --peer-python "$LIRPA_PYTHON" \
      --peer-path "${LIRPA_PATH:-}" "$RUNS"/downstream/*/*/
  else
    echo "regenerate: no auto_LiRPA interpreter at $LIRPA_PYTHON (benchmarks/peers/auto_lirpa_setup.sh): its columns are left out" >&2
  fi
  report "$RESULTS/downstream" "Does hardening pay downstream? int8, pruning and verification of the shipped networks" \
    "${downstream[@]/#/$RUNS/downstream/}"
fi

if [[ " $ONLY " == *" paper "* ]]; then
  offline=(fmnist-mlp adult-mlp fmnist-cnn shakespeare-chargpt)
  for s in "${offline[@]}"; do
    sweep "offline-$s" "offline/$s"
  done
  sweep offline-tc-grid-fmnist offline/tc-grid-fmnist
  report "$RESULTS/paper-offline" "λ-GELU: the paper's tables on the offline benchmarks" "${offline[@]/#/$RUNS/offline/}"
  report "$RESULTS/paper-tc-grid" "λ-GELU: the (t, c) grid (Figure 1) on MLP/Fashion-MNIST" "$RUNS/offline/tc-grid-fmnist"
fi
