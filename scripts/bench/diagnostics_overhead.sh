#!/usr/bin/env bash
# What diagnostics=light costs a training epoch: the same CIFAR-10 iCaRL run (ResNet-32, steps replayed from CUDA
# graphs) with diagnostics=off and diagnostics=light (every=50), one process after the other:
#   [DATA=<cifar-10 root>] [QUANT=hdqt] [EPOCHS=4] bash scripts/bench/diagnostics_overhead.sh
# Without DATA, a CIFAR-10-shaped set of random images in torchvision's layout is written (5,000 a class for
# training, 1,000 for testing). $OUT (default /tmp/diagnostics_overhead) receives runs.log, epochs.txt (each epoch's
# loss and time), walls.txt (whole processes) and overhead.txt: the mean time of an epoch after a task's first (the
# first captures the graphs) with each setting, and their ratio.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/diagnostics_overhead}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=$([ -d /tmp/site ] && echo /tmp/site:)$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -z "${DATA:-}" ]; then
  DATA=/tmp/cifar10_random
  [ -d "$DATA" ] || $PY -c "import sys, pathlib; sys.path.insert(0, 'tests'); from test_cifar import write_torchvision_cifar
write_torchvision_cifar(pathlib.Path('$DATA'), 'cifar10', per_class_train=5000, per_class_test=1000)"
fi
status=0
: >"$OUT/walls.txt"
: >"$OUT/epochs.txt"
for level in off light; do
  start=$(date +%s%N)
  $PY run.py +experiment=cifar10_paper benchmark.root="$DATA" benchmark.verify=false benchmark.augment_on=gpu \
    trainer.num_workers=0 strategy=icarl quant=${QUANT:-hdqt} trainer.epochs=${EPOCHS:-4} seed=0 \
    diagnostics=$level diagnostics.every=50 logging.progress=off results_root=/tmp/diagnostics_overhead_runs/$level \
    >"$OUT/run_$level.log" 2>&1 || status=1
  echo "diagnostics=$level $(( ($(date +%s%N) - start) / 1000000 )) ms" >>"$OUT/walls.txt"
  grep -E "epoch [0-9]+/[0-9]+: mean training loss" "$OUT/run_$level.log" | sed "s/^/$level: /" >>"$OUT/epochs.txt"
  cat "$OUT/run_$level.log" >>"$OUT/runs.log" && rm "$OUT/run_$level.log"
done
$PY - "$OUT/epochs.txt" >"$OUT/overhead.txt" <<'PY' || status=1
import re, sys
times = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+): .*epoch (\d+)/\d+: .*\(([\d.]+) s an epoch\)", line)
    if m and m[2] != "1":
        times.setdefault(m[1], []).append(float(m[3]))
mean = {level: sum(t) / len(t) for level, t in times.items()}
for level, t in times.items():
    print(f"diagnostics={level}: {mean[level]:.3f} s an epoch after a task's first ({len(t)} epochs)")
print(f"light / off: {mean['light'] / mean['off']:.3f}")
PY
cat "$OUT/walls.txt" "$OUT/overhead.txt"
exit $status
