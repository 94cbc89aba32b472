#!/usr/bin/env bash
# The same short CIFAR-10 iCaRL run with this tree's code and with a baseline tree's, compared bit for bit
# (scripts/compare_runs.py), one process at a time, each process's wall time recorded:
#   BASE=<tree> DATA=<cifar-10 archive> SCHEMES="hdqt luq" bash scripts/bench/identity.sh
# BASE holds the baseline commit's files (`git archive`) with its kernel bundle in hdqt_cil/kernels/prebuilt.
# This tree runs SCHEMES and fp32 (the wall-time baseline); BASE runs SCHEMES. EPOCHS (default 2) a task; EXTRA:
# more overrides for every run (e.g. benchmark.verify=false for generated images).
# $OUT (default /tmp/identity) receives identity.log (runs and comparisons), walls.txt and runs.tgz (the folders).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/identity}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=$([ -d /tmp/site ] && echo /tmp/site:)${PYTHONPATH:-}
runs=/tmp/identity_runs
rm -rf "$runs"
status=0

run() {  # tree, scheme, results root
  local start=$(date +%s%N)
  (cd "$1" && PYTHONPATH=$PWD:$PYTHONPATH $PY run.py +experiment=cifar10_paper benchmark.root="$DATA" \
    benchmark.augment_on=gpu trainer.num_workers=0 strategy=icarl trainer.epochs=${EPOCHS:-2} logging.progress=off \
    seed=0 quant="$2" results_root="$3" ${EXTRA:-}) >>"$OUT/identity.log" 2>&1 || status=1
  echo "$1 quant=$2 $(( ($(date +%s%N) - start) / 1000000 )) ms" >>"$OUT/walls.txt"
}

DATA=$(realpath "$DATA")
for scheme in ${SCHEMES:-hdqt}; do
  run "$BASE" "$scheme" "$runs/base"
  run . "$scheme" "$runs/new"
done
run . fp32 "$runs/new_fp32"
echo "== compare_runs base against new" >>"$OUT/identity.log"
$PY scripts/compare_runs.py "$runs/base" "$runs/new" >>"$OUT/identity.log" 2>&1 || status=1
tar czf "$OUT/runs.tgz" -C "$runs" .
cat "$OUT/walls.txt"
tail -n 3 "$OUT/identity.log"
exit $status
