"""How much faster a sweep runs when its runs share the GPU: short CIFAR-10 ResNet-32 iCaRL runs, HDQT and FP32.

Phases, each in results folders of its own, all on the GPU of this machine:
  cold        one HDQT run on an empty cache (no decoded dataset, no kernels compiled here): its kernel compile
              seconds (summary.json) and wall time
  sequential  runs one after the other, each a fresh `python run.py` (what a shell loop does): whole-run wall
              times, start-up included, per scheme; their ratio HDQT/FP32
  packed      the same runs, more seeds, as one sweep: hydra/launcher=gpus, jobs_per_gpu runs a GPU, MPS off
  mps         the same sweep under CUDA MPS (hydra.launcher.mps=on)
Throughput is runs per hour over each phase's wall time; the ratios are against `sequential`.

    python -m scripts.bench.sweep --data PATH/cifar10_jpg.tar.xz [--epochs 2] [--seeds 6] [--jobs-per-gpu 8 12]
           [--out results/sweep_bench]
    python -m scripts.bench.sweep --report results/sweep_bench    (README.md from the JSON files there)
The JSON (sweep_bench_<device>.json) holds every run's folder summary; the table is printed last.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hdqt_cil.wording import help_description
from scripts.bench.record import save_rows

ROOT = Path(__file__).resolve().parents[2]
TABLE_MARK = "<!-- table: python -m scripts.bench.sweep --report results/sweep_bench -->"


def run_py(args, env, log) -> float:
    """Wall seconds of `python run.py ARGS`; its output appended to `log`. Fails loudly."""
    start = time.perf_counter()
    with open(log, "a") as out:
        out.write(f"\n$ python run.py {' '.join(args)}\n")
        out.flush()
        result = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    if result.returncode:
        raise SystemExit(f"run.py {' '.join(args)} failed ({result.returncode}); see {log}")
    return time.perf_counter() - start


def summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.rglob("summary.json"))]


def report(folder: Path) -> str:
    """The Markdown table of every record in `folder`: each phase's throughput against the same record's
    one-after-the-other phase, and the whole-run walls of that phase."""
    lines = ["| record | commit | phase | runs | wall s | runs/hour | vs sequential | HDQT / FP32 run wall s | "
             "kernels compiled s |", "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        base = next(r for r in record["rows"] if r["phase"] == "sequential")["runs_per_hour"]
        for row in record["rows"]:
            walls = row.get("run_wall_s")
            pair = f"{walls['hdqt']:.0f} / {walls['fp32']:.0f}" if walls else ""
            lines.append(f"| {path.name} | {record.get('commit', '')} | {row['phase']} | {row['runs']} | "
                         f"{row['wall_s']:.0f} | {row['runs_per_hour']:.0f} | {row['runs_per_hour'] / base:.2f}x | "
                         f"{pair} | {row.get('kernel_compile_s', '')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--report", metavar="DIR", help="write DIR/README.md's table from the records in DIR")
    parser.add_argument("--data", help="CIFAR-10 image archive or folder (benchmark.root)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs a task")
    parser.add_argument("--sequential-seeds", type=int, default=2, help="runs per scheme one after the other")
    parser.add_argument("--seeds", type=int, default=6, help="runs per scheme in each packed sweep")
    parser.add_argument("--jobs-per-gpu", type=int, nargs="+", default=[8], help="packings to time under MPS")
    parser.add_argument("--out", default=str(ROOT / "results" / "sweep_bench"))
    parser.add_argument("--phases", default="cold,sequential,packed,mps", help="which phases to time (sequential is "
                        "the baseline of the ratios and always runs)")
    parser.add_argument("--work", default=None, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.report:
        readme = Path(args.report) / "README.md"
        text = readme.read_text() if readme.exists() else ""
        head = text.split(TABLE_MARK)[0] if TABLE_MARK in text else text
        readme.write_text(head + TABLE_MARK + "\n\n" + report(Path(args.report)))
        return
    if not args.data:
        parser.error("--data is required to time a sweep")

    import torch  # noqa: PLC0415

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_sweep_"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "runs.log"
    common = ["+experiment=cifar10_paper", f"benchmark.root={Path(args.data).resolve()}", "benchmark.augment_on=gpu",
              "trainer.num_workers=0", "strategy=icarl", f"trainer.epochs={args.epochs}", "logging.progress=off"]
    env = {**os.environ, "HDQT_CACHE": str(work / "cache"), "PYTHONUNBUFFERED": "1"}
    started, rows = time.time(), []

    def phase(name, seconds, root, **extra):
        runs = summaries(root)
        row = {"phase": name, "runs": len(runs), "wall_s": seconds, "runs_per_hour": len(runs) * 3600 / seconds,
               **extra, "summaries": runs}
        rows.append(row)
        save_rows(args.out, "sweep_bench", device, "unfinished", started, rows)  # what a cut call keeps
        print(f"{name}: {len(runs)} runs in {seconds:.0f} s = {row['runs_per_hour']:.0f} runs/hour", flush=True)
        return row

    phases = set(args.phases.split(","))
    if "cold" not in phases:  # the baseline starts warm too: the archive decoded, the modules' bytecode written
        warm = ("import hdqt_cil.experiment, sys; from hdqt_cil.benchmarks import cifar; "
                "cifar.load('cifar10', sys.argv[1])")
        subprocess.run([sys.executable, "-c", warm, str(Path(args.data).resolve())], cwd=ROOT, env=env, check=True)
    else:
        cold_root = work / "cold"
        wall = run_py([*common, "quant=hdqt", "seed=100", f"results_root={cold_root}"], env, log)
        phase("cold", wall, cold_root, kernel_compile_s=summaries(cold_root)[0]["kernel_compile_s"])

    seq_root, walls = work / "sequential", {"hdqt": [], "fp32": []}
    for seed in range(args.sequential_seeds):
        for quant in walls:
            walls[quant].append(run_py([*common, f"quant={quant}", f"seed={seed}", f"results_root={seq_root}"], env,
                                       log))
    sequential = phase("sequential", sum(map(sum, walls.values())), seq_root,
                       run_wall_s={q: sum(w) / len(w) for q, w in walls.items()})
    hdqt_over_fp32 = sequential["run_wall_s"]["hdqt"] / sequential["run_wall_s"]["fp32"]

    seeds = ",".join(map(str, range(args.seeds)))
    sweeps = [("packed", per_gpu, "off") for per_gpu in args.jobs_per_gpu[:1] if "packed" in phases]
    sweeps += [("mps", per_gpu, "on") for per_gpu in args.jobs_per_gpu if "mps" in phases]
    for name, per_gpu, mps in sweeps:
        root = work / f"{name}{per_gpu}"
        wall = run_py(["-m", "hydra/launcher=gpus", f"hydra.launcher.jobs_per_gpu={per_gpu}",
                       f"hydra.launcher.mps={mps}", *common, "quant=hdqt,fp32", f"seed={seeds}",
                       f"results_root={root}"], env, log)
        phase(f"{name} x{per_gpu}", wall, root, jobs_per_gpu=per_gpu, mps=mps)

    for row in rows:
        row["vs_sequential"] = row["runs_per_hour"] / sequential["runs_per_hour"]
    header = (f"CIFAR-10 ResNet-32 iCaRL, {args.epochs} epochs a task, HDQT and FP32; {device}; "
              f"HDQT/FP32 whole-run wall {hdqt_over_fp32:.2f}x")
    path = save_rows(args.out, "sweep_bench", device, header, started, rows)
    print(f"\n{header}\n| phase | runs | wall s | runs/hour | vs sequential |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['phase']} | {row['runs']} | {row['wall_s']:.0f} | {row['runs_per_hour']:.0f} | "
              f"{row['vs_sequential']:.2f}x |")
    for row in rows[:1] if "cold" in phases else ():
        print(f"cold HDQT run: {row['wall_s']:.0f} s wall, {row['kernel_compile_s']:.1f} s compiling kernels")
    print(f"whole-run wall: HDQT {sequential['run_wall_s']['hdqt']:.0f} s, FP32 {sequential['run_wall_s']['fp32']:.0f} "
          f"s ({hdqt_over_fp32:.2f}x)\n{path}")


if __name__ == "__main__":
    main()
