"""The code fingerprint (hdqt_cil/code_version.py) of the working tree or of git commits: which commit a run's
recorded `code` (summary.json) is.

    python scripts/code_fingerprint.py                  # the working tree's
    python scripts/code_fingerprint.py COMMIT [...]     # each commit's, from `git archive`
"""
import argparse
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hdqt_cil.code_version import ROOT, SOURCE_FILES, SOURCE_FOLDERS, fingerprint  # noqa: E402
from hdqt_cil.wording import help_description  # noqa: E402


def commit_fingerprint(commit: str, repo: Path = ROOT) -> str:
    """The fingerprint of `commit`'s source, unpacked from `git archive` into a temporary folder."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-tree", "--name-only", commit, *SOURCE_FOLDERS,
                             *SOURCE_FILES], capture_output=True, text=True)
    if listed.returncode != 0:
        raise ValueError(f"{commit}: not a commit of {repo} ({listed.stderr.strip()})")
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit, *listed.stdout.split()],
                             capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory() as folder:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(folder, filter="data")
        return fingerprint(Path(folder))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("commits", nargs="*", help="git commits (none: the working tree)")
    args = parser.parse_args(argv)
    if not args.commits:
        print(f"working tree {fingerprint()}")
        return 0
    try:
        for commit in args.commits:
            print(f"{commit} {commit_fingerprint(commit)}")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
