"""Weights & Biases logging (`logging.wandb=true`) through avalanche's WandBLogger, mended for current wandb.

avalanche 0.6.0's logger reaches for `wandb.viz` in every metric it logs and for `wandb.util.generate_id` when it
starts a run; wandb ≥ 0.19 has neither, so the first metric ends the run with an AttributeError. The runs here emit
scalar metrics only (accuracy and loss per epoch and experience), which this logger writes as avalanche's does;
the run id is drawn here.

avalanche starts the W&B run when the logger is made, with the strategy; here it starts with the training, so that
a run folder that already holds a finished run, or a strategy replaced by the one restored from a checkpoint, opens
none. A checkpoint keeps the id: the restored logger continues the same W&B run. `finish` ends it when the
experiment ends, however it ends, so that its records are written and a sweep worker's next job opens its own.
"""
import secrets

from avalanche.logging import WandBLogger


class ScalarWandBLogger(WandBLogger):
    def __init__(self, project: str, name: str, folder: str, config: dict, mode: str):
        super().__init__(project_name=project, run_name=name, dir=folder, save_code=False, config=config,
                         params={"mode": mode, "id": secrets.token_hex(8)})

    def before_run(self):  # avalanche's constructor and restore call it; the W&B run waits for the training
        self.started = False

    def before_training(self, strategy, *args, **kwargs):
        if not self.started:
            super().before_run()
            self.started = True
        return super().before_training(strategy, *args, **kwargs)

    def log_single_metric(self, name, value, x_plot):
        self.step = x_plot
        if isinstance(value, (int, float)):
            self.wandb.log({name: value}, step=x_plot)

    def finish(self) -> None:
        if self.started:
            self.wandb.finish()
            self.started = False
