"""Whether two trees of run folders hold the same results, bit for bit: the check that a change of the code (a
refactoring, another machine, another backend) changed no number.

    python scripts/compare_runs.py RUNS_A RUNS_B

For every run folder of RUNS_A (by its path below the root) the same folder must exist in RUNS_B with an equal
accuracy matrix, per-class accuracies, per-epoch training losses, status and class order, and equal per-epoch
quantization statistics (quant_stats.json) where either has them (folders that only RUNS_B holds are not compared).
Each folder that differs or is missing is listed; the exit status is then 1.
"""
import argparse
import json
import sys
from pathlib import Path

COMPARED = ("status", "acc_matrix", "class_acc", "train_loss", "class_order")


def _json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def differences(a: Path, b: Path) -> list[str]:
    """One line per run folder of `a` that `b` lacks or holds with other results."""
    out = []
    for summary in sorted(a.rglob("summary.json")):
        run = summary.parent.relative_to(a)
        other = b / run / "summary.json"
        if not other.exists():
            out.append(f"{run}: missing in {b}")
            continue
        mine, theirs = _json(summary), _json(other)
        keys = [k for k in COMPARED if mine.get(k) != theirs.get(k)]
        if _json(summary.parent / "quant_stats.json") != _json(other.parent / "quant_stats.json"):
            keys.append("quant_stats.json")
        if keys:
            out.append(f"{run}: {', '.join(keys)} differ")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    runs = len(list(args.a.rglob("summary.json")))
    if not runs:  # nothing compared is no evidence that the trees agree
        print(f"no run folders (summary.json) under {args.a}", file=sys.stderr)
        return 1
    found = differences(args.a, args.b)
    print("\n".join(found) if found else f"{runs} runs identical")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
