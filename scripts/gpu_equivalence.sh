#!/usr/bin/env bash
# Whether this checkout trains bit for bit as another version of the code does, on the GPU: the same short CIFAR-10
# runs (ResNet-32, 1 epoch a task: iCaRL FP32 with torch's deterministic kernels; iCaRL and BiC HDQT on the CuPy kernels; iCaRL HDQT on the torch
# reference) made in both trees, then compared with scripts/compare_runs.py (accuracy matrices, per-class accuracies,
# losses, quantization statistics). The two trees run side by side.
#   git archive <commit> hdqt_cil hydra_plugins configs run.py data_prep | tar x -C .device_data/base   (here)
#   bash scripts/gpu_equivalence.sh .device_data/base .device_data/cifar10_jpg.tar.xz $OUT/equivalence   (there)
# The wheels must be importable (PYTHONPATH), as scripts/device_sweep.sh and scripts/gpu_check.sh install them.
set -uo pipefail
base=$(realpath "$1") archive=$(realpath "$2") out=$3
here=$(realpath "$(dirname "$0")/..")
mkdir -p "$out"
out=$(realpath "$out")
common=(+experiment=cifar10_paper benchmark.root="$archive" benchmark.augment_on=gpu trainer.num_workers=0
        trainer.epochs=1 seed=0)
runs=("strategy=icarl quant=fp32 trainer.deterministic=true tag=eq" "strategy=icarl quant=hdqt quant.backend=cupy tag=cupy"
      "strategy=bic quant=hdqt quant.backend=cupy tag=cupy" "strategy=icarl quant=hdqt quant.backend=torch tag=torch")

make_runs() {  # tree, name
  for run in "${runs[@]}"; do
    (cd "$1" && PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$1" python3 run.py "${common[@]}" $run \
      results_root="$out/$2" >>"$out/$2.log" 2>&1) || echo "$2: '$run' failed (exit $?)" >>"$out/$2.log"
  done
}
start=$(date +%s)
make_runs "$base" base & make_runs "$here" head & wait
echo "runs made in $(( $(date +%s) - start )) s" | tee "$out/compare.txt"
python3 "$here/scripts/compare_runs.py" "$out/base" "$out/head" | tee -a "$out/compare.txt"
status=${PIPESTATUS[0]}
echo "compare_runs exit $status" | tee -a "$out/compare.txt"
exit "$status"
