"""cfg → benchmark, model, quantization, strategy → train/evaluate each experience → results in the run folder."""
import logging
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import torch
from avalanche.evaluation.metrics import accuracy_metrics, loss_metrics
from avalanche.logging import CSVLogger, InteractiveLogger, TensorboardLogger
from avalanche.training.determinism.rng_manager import RNGManager
from avalanche.training.plugins import EvaluationPlugin
from omegaconf import OmegaConf

from .cl.batch_augment import BatchAugment
from .cl.checkpoint import EpochCheckpoints, ExperienceCheckpoints
from .cl.cuda_graphs import CudaGraphPlugin
from .cl.divergence import Diverged, TrainingMonitor
from .cl.optim import PerExperienceSGD
from .cl.quantization import QuantizationPlugin
from .cl.recorder import PredictionRecorder
from .cl.strategies import build_strategy, check_fits, teachers, training_steps
from .config import comparable_config, validate
from .data.augment import augment_batch
from .data.benchmarks import build_benchmark
from .kernels._runtime import compile_seconds
from .models import build_model
from .results.io import read_json, write_atomic, write_json
from .results.metrics import AccuracyHistory, summarize
from .results.tables import display_table, aggregate, collect_runs, to_markdown

log = logging.getLogger(__name__)

def resolve_device(name: str, gpu: int = 0) -> torch.device:
    """`auto`: CUDA when present, GPU `gpu` (a sweep's job is given one: hdqt_cil/sweep/gpu_slots.py)."""
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", gpu % torch.cuda.device_count())
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name!r} but CUDA is not available here; use auto or cpu")
    return device


def claim_run_dir(run_dir: Path, cfg_dict: dict, overwrite: bool) -> str:
    """Make `run_dir` ours. Returns 'done' (this exact run finished there), 'again' (this run started there
    before) or 'new'. A folder holding a different config is refused."""
    config_file = run_dir / "config.yaml"
    state = "new"
    if config_file.exists() and not overwrite:
        previous = OmegaConf.to_container(OmegaConf.load(config_file), resolve=True)
        if comparable_config(previous) != comparable_config(cfg_dict):
            raise FileExistsError(
                f"{run_dir} holds a run with a different config; set tag=<name> to write this one elsewhere, "
                f"or overwrite=true to replace it")
        summary = run_dir / "summary.json"
        if summary.exists() and read_json(summary)["status"] in ("complete", "diverged"):
            return "done"
        state = "again"
    write_atomic(config_file, OmegaConf.to_yaml(OmegaConf.create(cfg_dict)))
    return state


def _show_bars(cfg) -> bool:
    return cfg.logging.progress == "on" or (cfg.logging.progress == "auto" and sys.stdout.isatty())


def epoch_log_every(cfg) -> int:
    """Epochs between progress lines: `logging.epochs`, where auto is about ten lines an experience when no bars
    are drawn and none when they are."""
    if cfg.logging.epochs != "auto":
        return cfg.logging.epochs
    return 0 if _show_bars(cfg) else -(-cfg.trainer.epochs // 10)


def _evaluator(cfg, run_dir: Path) -> EvaluationPlugin:
    loggers = [InteractiveLogger()] if _show_bars(cfg) else []
    if cfg.logging.csv:
        loggers.append(CSVLogger(log_folder=str(run_dir / "csv")))
    if cfg.logging.tensorboard:
        loggers.append(TensorboardLogger(tb_log_dir=str(run_dir / "tb")))
    metrics = [accuracy_metrics(epoch=True, experience=True), loss_metrics(epoch=True)] if loggers else []
    return EvaluationPlugin(*metrics, loggers=loggers)


def _summary(cfg, bench, history, status, elapsed, device, train_loss, compile_s, error=None) -> dict:
    return {
        "status": status,
        "error": error,
        "run": {"benchmark": cfg.benchmark.name, "model": cfg.model.name, "strategy": cfg.strategy.name,
                "quant": cfg.quant.name, "tag": cfg.tag, "seed": cfg.seed},
        "n_experiences": bench.n_experiences,
        "classes_per_exp": bench.classes_per_exp,
        "steps_done": history.steps,
        "metrics": summarize(history),
        "seen_acc": history.seen_acc,
        "acc_matrix": history.acc_matrix,
        "class_acc": history.class_acc,
        "train_loss": train_loss,
        "class_order": bench.class_order,
        "class_names": [bench.class_names[c] for c in bench.class_order],
        "wall_time_s": elapsed,
        "kernel_compile_s": compile_s,  # compiling GPU kernels not shipped prebuilt (kernels/_runtime.py)
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "command": " ".join(sys.argv),
    }


def _write_results(run_dir: Path, summary: dict) -> None:
    write_json(run_dir / "summary.json", summary)
    header = "after_exp," + ",".join(f"exp{j}" for j in range(summary["n_experiences"]))
    lines = [header] + [f"{k}," + ",".join(f"{a:.2f}" for a in row) for k, row in enumerate(summary["acc_matrix"])]
    write_atomic(run_dir / "accuracy_matrix.csv", "\n".join(lines) + "\n")


@contextmanager
def deterministic_kernels():
    """torch's deterministic algorithms, cuDNN's and cuBLAS's included, for one run, then the previous settings
    again. Without them FP32 GPU runs differ between machines (cuDNN's backward orders its sums freely); an op
    with no deterministic implementation warns, naming itself, instead of failing the run."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when the process first calls cuBLAS
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:]


def run(cfg, run_dir, gpu: int = 0) -> dict:
    """Run one experiment into `run_dir` (on GPU `gpu` with trainer.device=auto); return its summary.

    Re-running the same config in the same folder resumes from the last checkpoint, at an experience boundary
    or (trainer.checkpoint_every) inside one (unless resume=false); a finished folder is reused as it is (unless
    overwrite=true).
    """
    validate(cfg)
    with deterministic_kernels() if cfg.trainer.deterministic else nullcontext():
        return _run(cfg, Path(run_dir), gpu)


def _run(cfg, run_dir: Path, gpu: int) -> dict:
    RNGManager.set_random_seeds(cfg.seed)
    device = resolve_device(cfg.trainer.device, gpu)
    bench = build_benchmark(cfg.benchmark, cfg.seed)
    check_fits(cfg.strategy, cfg.trainer, bench.num_classes)
    model = build_model(cfg.model, bench.input_shape, bench.num_classes, bench.input_norm)
    strategy = _build_strategy(cfg, bench, model, device, run_dir)

    # Only a run that could be built claims its folder: bad input leaves nothing behind.
    state = claim_run_dir(run_dir, OmegaConf.to_container(cfg, resolve=True), cfg.overwrite)
    if state == "done":
        log.info("%s already holds this run, finished; overwrite=true reruns it", run_dir)
        return read_json(run_dir / "summary.json")

    steps = training_steps(cfg.strategy.name, bench.n_experiences)
    joint = len(steps) < bench.n_experiences
    history = AccuracyHistory(bench.n_experiences, bench.num_classes)
    checkpoints = ExperienceCheckpoints(run_dir)
    first, within, elapsed_before = 0, 0, 0.0
    resuming = state == "again" and cfg.resume
    if resuming:
        if checkpoints.exists():
            strategy, first, history = checkpoints.load(strategy, device)
        epochs = next(p for p in strategy.plugins if isinstance(p, EpochCheckpoints))
        epochs.every = cfg.trainer.checkpoint_every  # a run-independent setting: the resuming command's holds
        within = epochs.arm(first)
    if first or within:
        summary = run_dir / "summary.json"
        elapsed_before = read_json(summary)["wall_time_s"] if summary.exists() else 0.0
        log.info("resuming %s after experience %d%s", run_dir, first,
                 f", epoch {within} of the next" if within else "")
    else:
        checkpoints.clear()
    recorder = next(p for p in strategy.plugins if isinstance(p, PredictionRecorder))
    quantization = next(p for p in strategy.plugins if isinstance(p, QuantizationPlugin))
    monitor = next(p for p in strategy.plugins if isinstance(p, TrainingMonitor))

    started, compiled_before = time.time(), compile_seconds()
    scenario = bench.scenario
    loader_args = {"num_workers": cfg.trainer.num_workers}
    log.info("%s: %d classes in %d experiences on %s → %s", cfg.benchmark.name, bench.num_classes,
             bench.n_experiences, device, run_dir)

    def write(status, error=None):
        elapsed = elapsed_before + time.time() - started
        _write_results(run_dir, _summary(cfg, bench, history, status, elapsed, device, monitor.losses,
                                         compile_seconds() - compiled_before, error))
        if quantization.epochs:
            write_json(run_dir / "quant_stats.json", quantization.epochs)
        if quantization.calibration:  # HOT's LQS choice per layer (made once, before the first experience)
            write_json(run_dir / "lqs.json", quantization.calibration)

    try:
        for k in steps[first:]:
            strategy.train(scenario.train_stream if joint else scenario.train_stream[k], **loader_args)
            recorder.seen_classes = sum(bench.classes_per_exp[: k + 1])
            strategy.eval(scenario.test_stream[: k + 1], **loader_args)
            history.add_step(recorder.results)
            if k != steps[-1]:
                checkpoints.save(strategy, steps.index(k) + 1, history)
            write("complete" if k == steps[-1] else "running")
            log.info("after experience %d/%d: accuracy on seen classes %.2f%% (%.0f s)", k + 1,
                     bench.n_experiences, history.seen_acc[-1], time.time() - started)
    except Diverged as exc:
        write("diverged", error={"message": str(exc), **exc.details})
        log.error("%s", exc)
        if cfg.on_divergence == "stop":
            raise
    except BaseException as exc:
        write("interrupted", error=repr(exc))
        raise
    checkpoints.clear()
    return read_json(run_dir / "summary.json")


def _build_strategy(cfg, bench, model, device, run_dir):
    t = cfg.trainer
    quantization = QuantizationPlugin(cfg.quant)
    quantization.apply(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    plugins = [PredictionRecorder(), TrainingMonitor(epoch_log_every(cfg)),
               PerExperienceSGD(t.lr, list(t.milestones), t.gamma),
               quantization]
    if t.cuda_graph is True and device.type != "cuda":
        raise ValueError(f"trainer.cuda_graph=true needs a CUDA device; this run is on {device} "
                         f"(trainer.device={t.device}); use auto or false")
    if t.cuda_graph and device.type == "cuda":  # true or auto
        plugins.insert(0, CudaGraphPlugin(teachers(cfg.strategy.name)))  # its NaN check precedes the monitor's
    if cfg.benchmark.get("augment") and cfg.benchmark.augment_on == "gpu":
        plugins.append(BatchAugment(partial(augment_batch, brightness=cfg.benchmark.color_jitter)))
    common = dict(optimizer=optimizer, criterion=torch.nn.CrossEntropyLoss(), train_mb_size=t.batch_size,
                  train_epochs=t.epochs, eval_mb_size=t.eval_batch_size, device=device, plugins=plugins,
                  evaluator=_evaluator(cfg, run_dir))
    strategy = build_strategy(cfg.strategy, t, model, common, image_inputs=len(bench.input_shape) == 3)
    strategy.plugins.insert(strategy.plugins.index(strategy.clock),
                            EpochCheckpoints(ExperienceCheckpoints(run_dir).root, t.checkpoint_every))
    return strategy


def run_table(run_dir) -> str:
    """The Markdown table of one run folder (what `python run.py` prints at the end)."""
    return to_markdown(display_table(aggregate(collect_runs(run_dir))))
