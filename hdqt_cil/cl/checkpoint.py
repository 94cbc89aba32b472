"""Checkpoints at experience boundaries, through avalanche's dill-based strategy checkpointing.

avalanche's `save_checkpoint` pickles the whole strategy: model, every plugin's state (exemplar memories,
iCaRL's class means, BiC's bias layer and old model, LwF's old model) and its RNG manager (python, numpy,
torch and CUDA generators). We add the run's progress beside it and make the pair atomic: each checkpoint is written into a fresh folder, then a one-line `latest` file is atomically switched
to it, and only then is the previous folder removed. A kill at any moment leaves the last good checkpoint.
"""
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from avalanche.checkpointing import maybe_load_checkpoint, save_checkpoint

from ..results.io import write_atomic
from ..results.metrics import AccuracyHistory


class ExperienceCheckpoints:
    def __init__(self, run_dir):
        self.root = Path(run_dir) / "checkpoints"

    def _latest(self) -> Path | None:
        pointer = self.root / "latest"
        return self.root / pointer.read_text().strip() if pointer.exists() else None

    def exists(self) -> bool:
        latest = self._latest()
        return latest is not None and latest.is_dir()

    def save(self, strategy, next_exp: int, history: AccuracyHistory) -> None:
        name = f"exp{next_exp:03d}"
        tmp = self.root / f".{name}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # Optimizer state is cleared at every experience start (cl/optim.py), so a boundary checkpoint needs
        # none; the evaluator holds open log files.
        save_checkpoint(strategy, tmp / "strategy.pkl", exclude=["optimizer", "evaluator"])
        torch.save({"next_exp": next_exp, "history": asdict(history), "rng": _rng_states()}, tmp / "progress.pt")
        target = self.root / name
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        write_atomic(self.root / "latest", name + "\n")
        for old in self.root.iterdir():
            if old.is_dir() and old != target:
                shutil.rmtree(old, ignore_errors=True)

    def load(self, strategy, device) -> tuple[object, int, AccuracyHistory]:
        """Restore `strategy` in place; return it, the next experience to train and the history so far."""
        latest = self._latest()
        strategy, _ = maybe_load_checkpoint(strategy, str(latest / "strategy.pkl"), map_location=device)
        progress = torch.load(latest / "progress.pt", weights_only=False)
        _restore_rng_states(progress["rng"])
        return strategy, progress["next_exp"], AccuracyHistory(**progress["history"])

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _rng_states() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _restore_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
