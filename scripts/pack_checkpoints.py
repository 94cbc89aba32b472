"""Pack the checkpoints of the unfinished runs under a results root into ckpt_<k>.tgz files of at most 9 MiB
each, so that a sweep cut by a call's end resumes on the next machine (scripts/device_sweep.sh unpacks
.device_data/ckpt_*.tgz under the results root). 9 MiB: a remote command returns at most 8 files of 16 MiB, but a
file goes back to a GPU node beside the working tree, within the 64 MiB a call carries: one ResNet-32 run a file.

    python3 scripts/pack_checkpoints.py OUT [FILES [SKIP]] [--root /tmp/runs] [--stage /tmp/ckpt_stage]
FILES (default 5) files at most, after leaving out the first SKIP (for a later call that fetches the rest).
SKIP=0 packs every unfinished run into the stage folder at once and a later call with SKIP>0 copies from that
same snapshot: runs that finish or start between the calls cannot shift the numbering, which would leave some
runs out and return others twice. A run whose summary says it ended (complete or diverged) is left out, even if
checkpoints were unpacked into its folder again.
"""
import argparse
import json
import shutil
import tarfile
from pathlib import Path

LIMIT = 9 * 2**20  # bytes of checkpoint files an archive holds (one larger run alone)
ENDED = ("complete", "diverged")


def unfinished(root: Path) -> list[Path]:
    """The checkpoint folders of the runs under `root` that have not ended, in path order."""
    def ended(run: Path) -> bool:
        summary = run / "summary.json"
        return summary.exists() and json.loads(summary.read_text()).get("status") in ENDED
    return [folder for folder in sorted(root.rglob("checkpoints")) if not ended(folder.parent)]


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


def stage(root: Path, stage_dir: Path) -> None:
    """Pack every unfinished run's checkpoints into stage_dir/ckpt_<k>.tgz and list each file's runs in
    stage_dir/contents.txt."""
    shutil.rmtree(stage_dir, ignore_errors=True)
    stage_dir.mkdir(parents=True)
    lines = []
    for k, group in enumerate(chunks(unfinished(root))):
        with tarfile.open(stage_dir / f"ckpt_{k}.tgz", "w:gz") as tar:
            for folder in group:
                tar.add(folder, arcname=str(folder.relative_to(root.parent)))
        lines.append(f"ckpt_{k}.tgz: " + " ".join(str(f.parent.relative_to(root)) for f in group))
    (stage_dir / "contents.txt").write_text("".join(line + "\n" for line in lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("files", type=int, nargs="?", default=5)
    parser.add_argument("skip", type=int, nargs="?", default=0)
    parser.add_argument("--root", type=Path, default=Path("/tmp/runs"))
    parser.add_argument("--stage", type=Path, default=Path("/tmp/ckpt_stage"))
    args = parser.parse_args()
    if args.skip == 0 or not (args.stage / "contents.txt").exists():
        stage(args.root, args.stage)
    contents = (args.stage / "contents.txt").read_text().splitlines()
    args.out.mkdir(parents=True, exist_ok=True)
    returned = contents[args.skip:args.skip + args.files]
    for line in returned:
        shutil.copy(args.stage / line.split(":")[0], args.out)
    runs = sum(len(line.split()) - 1 for line in contents)
    span = f"{args.skip}..{args.skip + len(returned) - 1}" if returned else "none"
    print(f"{runs} unfinished runs in {len(contents)} checkpoint files; returned {span}")
    print("\n".join(returned))


if __name__ == "__main__":
    main()
