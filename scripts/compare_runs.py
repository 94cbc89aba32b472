"""Whether two trees of run folders hold the same results, bit for bit: the check that a change of the code (a
refactoring, another machine, another backend) changed no number.

    python scripts/compare_runs.py RUNS_A RUNS_B

Each tree is a folder or a tar archive of run folders (results/*/runs.tgz, read from a temporary copy). An archive
that holds one folder alone (`tar czf runs.tgz runs`) stands for that folder, as make_tables reads the two alike:
`runs.tgz` holding `runs/<benchmark>/...` compares with a folder holding `<benchmark>/...`; any other archive stands
for the folder it unpacks into. `runs.tgz:runs/x` stands for that folder of the archive.
For every run folder of RUNS_A (by its path below the root) the same folder must exist in RUNS_B with an equal
accuracy matrix, per-class accuracies, per-epoch training losses, status and class order, and equal per-epoch
quantization statistics (quant_stats.json) where either has them (folders that only RUNS_B holds are not compared).
Each folder that differs or is missing is listed; the exit status is then 1, as it is for a tree without run
folders and for a path that is neither a folder nor a readable tar archive.
"""
import argparse
import sys
import tempfile
from pathlib import Path

from hdqt_cil.files import read_json

COMPARED = ("status", "acc_matrix", "class_acc", "train_loss", "class_order")


def _json(path: Path):
    """The file's JSON, or None where there is no such file: read_json reads a number that was not finite as null
    in any file, so that a tree written with bare NaN compares equal to the same runs written with null."""
    return read_json(path) if path.exists() else None


def tree(path: Path, scratch: str) -> Path:
    """The folder of run folders `path` names: itself, or the tar archive `path` unpacked under `scratch` (the
    folder it holds, where it holds one folder alone; `runs.tgz:runs/x`, that folder). ValueError, naming `path`,
    for anything else; FileNotFoundError for a folder the archive lacks."""
    if path.is_dir():
        return path
    from hdqt_cil.results.tables import archive_member, unpacked  # they load torch: imported for an archive only

    folder = Path(unpacked(str(path), scratch))
    if folder == path:
        raise ValueError(f"{path} is neither a folder nor a tar archive of run folders")
    if archive_member(str(path))[1]:  # a folder named inside the archive stands for itself
        return folder
    entries = list(folder.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else folder


def differences(a: Path, b: Path, b_name: Path | None = None) -> list[str]:
    """One line per run folder of `a` that `b` lacks or holds with other results; `b_name` names `b` there (an
    archive's path, not its copy's)."""
    out = []
    for summary in sorted(a.rglob("summary.json")):
        run = summary.parent.relative_to(a)
        other = b / run / "summary.json"
        if not other.exists():
            out.append(f"{run}: missing in {b_name or b}")
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
    parser.add_argument("a", type=Path, help="a folder of run folders, a tar archive of them, or one folder of an "
                        "archive (ARCHIVE:FOLDER)")
    parser.add_argument("b", type=Path, help="the same, compared with A")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            a, b = tree(args.a, scratch), tree(args.b, scratch)
        except (ValueError, FileNotFoundError) as error:  # no archive, or no such folder in it
            print(error, file=sys.stderr)
            return 1
        runs = len(list(a.rglob("summary.json")))
        if not runs:  # nothing compared is no evidence that the trees agree
            print(f"no run folders (summary.json) under {args.a}", file=sys.stderr)
            return 1
        found = differences(a, b, args.b)
    print("\n".join(found) if found else f"{runs} run{'' if runs == 1 else 's'} identical")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
