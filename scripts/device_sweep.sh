#!/usr/bin/env bash
# Runs ON a GPU node without network access, from the repository root (after scripts/prepare_device.sh here, with
# .whl and .device_data copied along): installs the wheels, makes the HAR feature files from the raw archives, runs one
# Hydra sweep packed onto the GPU (hydra/launcher=gpus: jobs_per_gpu from its config, or $JOBS_PER_GPU; CUDA MPS),
# and leaves the run folders (runs.tgz, without checkpoints), the tables (tables.tgz) and the log under $OUT.
#   Usage: [JOBS_PER_GPU=N] [SWEEP_TIMEOUT=s] bash scripts/device_sweep.sh <run.py overrides...>
# A sweep cut by SWEEP_TIMEOUT (or the call's limit) resumes its unfinished runs from their checkpoints when run
# again: from the results root (/tmp/runs) while the machine stays warm, else from the checkpoints of its
# unfinished runs, packed into ckpt_<k>.tgz files of at most 9 MiB each (scripts/pack_checkpoints.py says why):
# CKPT_FILES (default 5) of them a call, CKPT_SKIP=n leaves out the first n (for a second call that fetches the
# rest). Carried back as .device_data/runs_*.tgz and .device_data/ckpt_*.tgz, they are unpacked under the results
# root without overwriting: finished runs are skipped, so a sweep can name all seeds.
set -euo pipefail
out=${OUT:-device_out}
mkdir -p "$out"
source scripts/offline_site.sh
export PYTHONUNBUFFERED=1 HDQT_DATA=$PWD/data HDQT_RESULTS=/tmp/runs
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
hapt=(.device_data/hapt_raw.*)  # the HAPT release archive prepare_device.sh staged, if any
if [ -f "${hapt[0]}" ] && [ ! -f data/hapt_features.npz ]; then
  python3 -m data_prep.hapt --archive "${hapt[0]}" --out data/hapt_features.npz
fi
[ -f .device_data/dsads_features.npz ] && mkdir -p data && cp -u .device_data/dsads_features.npz data/
# Each carried archive is unpacked once a machine: unpacked again for a later sweep, it would put back the
# checkpoints of runs that have since finished (and cleared them) or moved on.
mkdir -p /tmp/unpacked
for earlier in .device_data/runs_*.tgz .device_data/ckpt_*.tgz; do
  [ -f "$earlier" ] || continue
  seen=/tmp/unpacked/$(basename "$earlier").$(stat -c %s "$earlier")
  [ -e "$seen" ] || { tar xzf "$earlier" -C /tmp --skip-old-files && touch "$seen"; }
done
launcher=(-m hydra/launcher=gpus on_divergence=continue)
[ -n "${JOBS_PER_GPU:-}" ] && launcher+=(hydra.launcher.jobs_per_gpu="$JOBS_PER_GPU")
start=$(date +%s)
status=0
timeout "${SWEEP_TIMEOUT:-0}" python3 run.py "${launcher[@]}" "$@" >>"$out/sweep.log" 2>&1 || status=$?
echo "sweep exit $status after $(( $(date +%s) - start )) s" | tee -a "$out/device.txt"
grep -E "after experience|sweep|CUDA MPS|GPU\(s\)" "$out/sweep.log" | tail -8 || true
python3 scripts/make_tables.py /tmp/runs --out /tmp/tables >/dev/null && tar czf "$out/tables.tgz" -C /tmp tables || true
tar czf "$out/runs.tgz" --exclude=checkpoints -C /tmp runs
# CKPT_FILES=0 (a background sweep): wait packs them once for every sweep; packing here would also re-stage
# the snapshot that wait's later calls copy from.
if [ "${CKPT_FILES:-5}" -gt 0 ]; then
  python3 scripts/pack_checkpoints.py "$out" "${CKPT_FILES:-5}" "${CKPT_SKIP:-0}"
fi
exit $status
