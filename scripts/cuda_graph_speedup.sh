#!/usr/bin/env bash
# One experiment run twice, eagerly and with trainer.cuda_graph=true, one after the other on the same GPU: prints
# each run's wall time and whether their accuracy matrices and losses are equal. Each call's two run folders (tags
# graph-off / graph-on) go to a folder of its own under $HDQT_RESULTS (default /tmp/graph_speedup), which it names:
# a call compares its own runs alone.   Usage: bash scripts/cuda_graph_speedup.sh <run.py overrides...>
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p "${HDQT_RESULTS:=/tmp/graph_speedup}"
HDQT_RESULTS=$(mktemp -d "$HDQT_RESULTS/call.XXXXXX")
export HDQT_RESULTS
echo "run folders under $HDQT_RESULTS"
for mode in false true; do
  $PY run.py "$@" trainer.cuda_graph=$mode tag=graph-$([ $mode = true ] && echo on || echo off) \
    logging.progress=off >/dev/null
done
$PY - "$HDQT_RESULTS" <<'PY'
import json, sys
from pathlib import Path


def summary(tag):
    """The summary of this call's one run tagged `tag`."""
    found = [p for p in Path(sys.argv[1]).rglob("summary.json") if p.parent.parent.name.endswith(tag)]
    if len(found) != 1:
        sys.exit(f"cuda_graph_speedup.sh: {len(found)} runs tagged {tag} under {sys.argv[1]}, where one was "
                 "expected (leave results_root and -m out of the overrides)")
    return json.loads(found[0].read_text())


off, on = summary("graph-off"), summary("graph-on")
print(f"device {on['device']}; {on['run']}")
print(f"eager {off['wall_time_s']:.1f} s, CUDA graphs {on['wall_time_s']:.1f} s: "
      f"{off['wall_time_s'] / on['wall_time_s']:.2f}x faster")
print("accuracy matrix equal:", off["acc_matrix"] == on["acc_matrix"], "| losses equal:",
      off["train_loss"] == on["train_loss"], "| avg/last", on["metrics"]["avg_acc"], on["metrics"]["last_acc"])
PY
