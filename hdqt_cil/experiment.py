"""cfg → benchmark, model, quantization, strategy → train/evaluate each experience → results in the run folder."""
import logging
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from avalanche.evaluation.metrics import accuracy_metrics, loss_metrics
from avalanche.logging import CSVLogger, InteractiveLogger, TensorboardLogger
from avalanche.training.determinism.rng_manager import RNGManager
from avalanche.training.plugins import EvaluationPlugin
from omegaconf import OmegaConf

from .trainer.batch_augment import BatchAugment
from .trainer.checkpoint import EpochCheckpoints, ExperienceCheckpoints
from .trainer.cost import CostCounter
from .trainer.diagnostics import GradientDiagnostics, Landscape
from .trainer.cuda_graphs import CudaGraphPlugin
from .trainer.hp_replay import HigherPrecisionReplay, higher_precision_scheme
from .trainer.monitor import Diverged, TrainingMonitor, quantizer_checks_diverge
from .trainer.optim import PerExperienceSGD, sgd_settings
from .trainer.quantization import QuantizationPlugin
from .trainer.recorder import PredictionRecorder
from .trainer.wandb_logger import ScalarWandBLogger
from .trainer.weight_storage import WeightStorage
from .strategies import DataFacts, build_strategy, check_fits, teachers, training_steps
from .config import run_path, validate
from .code_version import fingerprint, processes_code
from .benchmarks.augment import augment_batch
from .benchmarks import build_benchmark
from .kernels.compile import compile_seconds
from .cost.energy import energy_table
from .models import build_model
from .files import read_json
from .results.metrics import AccuracyHistory, summarize
from .results.tables import aggregate, collect_runs, display_table, to_markdown
from .run_folder import RunFolder, Start

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


def _show_bars(cfg) -> bool:
    return cfg.logging.progress == "on" or (cfg.logging.progress == "auto" and sys.stdout.isatty())


def epoch_log_every(cfg) -> int:
    """Epochs between progress lines: `logging.epochs`, where auto is about ten lines an experience when no bars
    are drawn and none when they are."""
    if cfg.logging.epochs != "auto":
        return cfg.logging.epochs
    return 0 if _show_bars(cfg) else -(-cfg.trainer.epochs // 10)


def run_label(cfg, run_dir: Path) -> str:
    """The run's folder below results_root (e.g. cifar10-resnet32/icarl/hdqt/seed0); a run elsewhere (a sweep's
    folders) by its last four parts, which name the run the same way (config.run_path)."""
    try:
        return Path(run_dir).resolve().relative_to(Path(cfg.results_root).resolve()).as_posix()
    except ValueError:
        return "/".join(Path(run_dir).parts[-4:])


def _evaluator(cfg, run_dir: Path) -> EvaluationPlugin:
    loggers = [InteractiveLogger()] if _show_bars(cfg) else []
    if cfg.logging.csv:
        loggers.append(CSVLogger(log_folder=str(run_dir / "csv")))
    if cfg.logging.tensorboard:
        loggers.append(TensorboardLogger(tb_log_dir=str(run_dir / "tb")))
    if cfg.logging.wandb:  # imports wandb (slow) only here; its run starts with the training, in the claimed folder
        name = run_path(cfg.benchmark.name, cfg.benchmark.scenario, cfg.model.name, cfg.strategy.name, cfg.quant.name,
                        cfg.tag, cfg.seed)
        loggers.append(ScalarWandBLogger(cfg.logging.wandb_project, name, str(run_dir),
                                         OmegaConf.to_container(cfg, resolve=True), cfg.logging.wandb_mode))
    metrics = [accuracy_metrics(epoch=True, experience=True), loss_metrics(epoch=True)] if loggers else []
    return EvaluationPlugin(*metrics, loggers=loggers)


def _summary(cfg, bench, history, status, elapsed, device, train_loss, compile_s, cost, peak_mib, code,
             error=None) -> dict:
    return {
        "status": status,
        "error": error,
        "run": {"benchmark": cfg.benchmark.name, "scenario": cfg.benchmark.scenario, "model": cfg.model.name,
                "strategy": cfg.strategy.name, "quant": cfg.quant.name, "tag": cfg.tag, "seed": cfg.seed},
        "n_experiences": bench.n_experiences,
        "classes_per_exp": bench.classes_per_exp,
        "test_sizes": bench.test_sizes,  # seen_acc: the rows of acc_matrix weighted by these
        "steps_done": history.steps,
        "metrics": summarize(history, by_experience=cfg.benchmark.scenario == "domain"),
        "seen_acc": history.seen_acc,
        "acc_matrix": history.acc_matrix,
        "class_acc": history.class_acc,
        "train_loss": train_loss,
        "class_order": bench.class_order,
        "data_fingerprint": bench.data_fingerprint,  # the data's contents (benchmarks/split.py)
        "data_source": bench.data_source,  # the same before the seed's split: what the tables group seeds by
        "split": bench.split,  # how the training and test sets were split
        "input_norm": bench.input_norm,  # images: the per-channel (mean, std) the model normalises with
        "class_names": [bench.class_names[c] for c in bench.class_order],
        "wall_time_s": elapsed,
        "kernel_compile_s": compile_s,  # compiling GPU kernels not shipped prebuilt (kernels/compile.py)
        "cost": cost,  # operation counts and energy estimate on integer hardware (trainer/cost.py, docs/cost.md)
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "peak_memory_mib": peak_mib,  # the most GPU memory the run's tensors held at once (None on the CPU)
        "command": " ".join(sys.argv),
        "code": code,  # the source's fingerprint in each process the run trained in (code_version.py)
    }


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


@dataclass
class RunPlugins:
    """The plugins every run adds to its strategy, in the order avalanche calls them: CUDA-graph replay first (its
    NaN check precedes the monitor's), the prediction recorder, the training monitor, the optimizer protocol,
    the weight storage (trainer.weight_bits), the quantization, the GPU batch augmentation, the cost counter, the
    gradient diagnostics (diagnostics=light), the higher-precision replay (strategy.hp_replay, once the others
    have closed the epoch); the epoch checkpoints
    last, just before avalanche's clock, so that they see every plugin's records of the epoch and the next
    epoch's lr."""
    recorder: PredictionRecorder
    monitor: TrainingMonitor
    optimizer: PerExperienceSGD
    quantization: QuantizationPlugin
    cost: CostCounter
    epochs: EpochCheckpoints
    graphs: CudaGraphPlugin | None = None
    augment: BatchAugment | None = None
    storage: WeightStorage | None = None
    hp_replay: HigherPrecisionReplay | None = None
    diagnostics: GradientDiagnostics | None = None

    @classmethod
    def declare(cls, cfg, device: torch.device, run_dir: Path, bench) -> "RunPlugins":
        t = cfg.trainer
        if t.cuda_graph is True and device.type != "cuda":
            raise ValueError(f"trainer.cuda_graph=true needs a CUDA device; this run is on {device} "
                             f"(trainer.device={t.device}); use auto or false")
        if cfg.quant.get("backend") == "cupy" and device.type != "cuda":
            raise ValueError(f"quant.backend=cupy runs the products as CUDA kernels; this run is on {device} "
                             f"(trainer.device={t.device}); use quant.backend=auto or torch")
        if t.compile and cfg.quant.name != "fp32":
            raise ValueError(f"trainer.compile=true applies to quant=fp32 only; quant={cfg.quant.name} runs its own "
                             f"kernels, whose inputs torch.compile's fused float ops would change; use "
                             f"trainer.compile=false (its steps are replayed from CUDA graphs)")
        if t.compile and not (t.cuda_graph and device.type == "cuda"):
            raise ValueError(f"trainer.compile=true compiles the step that CUDA graphs replay; this run has "
                             f"trainer.cuda_graph={t.cuda_graph} on {device}; use a CUDA device with cuda_graph "
                             f"auto or true, or trainer.compile=false")
        gpu_augment = cfg.benchmark.get("augment") and cfg.benchmark.augment_on == "gpu"
        every_parameter = t.weight_update == "authors"  # the authors' update stores every trained parameter
        graphed = bool(t.cuda_graph) and device.type == "cuda"  # steps (and diagnosed batches) from CUDA graphs
        return cls(
            recorder=PredictionRecorder(bench.task_classes() if cfg.benchmark.scenario == "task" else None),
            monitor=TrainingMonitor(epoch_log_every(cfg), run_label(cfg, run_dir)),
            optimizer=PerExperienceSGD(t.lr, sgd_settings(t)[2], t.gamma), quantization=QuantizationPlugin(cfg.quant),
            cost=CostCounter(energy_table(cfg.cost), teachers(cfg.strategy.name), t.weight_bits, every_parameter),
            storage=None if t.weight_bits is None else WeightStorage(t.weight_bits, every_parameter),
            epochs=EpochCheckpoints(ExperienceCheckpoints(run_dir).root, t.checkpoint_every),
            graphs=CudaGraphPlugin(teachers(cfg.strategy.name), t.compile) if graphed else None,
            augment=(BatchAugment(partial(augment_batch, brightness=cfg.benchmark.color_jitter)) if gpu_augment
                     else None),
            hp_replay=_higher_precision_replay(cfg),
            diagnostics=_diagnostics(cfg, graphed))

    @classmethod
    def of(cls, strategy) -> "RunPlugins":
        """The plugins of `strategy` (a strategy restored from a checkpoint holds copies of the declared ones)."""
        found = {type(p): p for p in strategy.plugins}
        return cls(found[PredictionRecorder], found[TrainingMonitor], found[PerExperienceSGD],
                   found[QuantizationPlugin], found[CostCounter], found[EpochCheckpoints], found.get(CudaGraphPlugin),
                   found.get(BatchAugment), found.get(WeightStorage), found.get(HigherPrecisionReplay),
                   found.get(GradientDiagnostics))

    def attach(self, strategy):
        """Place the epoch checkpoints just before avalanche's clock (the template appends its own plugins and the
        clock after the ones it is given)."""
        strategy.plugins.insert(strategy.plugins.index(strategy.clock), self.epochs)
        return strategy

    def given(self) -> list:
        """The plugins handed to the strategy template, in order."""
        return [p for p in (self.graphs, self.recorder, self.monitor, self.optimizer, self.storage, self.quantization,
                            self.augment, self.cost, self.diagnostics, self.hp_replay) if p is not None]


def _diagnostics(cfg, graphed: bool) -> GradientDiagnostics | None:
    """The plugin of diagnostics=light and full (full: with the landscapes; `graphed`: diagnosed batches replayed
    from CUDA graphs, as the steps are), or None when off."""
    d = cfg.diagnostics
    if d.level == "off":
        return None
    landscape = (Landscape(d.landscape_points, d.landscape_span, d.landscape_batches) if d.level == "full"
                 else None)
    return GradientDiagnostics(d.every, landscape, cfg.seed, graphed)


def _higher_precision_replay(cfg) -> HigherPrecisionReplay | None:
    s = cfg.strategy
    if s.get("hp_replay") is None:
        return None
    if s.hp_replay_acc_bits is not None and s.hp_replay_acc_bits < s.hp_replay_bits:
        raise ValueError(f"strategy.hp_replay_acc_bits={s.hp_replay_acc_bits} is narrower than strategy.hp_replay_bits="
                         f"{s.hp_replay_bits}; give it at least as many bits, or null (float accumulators)")
    scheme = higher_precision_scheme(OmegaConf.to_container(cfg.quant, resolve=True), s.hp_replay_bits,
                                     s.hp_replay_acc_bits)
    return HigherPrecisionReplay(s.hp_replay, s.hp_replay_epochs, scheme, s.hp_replay_bits, s.hp_replay_acc_bits,
                                 teachers(s.name), s.hp_replay_bn)


def assemble(cfg, run_dir: Path, device: torch.device):
    """The run's benchmark, strategy and plugins, built as the run builds them before it trains (a checkpoint of
    the run loads into this strategy)."""
    bench = build_benchmark(cfg.benchmark, cfg.seed)
    check_fits(cfg.strategy, cfg.trainer, bench.num_classes, cfg.benchmark.scenario)
    model = build_model(cfg.model, bench.input_shape, bench.num_classes, bench.input_norm)
    plugins = RunPlugins.declare(cfg, device, run_dir, bench)
    plugins.quantization.apply(model)  # before the strategy copies the model (old models quantized alike)
    strategy = plugins.attach(build_strategy(cfg.strategy, cfg.trainer, model,
                                             _template_arguments(cfg, model, device, plugins.given(), run_dir),
                                             DataFacts(len(bench.input_shape) == 3, bench.n_experiences)))
    if plugins.hp_replay is not None:
        plugins.hp_replay.check(strategy, cfg.strategy.name)
    return bench, strategy, plugins


def _run(cfg, run_dir: Path, gpu: int) -> dict:
    RNGManager.set_random_seeds(cfg.seed)
    device = resolve_device(cfg.trainer.device, gpu)
    if device.type == "cuda":  # streams, graphs and kernels follow the current device: a sweep job's GPU
        torch.cuda.set_device(device.index if device.index is not None else torch.cuda.current_device())
    bench, strategy, plugins = assemble(cfg, run_dir, device)

    # Only a run that could be built claims its folder: bad input leaves nothing behind.
    folder = RunFolder(run_dir)
    state = folder.claim(OmegaConf.to_container(cfg, resolve=True), cfg.overwrite, bench.data_fingerprint)
    try:
        if state == "done":
            return _finished(cfg, folder)
        start = Start(history=AccuracyHistory(bench.n_experiences, bench.num_classes))
        if state == "again" and cfg.resume:
            strategy, start = folder.resume(strategy, device, start.history, cfg.trainer.checkpoint_every)
            plugins = RunPlugins.of(strategy)
            if plugins.graphs is not None:  # a setting of how, not what, is computed: the resuming command's
                plugins.graphs.compiled = cfg.trainer.compile
        if start.resumed:
            log.info("resuming %s after experience %d%s", run_dir, start.first,
                     f", epoch {start.within} of the next" if start.within else "")
        else:
            folder.clear_checkpoints()
        return _train(cfg, bench, strategy, plugins, folder, start, device)
    finally:
        folder.release()
        for logger in strategy.evaluator.loggers:
            if isinstance(logger, ScalarWandBLogger):
                logger.finish()


def _finished(cfg, folder: RunFolder) -> dict:
    """The summary of the run the folder holds, finished, with what asking again does not change said: a diverged
    run is still an outcome (`on_divergence=stop` ends the command as the run did), and diagnostics it was made
    without are not measured (they are not part of a run's identity, so the finished folder is this run's)."""
    summary = read_json(folder.summary_file)
    asked = cfg.diagnostics.level
    made = OmegaConf.select(OmegaConf.load(folder.path / "config.yaml"), "diagnostics.level", default="off")
    if asked not in ("off", made):
        log.warning("%s holds this run, finished with diagnostics=%s: diagnostics=%s was not measured; "
                    "overwrite=true reruns it with them, or tag=<name> writes it elsewhere", folder.path, made, asked)
    if summary["status"] == "diverged":
        error = summary["error"]
        if cfg.on_divergence == "stop":
            raise Diverged(error["experience"], error["epoch"], error["where"], error.get("phase"))
        log.warning("%s holds this run, which diverged (%s); overwrite=true reruns it", folder.path, error["message"])
    else:
        log.info("%s already holds this run, finished; overwrite=true reruns it", folder.path)
    return summary


def _train(cfg, bench, strategy, plugins: RunPlugins, folder: RunFolder, start: Start, device) -> dict:
    """Train and evaluate experience by experience from `start`, checkpointing at each boundary and recording the
    results after each one; a divergence or an interruption is recorded before it propagates."""
    steps = training_steps(cfg.strategy.name, bench.n_experiences)
    joint = len(steps) < bench.n_experiences
    history, scenario = start.history, bench.scenario
    loader_args = {"num_workers": cfg.trainer.num_workers}
    started, compiled_before = time.time(), compile_seconds()
    code = processes_code(start.code_before, fingerprint())
    if device.type == "cuda":  # a sweep's worker process may have run other jobs before this one
        torch.cuda.reset_peak_memory_stats(device)
    log.info("%s: %d classes in %d experiences on %s → %s", cfg.benchmark.name, bench.num_classes,
             bench.n_experiences, device, folder.path)
    sizes = [sum(len(e.dataset) for e in stream) for stream in (bench.scenario.train_stream,
                                                                  bench.scenario.test_stream)]
    log.info("split %s: %d training and %d test samples", bench.split or "as the dataset ships it", *sizes)
    schedule, *warnings = plugins.optimizer.describe(cfg.trainer.epochs, cfg.preset, cfg.preset_epochs)
    log.info(schedule)
    for line in warnings:
        log.warning(line)

    def write(status, error=None):
        elapsed = start.elapsed_before + time.time() - started
        summary = _summary(cfg, bench, history, status, elapsed, device, plugins.monitor.losses,
                           compile_seconds() - compiled_before, plugins.cost.summary(),
                           peak_memory_mib(device, start.peak_mib_before), code, error)
        # quant_stats: the layers' saturation and clipping per epoch; lqs: HOT's per-layer choice (made once);
        # hp_replay: each higher-precision replay phase's exemplars, epochs and mean loss
        records = {"quant_stats.json": plugins.quantization.epochs, "lqs.json": plugins.quantization.calibration}
        if plugins.hp_replay is not None:
            records["hp_replay.json"] = plugins.hp_replay.phases
        if plugins.diagnostics is not None:  # per experience and layer; summary.json has the means over layers
            records["diagnostics.json"] = plugins.diagnostics.records()
            summary["diagnostics"] = plugins.diagnostics.summary()
        folder.write(summary, records)

    if plugins.diagnostics is not None:  # the landscapes' old test sets
        plugins.diagnostics.old_tests = [experience.dataset for experience in scenario.test_stream]
    try:
        for k in steps[start.first:]:
            with quantizer_checks_diverge(strategy):
                strategy.train(scenario.train_stream if joint else scenario.train_stream[k], **loader_args)
                plugins.recorder.seen_classes = bench.task_classes()[k][1]  # the end of task k's classes
                strategy.eval(scenario.test_stream[: k + 1], **loader_args)
            history.add_step(plugins.recorder.results)
            if k != steps[-1]:
                folder.checkpoints.save(strategy, steps.index(k) + 1, history)
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
    folder.clear_checkpoints()
    return read_json(folder.summary_file)


def peak_memory_mib(device, before: float | None) -> float | None:
    """The most memory torch's allocator held at once on `device` (CUDA) since training (re)started, or before it
    in the processes a resumed run ran in, in MiB; None on the CPU, which has no such count."""
    if device.type != "cuda":
        return before
    return max(torch.cuda.max_memory_allocated(device) / 2**20, before or 0.0)


def _template_arguments(cfg, model, device, plugins: list, run_dir: Path) -> dict:
    """What every avalanche template takes: optimizer, loss, batch sizes, epochs, device, plugins, evaluator."""
    t = cfg.trainer
    momentum, weight_decay, _ = sgd_settings(t)
    return dict(optimizer=torch.optim.SGD(model.parameters(), lr=t.lr, momentum=momentum, weight_decay=weight_decay),
                criterion=torch.nn.CrossEntropyLoss(), train_mb_size=t.batch_size, train_epochs=t.epochs,
                eval_mb_size=t.eval_batch_size, device=device, plugins=plugins, evaluator=_evaluator(cfg, run_dir))


def run_table(run_dir) -> str:
    """The Markdown table of one run folder (what `python run.py` prints at the end)."""
    return to_markdown(display_table(aggregate(collect_runs(run_dir))))
