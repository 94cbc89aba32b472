"""Checkpoints at experience boundaries, through avalanche's dill-based strategy checkpointing, and optionally
every N epochs inside an experience.

avalanche's `save_checkpoint` pickles the whole strategy: model, every plugin's state (exemplar memories,
iCaRL's class means, BiC's bias layer and old model, LwF's old model) and its RNG manager (python, numpy,
torch and CUDA generators). The run's progress goes beside it, and the pair is atomic: each checkpoint is written
into a fresh folder, then a one-line `latest` file is atomically switched to it, and only then is the previous
folder removed. A kill at any moment leaves the last good checkpoint.
"""
import pickle
import random
import shutil
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from avalanche.checkpointing import maybe_load_checkpoint, save_checkpoint
from avalanche.core import SupervisedPlugin

from . import plugin_of
from ..quant import layer_steps, set_layer_steps
from ..files import write_atomic
from ..results.metrics import AccuracyHistory

_CLOCK_COUNTERS = ("train_iterations", "train_exp_counter", "train_exp_epochs", "train_exp_iterations",
                   "train_epoch_iterations", "total_iterations")


# What torch.load and pickle raise on a damaged or cut-short file (torch's zip reader raises RuntimeError).
_DAMAGED = (RuntimeError, pickle.UnpicklingError, EOFError, zipfile.BadZipFile)


def read_checkpoint(path: Path, load):
    """load() of the checkpoint file `path`; a damaged or cut-short file is refused naming it and the way out."""
    try:
        return load()
    except _DAMAGED as err:
        raise ValueError(f"{path} is damaged or cut short ({type(err).__name__}: {str(err).splitlines()[0]}); "
                         f"resume=false starts the run over (or delete {path.parent})") from err


class ExperienceCheckpoints:
    def __init__(self, run_dir):
        self.root = Path(run_dir) / "checkpoints"

    def _latest(self) -> Path | None:
        pointer = self.root / "latest"
        return self.root / pointer.read_text().strip() if pointer.exists() else None

    def exists(self) -> bool:
        latest = self._latest()
        return latest is not None and latest.is_dir()

    def missing(self) -> Path | None:
        """The checkpoint folder `latest` names where that folder is gone, else None."""
        latest = self._latest()
        return latest if latest is not None and not latest.is_dir() else None

    def save(self, strategy, next_exp: int, history: AccuracyHistory) -> None:
        name = f"exp{next_exp:03d}"

        def fill(folder: Path) -> None:
            # Optimizer state is cleared at every experience start (trainer/optim.py), so a boundary checkpoint needs
            # none; the evaluator holds open log files.
            save_checkpoint(strategy, folder / "strategy.pkl", exclude=["optimizer", "evaluator"])
            torch.save({"next_exp": next_exp, "history": asdict(history), "rng": _rng_states()},
                       folder / "progress.pt")

        target = _write_folder(self.root, name, fill)
        write_atomic(self.root / "latest", name + "\n")
        for old in self.root.iterdir():
            if old.is_dir() and old != target:
                shutil.rmtree(old, ignore_errors=True)

    def load(self, strategy, device) -> tuple[object, int, AccuracyHistory]:
        """Restore `strategy` in place; return it, the next experience to train and the history so far."""
        latest = self._latest()
        try:
            strategy, _ = read_checkpoint(latest / "strategy.pkl", lambda: maybe_load_checkpoint(
                strategy, str(latest / "strategy.pkl"), map_location=device))
        except (AttributeError, ModuleNotFoundError) as err:  # pickles name classes; a mended one may be renamed
            raise RuntimeError(f"{latest}: this checkpoint names a class the code no longer has ({err}); it was "
                               "written by an earlier version of a strategy or plugin, whose training this code "
                               "would not continue. resume=false starts the run over") from err
        progress = read_checkpoint(latest / "progress.pt", lambda: torch.load(
            latest / "progress.pt", weights_only=False, map_location=onto(device)))
        _restore_rng_states(progress["rng"])
        return strategy, progress["next_exp"], AccuracyHistory(**progress["history"])

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class EpochCheckpoints(SupervisedPlugin):
    """Checkpoints inside an experience every `every` epochs (0: none), beside the boundary ones.

    An experience starts from a boundary checkpoint (or, the first, from the fresh build), which holds all that its
    start-of-experience hooks read (memories, old models, BiC's split, the generators). An epoch adds the model,
    the optimizer, the clock, the layers' rounding counters, the generators and the plugins' per-epoch records
    (`epoch_state` / `load_epoch_state`). A resume re-enters the experience as the original run did, lets every
    hook run, and lays this state over it before the first remaining epoch: the rest runs as uninterrupted.
    Placed just before avalanche's clock, so that it sees the epoch's records and the next epoch's lr."""

    def __init__(self, root, every: int):
        super().__init__()
        self.root, self.every = Path(root), every
        self.pending = None
        self.full_epochs = None

    def arm(self, experience: int, device) -> int:
        """Resume into `experience` on `device` from its latest epoch checkpoint, if any; return how many epochs it
        holds."""
        found = sorted(self.root.glob(f"exp{experience:03d}_epoch*"))
        state = found[-1] / "state.pt" if found else None
        self.pending = (read_checkpoint(state, lambda: torch.load(state, weights_only=False,
                                                                  map_location=onto(device))) if found else None)
        return self.pending["clock"]["train_exp_epochs"] if found else 0

    def before_training_exp(self, strategy, **kwargs):
        if self.pending is not None:
            self.full_epochs = strategy.train_epochs
            strategy.train_epochs -= self.pending["clock"]["train_exp_epochs"]

    def before_training_epoch(self, strategy, **kwargs):
        if self.pending is None:
            return
        state, self.pending = self.pending, None
        strategy.model.load_state_dict(state["model"])
        set_layer_steps(strategy.model, state["steps"])
        _load_optimizer_state(strategy.optimizer, strategy.model, state["optimizer"])
        for name, value in state["clock"].items():
            setattr(strategy.clock, name, value)
        for plugin, saved in zip(_with_epoch_state(strategy), state["plugins"]):
            plugin.load_epoch_state(saved)
        _restore_rng_states(state["rng"])

    def after_training_epoch(self, strategy, **kwargs):
        clock = strategy.clock
        done = clock.train_exp_epochs + 1  # the clock counts this epoch after this hook
        # the last epoch ends in a boundary checkpoint
        if not self.every or done % self.every or done >= experience_epochs(strategy):
            return
        counters = {name: getattr(clock, name) for name in _CLOCK_COUNTERS}
        counters["train_exp_epochs"] = done
        state = {"model": strategy.model.state_dict(), "steps": layer_steps(strategy.model),
                 "optimizer": _optimizer_state(strategy.optimizer, strategy.model), "clock": counters,
                 "plugins": [p.epoch_state() for p in _with_epoch_state(strategy)], "rng": _rng_states()}
        name = f"exp{clock.train_exp_counter:03d}_epoch{done:04d}"
        _write_folder(self.root, name, lambda folder: torch.save(state, folder / "state.pt"))
        for old in self.root.glob(f"exp{clock.train_exp_counter:03d}_epoch*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)

    def after_training_exp(self, strategy, **kwargs):
        if self.full_epochs is not None:
            strategy.train_epochs, self.full_epochs = self.full_epochs, None


def experience_epochs(strategy) -> int:
    """The epochs of the experience in training, all of them. A resumed experience runs only those it has left
    (`train_epochs` is cut to them) while the clock counts from the experience's start, so a hook that looks for the
    experience's last epoch compares the clock with this, not with `train_epochs`."""
    checkpoints = plugin_of(strategy, EpochCheckpoints)
    return (checkpoints and checkpoints.full_epochs) or strategy.train_epochs


def _write_folder(root: Path, name: str, fill) -> Path:
    """root/name filled by `fill(folder)` all at once: written under a hidden name, then renamed into place."""
    tmp = root / f".{name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    target = root / name
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def onto(device):
    """torch.load's map_location for a checkpoint resumed on `device`: its CUDA storages go there, whichever GPU
    index of whichever machine wrote them (a sweep's job k trains on GPU k mod #GPUs); CPU storages (the
    generators' states) stay on the CPU."""
    device = torch.device(device)

    def place(storage, location: str):
        if not location.startswith("cuda"):
            return storage
        return storage.cuda(device.index) if device.type == "cuda" else storage.cpu()
    return place


def _optimizer_state(optimizer, model) -> dict:
    """Per-parameter state (SGD's momentum) by parameter name, and the lr: avalanche rebuilds the optimizer's
    groups at every experience start, so positions in a torch state dict need not match on resume."""
    return {"lr": [group["lr"] for group in optimizer.param_groups],
            "params": {name: optimizer.state[p] for name, p in model.named_parameters() if p in optimizer.state}}


def _load_optimizer_state(optimizer, model, saved: dict) -> None:
    for group, lr in zip(optimizer.param_groups, saved["lr"]):
        group["lr"] = lr
    for name, p in model.named_parameters():
        if name in saved["params"]:
            optimizer.state[p] = saved["params"][name]


def _with_epoch_state(strategy) -> list:
    return [p for p in strategy.plugins if hasattr(p, "epoch_state")]


def _rng_states() -> dict:
    """The generators a run draws from. Of CUDA's, only the run's own device's: a run trains on one GPU, and a
    resumed run may be on another index of another machine (a sweep's job k takes GPU k mod #GPUs)."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": cuda}


def _restore_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    cuda = states["cuda"]
    if cuda is None or not torch.cuda.is_available():
        return
    if isinstance(cuda, list):  # one state per GPU of the machine that wrote it: take this device's index
        index = torch.cuda.current_device()
        if index < len(cuda):
            torch.cuda.set_rng_state(cuda[index])
        return
    torch.cuda.set_rng_state(cuda)  # into the current device: the one this run trains on
