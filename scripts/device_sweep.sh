#!/usr/bin/env bash
# Runs ON the lent GPU machine, from the repository root (after scripts/prepare_device.sh here, with .whl and
# .device_data carried): installs the wheels, makes the HAR feature files from the carried raw archives,
# runs one Hydra sweep with JOBS processes at once, and leaves the run folders (runs.tgz), the tables (tables.tgz) and
# the log under $OUT.   Usage: JOBS=12 bash scripts/device_sweep.sh <run.py overrides...>
# Carried extras it uses when present:
#   .device_data/kernel_cache   compiled cubins (scripts/gpu_check.sh says how to fill it): no compiling per job
#   .device_data/runs_*.tgz     run folders of earlier calls (their runs.tgz), unpacked under the results root
#                               without overwriting: finished runs are skipped, so a sweep can name all seeds
# A sweep cut by the call's time limit resumes its unfinished runs from their checkpoints when run again: from the
# results root (/tmp/runs) while the machine stays warm, else from runs_ckpt_<run>.tgz (one unfinished run's
# checkpoints, a few MB a ResNet-32 run) carried back with that call's runs.tgz as .device_data/runs_*.tgz.
# SWEEP_TIMEOUT=seconds stops the sweep (its job processes too) in time to leave the tables and runs.tgz.
set -euo pipefail
out=${OUT:-device_out}
mkdir -p "$out"
[ -d /tmp/site ] ||  # a warm machine keeps the wheels of its first call
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HDQT_DATA=$PWD/data HDQT_RESULTS=/tmp/runs
[ -d .device_data/kernel_cache ] && export HDQT_KERNEL_CACHE=$PWD/.device_data/kernel_cache
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
if [ -f .device_data/hapt_raw.tar.xz ]; then
  python3 -m data_prep.hapt --archive .device_data/hapt_raw.tar.xz --out data/hapt_features.npz
fi
for earlier in .device_data/runs_*.tgz; do
  [ -f "$earlier" ] && tar xzf "$earlier" -C /tmp --skip-old-files
done
start=$(date +%s)
status=0
timeout "${SWEEP_TIMEOUT:-0}" python3 run.py -m hydra/launcher=gpus hydra.launcher.n_jobs="${JOBS:-1}" on_divergence=continue "$@" \
  >"$out/sweep.log" 2>&1 || status=$?
echo "sweep exit $status after $(( $(date +%s) - start )) s" | tee -a "$out/device.txt"
tail -5 "$out/sweep.log"
# The tables go in one archive (the sweep prints them too): a call returns at most 8 files, and each unfinished
# run adds one below.
python3 scripts/make_tables.py /tmp/runs --out /tmp/tables && tar czf "$out/tables.tgz" -C /tmp tables || true
tar czf "$out/runs.tgz" --exclude=checkpoints -C /tmp runs
# One archive per unfinished run: a returned file may hold 16 MiB, a ResNet-32 run's checkpoints 4-8 MB.
for ckpt in $(cd /tmp && find runs -type d -name checkpoints); do
  run=${ckpt%/checkpoints}
  tar czf "$out/runs_ckpt_$(echo "${run#runs/}" | tr / _).tgz" -C /tmp "$ckpt"
done
exit $status
