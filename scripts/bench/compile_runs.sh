#!/usr/bin/env bash
# Whole FP32 runs with and without trainer.compile, one process at a time, each process's wall time (start-up and
# compilation included) and its losses and accuracies, on a GPU node:
#   bash scripts/bench/compile_runs.sh
# The data are CIFAR-10-sized images generated in torchvision's pickle format (5,000 a class for training, 1,000
# for testing; the time a step takes does not depend on the pixels), so that no dataset travels to the node.
# COMPILE_RUNS (default "false true false": the repeated run gives FP32's own run-to-run difference) and EPOCHS
# (default 2) a task; $OUT (default /tmp/compile_runs) receives runs.log and walls.txt.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/compile_runs}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
source scripts/offline_site.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader >"$OUT/walls.txt"
data=/tmp/compile_runs_data
[ -d "$data" ] || $PY -c "
import sys
from pathlib import Path
sys.path.insert(0, 'tests')
from test_cifar import write_torchvision_cifar
write_torchvision_cifar(Path('$data'), 'cifar10', 5000, 1000)" || exit 1
runs=/tmp/compile_runs_folders
rm -rf "$runs"
for compiled in ${COMPILE_RUNS:-false true false}; do
  n=$((${n:-0} + 1))
  start=$(date +%s%N)
  $PY run.py +experiment=cifar10_paper benchmark.root="$data" benchmark.verify=false benchmark.augment_on=gpu \
    trainer.num_workers=0 strategy=icarl trainer.epochs=${EPOCHS:-2} logging.progress=off seed=0 quant=fp32 \
    trainer.compile=$compiled results_root="$runs/$n-compile-$compiled" >>"$OUT/runs.log" 2>&1
  echo "compile=$compiled rc=$? $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$OUT/walls.txt"
done
for summary in "$runs"/*/*/*/*/seed0/summary.json; do
  $PY -c "
import json, sys
s = json.load(open(sys.argv[1]))
print(sys.argv[1].split('/')[3], 'loss (first, last experience):', [round(x, 5) for x in s['train_loss'][0]],
      [round(x, 5) for x in s['train_loss'][-1]], 'accuracy after the last:', s['acc_matrix'][-1])" "$summary"
done | tee -a "$OUT/walls.txt"
