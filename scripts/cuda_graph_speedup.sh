#!/usr/bin/env bash
# One experiment run twice, eagerly and with trainer.cuda_graph=true, one after the other on the same GPU: prints
# each run's wall time and whether their accuracy matrices and losses are equal. Run folders under $HDQT_RESULTS
# (tags graph-off / graph-on).   Usage: bash scripts/cuda_graph_speedup.sh <run.py overrides...>
set -euo pipefail
export HDQT_RESULTS=${HDQT_RESULTS:-/tmp/graph_speedup}
for mode in false true; do
  python3 run.py "$@" trainer.cuda_graph=$mode tag=graph-$([ $mode = true ] && echo on || echo off) \
    overwrite=true logging.progress=off >/dev/null
done
python3 - "$HDQT_RESULTS" <<'PY'
import json, sys
from pathlib import Path
runs = {p.parent.parent.name: json.loads(p.read_text()) for p in Path(sys.argv[1]).rglob("summary.json")}
off, on = (next(v for k, v in runs.items() if k.endswith(tag)) for tag in ("graph-off", "graph-on"))
print(f"device {on['device']}; {on['run']}")
print(f"eager {off['wall_time_s']:.1f} s, CUDA graphs {on['wall_time_s']:.1f} s: "
      f"{off['wall_time_s'] / on['wall_time_s']:.2f}x faster")
print("accuracy matrix equal:", off["acc_matrix"] == on["acc_matrix"], "| losses equal:",
      off["train_loss"] == on["train_loss"], "| avg/last", on["metrics"]["avg_acc"], on["metrics"]["last_acc"])
PY
