"""Per-run LwF results of this study and how many runs reach the authors' HAPT numbers.

    python scripts/lwf_study_per_run.py outputs/lwf_study > results/hapt/lwf_class_order/per_run.md
"""
import argparse
import glob
import json
import sys

import numpy as np

AUTHORS = (56.3, 32.8)  # HDQT paper, FP32 LwF on HAPT: avg / last accuracy
NAMES = ["WALK", "UP", "DOWN", "SIT", "STAND", "LAY", "STAND→SIT", "SIT→LIE", "LIE→SIT", "STAND→LIE", "LIE→STAND"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="the study's results root (its hapt-mlp/lwf/*/seed*/ run folders)")
    root = parser.parse_args(argv).root
    runs = {}
    for path in sorted(glob.glob(f"{root}/hapt-mlp/lwf/*/seed*/summary.json")):
        s = json.load(open(path))
        if s["status"] == "complete":
            runs.setdefault(path.split("/")[-3], []).append(s)
    if not runs:
        sys.exit(f"error: no complete LwF HAPT run folders under {root} (hapt-mlp/lwf/*/seed*/summary.json)")
    print(f"# LwF, FP32, HAPT, har_paper: every complete run under `{root}`\n")
    print(f"Authors (PyCIL): avg {AUTHORS[0]} / last {AUTHORS[1]}. Class order: indices into the sorted HAPT "
          f"classes ({', '.join(f'{i} {n}' for i, n in enumerate(NAMES))}).\n")
    print("| runs | n | avg acc | last acc | avg ≥ 56.3 | last ≥ 32.8 | both | avg min / median / max "
          "| last min / median / max |")
    print("|---|---|---|---|---|---|---|---|---|")
    for folder, rs in sorted(runs.items()):
        avg = np.array([r["metrics"]["avg_acc"] for r in rs])
        last = np.array([r["metrics"]["last_acc"] for r in rs])
        reach_avg, reach_last = avg >= AUTHORS[0], last >= AUTHORS[1]
        print(f"| {folder} | {len(rs)} | {avg.mean():.1f} ± {avg.std(ddof=1):.1f} "
              f"| {last.mean():.1f} ± {last.std(ddof=1):.1f} | {reach_avg.sum()}/{len(rs)} "
              f"| {reach_last.sum()}/{len(rs)} | {(reach_avg & reach_last).sum()}/{len(rs)} "
              f"| {avg.min():.1f} / {np.median(avg):.1f} / {avg.max():.1f} "
              f"| {last.min():.1f} / {np.median(last):.1f} / {last.max():.1f} |")
    for folder, rs in sorted(runs.items()):
        print(f"\n## {folder}\n\n| seed | avg | last | accuracy on seen classes after each task | class order "
              f"| wall s |")
        print("|---|---|---|---|---|---|")
        for r in sorted(rs, key=lambda r: r["run"]["seed"]):
            curve = " ".join(f"{x:.1f}" for x in r["seen_acc"])
            print(f"| {r['run']['seed']} | {r['metrics']['avg_acc']:.1f} | {r['metrics']['last_acc']:.1f} | {curve} "
                  f"| {r['class_order']} | {r['wall_time_s']:.0f} |")


if __name__ == "__main__":
    main()
