"""Weights & Biases logging (`logging.wandb=true`) through avalanche's WandBLogger, mended for current wandb.

avalanche 0.6.0's logger reaches for `wandb.viz` in every metric it logs and for `wandb.util.generate_id` when it
starts a run; wandb ≥ 0.19 has neither, so the first metric ends the run with an AttributeError. The runs here emit
scalar metrics only (accuracy and loss per epoch and experience), which this logger writes as avalanche's does;
the run id is drawn here. A checkpoint keeps the id, and a resumed run continues the same W&B run (avalanche's
`__setstate__`). avalanche never ends the W&B run; `finish` does, when the experiment ends however it ends, so that
its records are written and the next job of a sweep's worker process starts a run of its own.
"""
import secrets

from avalanche.logging import WandBLogger


class ScalarWandBLogger(WandBLogger):
    def __init__(self, project: str, name: str, folder: str, config: dict, mode: str):
        super().__init__(project_name=project, run_name=name, dir=folder, save_code=False, config=config,
                         params={"mode": mode, "id": secrets.token_hex(8)})

    def log_single_metric(self, name, value, x_plot):
        self.step = x_plot
        if isinstance(value, (int, float)):
            self.wandb.log({name: value}, step=x_plot)

    def finish(self) -> None:
        self.wandb.finish()
