"""Pack the checkpoints of the unfinished runs under a results root into ckpt_<k>.tgz files of at most 15 MiB
each (a device call returns at most 8 files of 16 MiB), so that a sweep cut by a call's end resumes on the next
machine (scripts/device_sweep.sh unpacks .device_data/ckpt_*.tgz under the results root).

    python3 scripts/pack_checkpoints.py OUT [FILES [SKIP]] [--root /tmp/runs]
FILES (default 5) files at most, after leaving out the first SKIP (for a second call that fetches the rest).
"""
import argparse
import tarfile
from pathlib import Path

LIMIT = 15 * 2**20


def chunks(folders: list[Path]) -> list[list[Path]]:
    """Consecutive groups of checkpoint folders, each at most LIMIT bytes unless one folder alone is larger."""
    groups, size = [[]], 0
    for folder in folders:
        size_of = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        if groups[-1] and size + size_of > LIMIT:
            groups.append([])
            size = 0
        groups[-1].append(folder)
        size += size_of
    return [g for g in groups if g]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("files", type=int, nargs="?", default=5)
    parser.add_argument("skip", type=int, nargs="?", default=0)
    parser.add_argument("--root", type=Path, default=Path("/tmp/runs"))
    args = parser.parse_args()
    folders = sorted(args.root.rglob("checkpoints"))
    groups = chunks(folders)
    args.out.mkdir(parents=True, exist_ok=True)
    for k, group in enumerate(groups[args.skip:args.skip + args.files], start=args.skip):
        with tarfile.open(args.out / f"ckpt_{k}.tgz", "w:gz") as tar:
            for folder in group:
                tar.add(folder, arcname=str(folder.relative_to(args.root.parent)))
    print(f"{len(folders)} unfinished runs in {len(groups)} checkpoint files; returned "
          f"{args.skip}..{min(len(groups), args.skip + args.files) - 1}")


if __name__ == "__main__":
    main()
