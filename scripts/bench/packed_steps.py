"""Training steps of processes packed on one GPU: what a step costs when a sweep shares the GPU (CUDA MPS).

    python -m scripts.bench.packed_steps [--processes 12] [--steps 150] [--out results/bench]
                                         [--cases fp32 hdqt hdqt:one-stream int4 luq]

Each case starts `--processes` processes of one scheme, each replaying ResNet-32 training steps at batch 128 from
CUDA graphs (trainer.cuda_graph's path, scripts/bench/kernels.training_step); when all have captured, they run
`--steps` steps together. A row: the mean seconds a process took a step beside the others, and the GPU's steps a
second over all processes, against FP32's in the same call. `SCHEME:one-stream` runs each layer's backward on one
stream (quant/streams.py). The processes share the GPU through CUDA MPS, as a packed sweep's do
(hdqt_cil/sweep/mps.py: a daemon already running, or one started for the benchmark).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def worker(case: str, steps: int) -> None:
    """One packed process: capture, say `ready`, wait for `go` on stdin, time `steps` steps, print them as JSON."""
    from hdqt_cil.quant import NonFiniteError, streams
    from scripts.bench.kernels import tf32_off, training_step

    scheme, _, variant = case.partition(":")
    streams.PARALLEL = variant != "one-stream"
    tf32_off()
    one, captured = training_step("resnet32", scheme, "torch" if scheme == "fp32" else "cupy", path="graph")
    print("ready", flush=True)
    sys.stdin.readline()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        one()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    try:  # the same batch again and again: a scheme may diverge (LUQ does), which changes no kernel's work
        captured.check()
        finite = True
    except NonFiniteError:
        finite = False
    print(json.dumps({"seconds": seconds, "steps": steps, "finite": finite, "device": torch.cuda.get_device_name()}),
          flush=True)


def packed(case: str, processes: int, steps: int, env: dict) -> dict:
    """Run `processes` workers of `case` together; their step seconds and the steps a second over all of them."""
    command = [sys.executable, "-m", "scripts.bench.packed_steps", "--worker", case, "--steps", str(steps)]
    workers = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
               for _ in range(processes)]
    for w in workers:
        if w.stdout.readline().strip() != "ready":
            raise SystemExit(f"a {case} worker failed before its steps (exit {w.wait()})")
    started = time.perf_counter()
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    results = [json.loads(w.stdout.readline()) for w in workers]
    wall = time.perf_counter() - started
    for w in workers:
        w.wait()
    per_step = [r["seconds"] / r["steps"] for r in results]
    return {"case": case, "device": results[0]["device"], "processes": processes, "steps": steps,
            "step_s": statistics.mean(per_step), "step_s_spread": [min(per_step), max(per_step)],
            "steps_per_s": processes * steps / wall, "wall_s": wall, "finite": all(r["finite"] for r in results)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=12)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--cases", nargs="+", default=["fp32", "hdqt", "hdqt:one-stream", "int4", "luq"])
    parser.add_argument("--out", default="results/bench")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps)
    from hdqt_cil.sweep import mps
    from scripts.bench.record import save_rows

    started, rows = time.time(), []
    cases = ["fp32", *(c for c in args.cases if c != "fp32")]  # the baseline first: every ratio is to it
    with tempfile.TemporaryDirectory() as folder, mps.sharing(Path(folder), required=True) as mps_env:
        for case in cases:  # the parent makes no CUDA context: every one goes through the daemon
            rows.append(packed(case, args.processes, args.steps, {**os.environ, **mps_env}))
            r = rows[-1]
            r["x_fp32"] = r["step_s"] / rows[0]["step_s"]
            print(f"{case:>18}: {r['step_s'] * 1e3:7.2f} ms a step beside the others "
                  f"({r['step_s_spread'][0] * 1e3:.2f}-{r['step_s_spread'][1] * 1e3:.2f}), {r['x_fp32']:.2f}x "
                  f"FP32's; {r['steps_per_s']:.0f} steps/s over all", flush=True)
    device = rows[0]["device"]
    header = f"device {device}, {args.processes} processes a case under CUDA MPS, ResNet-32 at batch 128"
    print(f"JSON: {save_rows(args.out, 'packed_steps', device, header, started, rows)}")


if __name__ == "__main__":
    main()
