"""What diagnostics=light costs a CPU run, measured inside one run: the time its diagnosed batches take against the
run's training epochs (a diagnosed batch changes no number of the run, so the epochs without it are the same
epochs less that time). Whole runs on a shared machine vary by more than the overhead between identical runs; a
ratio within one run does not.

    python -m scripts.bench.diagnostics_cpu --data-root DATA [overrides...]

DATA holds hapt_features.npz (data_prep.hapt). Default overrides: the HAPT LwF HDQT run of docs/diagnostics.md
(`+experiment=har_paper benchmark=hapt strategy=lwf quant=hdqt trainer.epochs=10`, `diagnostics=light
diagnostics.every=50`), one CPU thread. Prints the diagnosed batches, their seconds, the training epochs' seconds
and the ratio of the epochs with diagnostics to those without.
"""
import argparse
import logging
import re
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from hdqt_cil.config import register_schemas
from hdqt_cil.endings import end_single_run
from hdqt_cil.experiment import run
from hdqt_cil.trainer.diagnostics import GradientDiagnostics
from hdqt_cil.wording import help_description

CONFIGS = Path(__file__).resolve().parents[2] / "hdqt_cil" / "configs"
DEFAULTS = ["+experiment=har_paper", "benchmark=hapt", "strategy=lwf", "quant=hdqt", "trainer.epochs=10",
            "diagnostics=light", "diagnostics.every=50", "trainer.device=cpu", "logging.progress=off"]
EPOCH_LINE = re.compile(r"\(([\d.]+) s an epoch\)")


class _EpochTimes(logging.Handler):
    """The epoch times the training monitor logs."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def emit(self, record):
        found = EPOCH_LINE.search(record.getMessage())
        if found:
            self.seconds.append(float(found[1]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--data-root", required=True)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    register_schemas()
    spent = []
    record = GradientDiagnostics._record

    def timed(self, *a, **k):
        start = time.perf_counter()
        record(self, *a, **k)
        spent.append(time.perf_counter() - start)

    GradientDiagnostics._record = timed
    epochs = _EpochTimes()
    monitor = logging.getLogger("hdqt_cil.trainer.monitor")
    monitor.addHandler(epochs)
    monitor.setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as out, initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("config", overrides=[*DEFAULTS, f"data_root={args.data_root}", f"results_root={out}",
                                           *args.overrides])
        try:
            run(cfg, Path(out) / "run")
        except Exception as error:  # a missing feature file or a refused value: one line, as run.py says it
            end_single_run(error)
            raise
    training, diagnosing = sum(epochs.seconds), sum(spent)
    print(f"{len(spent)} diagnosed batches: {diagnosing:.2f} s ({1000 * diagnosing / max(len(spent), 1):.0f} ms each)")
    print(f"{len(epochs.seconds)} training epochs: {training:.2f} s with diagnostics, {training - diagnosing:.2f} s "
          f"without: light / off {training / (training - diagnosing):.3f}")


if __name__ == "__main__":
    main()
