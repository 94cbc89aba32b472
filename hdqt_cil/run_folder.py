"""A run's folder: whose run it holds, where that run stopped, and its results.

`claim` makes the folder this run's (or says it already holds this run, finished); `resume` puts a strategy back
where the folder's checkpoints left it (trainer/checkpoint.py); `write` records the results, each file atomically.
"""
import fcntl
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from .trainer.checkpoint import EpochCheckpoints, ExperienceCheckpoints
from .config import comparable_config, config_differences
from .files import read_json, write_atomic, write_json
from .results.metrics import AccuracyHistory

log = logging.getLogger(__name__)


# What Hydra writes into a run's folder before the run starts: its config record and the job's log.
HYDRA_FILES = {".hydra", "run.log"}
# The empty file a running run holds locked (RunFolder._hold).
LOCK_FILE = ".lock"


def discard_unclaimed(path, root) -> bool:
    """Remove the folder `path` of a run that failed before claiming it (it holds Hydra's files alone), and the
    folders between it and `root` that this leaves empty: bad input leaves nothing behind. Returns whether it
    did."""
    path, root = Path(path).resolve(), Path(root).resolve()
    if not path.is_dir() or not set(p.name for p in path.iterdir()) <= HYDRA_FILES:
        return False
    shutil.rmtree(path)
    for parent in path.parents:
        if parent == root or root not in parent.parents or any(parent.iterdir()):
            break
        parent.rmdir()
    return True


@dataclass
class Start:
    """Where training starts: the first experience to train, the history before it, the epochs already done inside
    it (an epoch checkpoint), the wall time spent before, the peak GPU memory reached before (MiB) and the code
    fingerprints of the processes before."""
    first: int = 0
    history: AccuracyHistory | None = None
    within: int = 0
    elapsed_before: float = 0.0
    peak_mib_before: float | None = None
    code_before: list[str] | None = None
    resumed: bool = field(init=False, default=False)

    def __post_init__(self):
        self.resumed = bool(self.first or self.within)


class RunInUse(RuntimeError):
    """Another process is writing the run in this folder."""


class RunFolder:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.checkpoints = ExperienceCheckpoints(self.path)
        self._lock = None

    def _hold(self) -> None:
        """Hold the folder for this process until `release` (or the process's end: the kernel drops the lock of a
        crashed run). Two processes writing one run (the same sweep started twice, or the job processes of a
        sweep stopped only in part) would train it twice and interleave its files. The lock is on a file opened
        for writing, which network file systems can lock too; where none can be taken, the run goes on unguarded."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunInUse(f"{self.path} is being written by another process; wait for it to end or stop it, "
                           "then run this again (it resumes where that one stopped). Within one sweep: its jobs "
                           "differ only in settings that are not part of a run folder's path (benchmark, model, "
                           "strategy, quant, tag, seed); give them a tag= each") from None
        except OSError as err:
            os.close(fd)
            log.warning("%s cannot be locked here (%s): nothing stops a second process writing this run", self.path,
                        err)
            return
        self._lock = fd

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def data_file(self) -> Path:
        return self.path / "data.json"

    def claim(self, cfg_dict: dict, overwrite: bool, data_fingerprint: str) -> str:
        """Make the folder this run's and hold it (`release`). Returns 'done' (this exact run finished there),
        'again' (this run started there before) or 'new'. A folder holding a different config, or the same config
        on other data (by the fingerprint of the data's contents, wherever they lie), or one that another process
        holds (RunInUse), is refused; so is a folder that cannot be written (a read-only file system, say)."""
        try:
            self._hold()
        except OSError as err:
            raise ValueError(f"{self.path} cannot be written ({err.strerror or err}); give the results another "
                             "place: results_root=PATH") from err
        try:
            return self._claim(cfg_dict, overwrite, data_fingerprint)
        except BaseException:
            self.release()
            raise

    def _claim(self, cfg_dict: dict, overwrite: bool, data_fingerprint: str) -> str:
        config_file = self.path / "config.yaml"
        state = "new"
        if config_file.exists() and not overwrite:
            previous = OmegaConf.to_container(OmegaConf.load(config_file), resolve=True)
            changed = config_differences(comparable_config(previous), comparable_config(cfg_dict))
            if changed:
                raise FileExistsError(f"{self.path} holds a run with a different config ({'; '.join(changed)}); set "
                                      "tag=<name> to write this one elsewhere, or overwrite=true to replace it")
            recorded = read_json(self.data_file)["fingerprint"] if self.data_file.exists() else data_fingerprint
            if recorded != data_fingerprint:
                raise FileExistsError(f"{self.path} holds a run of this config on other data (contents fingerprint "
                                      f"{recorded}; this run's data: {data_fingerprint}); set tag=<name> or "
                                      "benchmark.name=<name> to write this one elsewhere, or overwrite=true to "
                                      "replace it")
            if self.summary_file.exists() and read_json(self.summary_file)["status"] in ("complete", "diverged"):
                return "done"
            state = "again"
        write_atomic(config_file, OmegaConf.to_yaml(OmegaConf.create(cfg_dict)))
        write_json(self.data_file, {"fingerprint": data_fingerprint})
        return state

    def resume(self, strategy, device, history: AccuracyHistory, checkpoint_every: int):
        """(strategy, Start): `strategy` restored from the last experience checkpoint, if any, and armed to re-enter
        the next experience at its last epoch checkpoint; `checkpoint_every` is the resuming command's (a
        setting that does not change results)."""
        first = 0
        if self.checkpoints.exists():
            strategy, first, history = self.checkpoints.load(strategy, device)
        elif (missing := self.checkpoints.missing()) is not None:
            log.warning("%s names %s, which is missing (removed or cut short by the file system): this run starts "
                        "again from its first experience", missing.parent / "latest", missing)
        epochs = next(p for p in strategy.plugins if isinstance(p, EpochCheckpoints))
        epochs.every = checkpoint_every
        start = Start(first, history, epochs.arm(first, device))
        if start.resumed and self.summary_file.exists():
            before = read_json(self.summary_file)
            start.elapsed_before, start.peak_mib_before = before["wall_time_s"], before.get("peak_memory_mib")
            start.code_before = before.get("code")
        return strategy, start

    def clear_checkpoints(self) -> None:
        self.checkpoints.clear()

    def write(self, summary: dict, extras: dict) -> None:
        """summary.json, accuracy_matrix.csv (row k: accuracy on each seen experience after training k) and the
        `extras` ({file name: JSON-able}) that are not empty."""
        write_json(self.summary_file, summary)
        header = "after_exp," + ",".join(f"exp{j}" for j in range(summary["n_experiences"]))
        lines = [header] + [f"{k}," + ",".join(f"{a:.2f}" for a in row)
                            for k, row in enumerate(summary["acc_matrix"])]
        write_atomic(self.path / "accuracy_matrix.csv", "\n".join(lines) + "\n")
        for name, content in extras.items():
            if content:
                write_json(self.path / name, content)
