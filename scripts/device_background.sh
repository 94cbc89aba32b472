#!/usr/bin/env bash
# Runs ON a GPU node without network access. A remote command ends the processes it leaves behind, except
# those in a session of their own: `start` runs scripts/device_sweep.sh that way, so a sweep longer than one
# command's time limit trains on without restarts through the commands that follow (each made before the node is
# released), and `wait` is what those commands run.
#   [ENV=value ...] bash scripts/device_background.sh start NAME <device_sweep.sh overrides...>
#       starts sweep NAME (its log, tables and run archive in /tmp/sweeps/NAME; results under /tmp/runs, shared by
#       every sweep) and returns; environment variables reach the sweep (CUDA_VISIBLE_DEVICES: its GPUs). The sweep
#       runs the code as it is at its start, copied to /tmp/sweeps/NAME/checkout: a later remote command re-sends
#       the working tree, and a job starting then would read files half replaced, or other code than the sweep's
#       first jobs ran.
#   bash scripts/device_background.sh stop NAME
#       stops sweep NAME and every process it started (its job processes too), so that its GPUs can take other
#       work; its unfinished runs resume from their checkpoints when a sweep names them again.
#   [CHECKPOINTS=n] [STALL=s] bash scripts/device_background.sh wait SECONDS
#       waits until every sweep has ended, SECONDS have passed or no run has logged anything for STALL seconds
#       (default 300: a run logs every few epochs; one process's hung or faulted kernel stops every process on the
#       GPU under CUDA MPS, and waiting on it wastes the machine), prints each sweep's progress and each unfinished
#       run's last epoch line (its experience, epoch, loss and seconds an epoch), and leaves in $OUT
#       (a call returns at most 8 files) logs.tgz (every sweep's logs), runs_now.tgz (every run folder so far,
#       checkpoints left out) and, with CHECKPOINTS=n, up to n (at most 6) ckpt_<k>.tgz files of the unfinished runs'
#       checkpoints (scripts/pack_checkpoints.py) for the next machine: packed once here for every sweep, so a
#       sweep started here packs none of its own (CKPT_FILES=0 unless set). Later calls fetch the rest from the
#       same snapshot: python3 scripts/pack_checkpoints.py $OUT 8 SKIP.
# Sweeps started together share one CUDA MPS control daemon at the default pipe folder, started by the first
# `start` and left running for the machine's life (a sweep's own daemon would stop with it, under the others).
set -euo pipefail
root=${SWEEPS:-/tmp/sweeps}  # SWEEPS: another folder (tests)
runs=${RUNS:-/tmp/runs}  # the sweeps' results root (device_sweep.sh's HDQT_RESULTS); RUNS: another (tests)
case ${1:-} in
  start)
    name=${2:?a sweep name}; shift 2
    source scripts/offline_site.sh  # once, before sweeps that start together
    if command -v nvidia-cuda-mps-control >/dev/null && [ ! -e /tmp/nvidia-mps/control ]; then
      mkdir -p /tmp/nvidia-mps /tmp/nvidia-mps-log
      # the daemon sees every GPU: a sweep's CUDA_VISIBLE_DEVICES picks among them for its own jobs only
      env -u CUDA_VISIBLE_DEVICES CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-mps-log \
        nvidia-cuda-mps-control -d
    fi
    # the code its jobs run, copied; the rest (wheels, data, carried archives) linked to the checkout
    checkout=$root/$name/checkout
    rm -rf "$checkout" "$root/$name/pid" && mkdir -p "$checkout"
    for entry in * .[!.]*; do
      case $entry in
        hdqt_cil|hydra_plugins|data_prep|scripts|run.py) cp -r "$entry" "$checkout/" ;;
        .git) ;;
        *) ln -s "$PWD/$entry" "$checkout/$entry" ;;
      esac
    done
    # setsid --fork: the sweep leads a new session (`stop` ends that session) and `start` returns at once; the sweep
    # writes its own pid, that session's.
    OUT=$root/$name CKPT_FILES=${CKPT_FILES:-0} setsid --fork nohup bash -c \
      'cd "$0" && echo $$ >"$1" && shift && exec bash scripts/device_sweep.sh "$@"' "$checkout" "$root/$name/pid" "$@" \
      >"$root/$name/outer.log" 2>&1 </dev/null
    for _ in $(seq 50); do [ -s "$root/$name/pid" ] && break; sleep 0.1; done
    echo "started sweep $name (pid $(cat "$root/$name/pid"))" ;;
  stop)
    name=${2:?a sweep name}
    session=$(cat "$root/$name/pid")  # the sweep's first process, its session's leader
    # The whole session, not the process group `start` made: `timeout` (device_sweep.sh) moves the sweep into a
    # group of its own, so the group's end would leave the sweep and its job processes training.
    pkill -TERM -s "$session" || true
    for _ in $(seq 30); do pgrep -s "$session" >/dev/null || break; sleep 1; done
    pkill -KILL -s "$session" || true
    echo "stopped sweep $name" ;;
  wait)
    deadline=$(( $(date +%s) + ${2:?seconds to wait} ))
    alive() { for pid in "$root"/*/pid; do kill -0 "$(cat "$pid")" 2>/dev/null && return 0; done; return 1; }
    # seconds since any run or sweep last wrote to its log
    quiet() { echo $(( $(date +%s) - $(find "$root" "$runs" -name checkout -prune -o -name '*.log' \
                                           -printf '%T@\n' 2>/dev/null | sort -n | tail -n 1 | cut -d. -f1) )); }
    while alive && [ "$(date +%s)" -lt "$deadline" ]; do
      silent=$(quiet)
      if [ "$silent" -ge "${STALL:-300}" ]; then
        echo "STALLED: no run has logged anything for $silent s; the sweeps are left running (stop NAME ends one)"
        break
      fi
      sleep 5
    done
    out=${OUT:-device_out}
    mkdir -p "$out"
    for folder in "$root"/*/; do
      state=$(kill -0 "$(cat "$folder/pid")" 2>/dev/null && echo running || echo ended)
      echo "== $(basename "$folder"): $state"
      grep -E "after experience" "$folder/sweep.log" 2>/dev/null | tail -n 2 || true
    done
    unfinished=$(find "$runs" -name summary.json -exec grep -L -E '"(complete|diverged)"' {} + 2>/dev/null || true)
    for summary in $unfinished; do  # a log line: [time][logger][LEVEL] - message
      { grep -E ": experience [0-9]+, epoch [0-9]+/" "$(dirname "$summary")/run.log" 2>/dev/null || true; } |
        tail -n 1 | sed 's/^\[[^]]*\]\[[^]]*\]\[[A-Z]*\] - //'
    done
    tar czf "$out/logs.tgz" --exclude='*.tgz' --exclude=checkout -C "$(dirname "$root")" "$(basename "$root")"
    echo "finished runs: $(find "$runs" -name summary.json -exec grep -l '"complete"' {} + 2>/dev/null | wc -l)"
    [ -d "$runs" ] && tar czf "$out/runs_now.tgz" --exclude=checkpoints -C "$(dirname "$runs")" "$(basename "$runs")"
    # logs.tgz and runs_now.tgz take two of the 8 files a call returns: 6 checkpoint files at most
    files=$(( ${CHECKPOINTS:-0} < 6 ? ${CHECKPOINTS:-0} : 6 ))
    [ "$files" -gt 0 ] && python3 scripts/pack_checkpoints.py "$out" "$files" --root "$runs"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
    fi ;;
  *) echo "usage: $0 start NAME <overrides...> | stop NAME | wait SECONDS" >&2; exit 2 ;;
esac
