#!/usr/bin/env bash
# Runs ON the lent GPU machine. A device call ends the processes it leaves behind, except those in a session of
# their own: `start` runs scripts/device_sweep.sh that way, so a sweep longer than one call's limit trains on
# without restarts through the calls that follow (each made within the machine's idle release), and `wait` is
# what those calls run.
#   [ENV=value ...] bash scripts/device_background.sh start NAME <device_sweep.sh overrides...>
#       starts sweep NAME (its log, tables and run archive in /tmp/sweeps/NAME; results under /tmp/runs, shared by
#       every sweep) and returns; environment variables reach the sweep (CUDA_VISIBLE_DEVICES: its GPUs).
#   bash scripts/device_background.sh wait SECONDS
#       waits until every sweep has ended or SECONDS have passed, prints each one's progress, and copies to $OUT
#       each sweep's files and runs_now.tgz: every run folder so far, checkpoints left out.
set -euo pipefail
root=/tmp/sweeps
case ${1:-} in
  start)
    name=${2:?a sweep name}; shift 2
    [ -d /tmp/site ] ||  # once, before sweeps that start together
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    mkdir -p "$root/$name"
    OUT=$root/$name setsid nohup bash scripts/device_sweep.sh "$@" >"$root/$name/outer.log" 2>&1 </dev/null &
    echo $! >"$root/$name/pid"
    echo "started sweep $name (pid $!)" ;;
  wait)
    deadline=$(( $(date +%s) + ${2:?seconds to wait} ))
    alive() { for pid in "$root"/*/pid; do kill -0 "$(cat "$pid")" 2>/dev/null && return 0; done; return 1; }
    while alive && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    out=${OUT:-device_out}
    for folder in "$root"/*/; do
      name=$(basename "$folder")
      state=$(kill -0 "$(cat "$folder/pid")" 2>/dev/null && echo running || echo ended)
      echo "== $name: $state"
      grep -E "after experience" "$folder/sweep.log" 2>/dev/null | tail -n 2 || true
      mkdir -p "$out/$name" && cp "$folder"/*.txt "$folder"/*.tgz "$out/$name/" 2>/dev/null || true
      [ "$state" = ended ] && cp "$folder/sweep.log" "$out/$name/" || true
    done
    echo "finished runs: $(find /tmp/runs -name summary.json 2>/dev/null | wc -l)"
    [ -d /tmp/runs ] && tar czf "$out/runs_now.tgz" --exclude=checkpoints -C /tmp runs
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader ;;
  *) echo "usage: $0 start NAME <overrides...> | wait SECONDS" >&2; exit 2 ;;
esac
