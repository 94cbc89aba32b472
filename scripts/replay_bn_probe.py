"""What a higher-precision replay phase (strategy.hp_replay) costs through BatchNorm's running statistics, and what
through its weight steps, on the model of a run's experience checkpoint.

    python -m scripts.replay_bn_probe RUN_FOLDER [--lr 5e-5] [overrides...]

RUN_FOLDER is an unfinished run of a BatchNorm model with `strategy.hp_replay` whose `checkpoints/` hold an
experience boundary (its model has run that experience's phase, from the second experience on); the run's own overrides
(`.hydra/overrides.yaml`) rebuild it, the command's (e.g. `benchmark.root=...`, `trainer.device=cpu`) come after
them. From that model it makes one more phase of two steps on the phase's own exemplars (the same N, one batch,
flipped at random) in three ways, each from the checkpoint's model: the running statistics alone (BatchNorm in
train mode, no step), the weight steps alone (BatchNorm in eval mode) and both (the authors' phase). A step is
SGD at `--lr` (the phase's: the schedule's last learning rate) with cross-entropy over the seen classes, not the
strategy's own loss: the probe asks which of the phase's two effects moves the old tasks, not what the run's
phase did. Prints, as markdown, the accuracy by task on the test set (argmax over the seen classes' outputs, as a
trained-head run scores) and each variant's step losses.
"""
import argparse
import contextlib
import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from hydra.errors import HydraException
from torch.utils.data import DataLoader

from hdqt_cil.config import compose_command, register_schemas
from hdqt_cil.experiment import assemble, resolve_device
from hdqt_cil.trainer.checkpoint import ExperienceCheckpoints
from hdqt_cil.trainer.hp_replay import batchnorm_mode, exemplar_memory, spread_over_classes
from hdqt_cil.wording import help_description

STEPS = 2
VARIANTS = {"running statistics alone": ("train", False), "weight steps alone": ("eval", True),
            "both (the phase)": ("train", True)}


def _batches(dataset, size: int):
    return DataLoader(dataset, batch_size=size, collate_fn=getattr(dataset, "collate_fn", None))


@torch.no_grad()
def task_accuracy(model, tests, seen: int, device) -> list[float]:
    """Accuracy (%) on each test set, argmax over the first `seen` outputs."""
    model.eval()
    out = []
    for test in tests:
        right = total = 0
        for x, y, *_ in _batches(test, 500):
            right += (model(x.to(device))[:, :seen].argmax(1).cpu() == y).sum().item()
            total += len(y)
        out.append(100 * right / total)
    return out


def phase(model, x, y, seen: int, lr: float, bn: str, step: bool, generator) -> tuple[object, list[float]]:
    """A copy of `model` after STEPS steps on (x, y): BatchNorm in `bn` mode, the weights updated if `step`."""
    model = copy.deepcopy(model).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr if step else 0.0, momentum=0.9)  # lr 0: no step
    losses = []
    with batchnorm_mode(model, bn):
        for _ in range(STEPS):
            order = torch.randperm(len(x), generator=generator).to(x.device)
            flip = (torch.rand(len(x), generator=generator) < 0.5).to(x.device)
            batch = torch.where(flip[:, None, None, None], x[order].flip(-1), x[order])
            loss = F.cross_entropy(model(batch)[:, :seen], y[order])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return model, losses


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("run_folder", type=Path)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args(argv)
    if not args.run_folder.exists():
        raise SystemExit(f"error: {args.run_folder} does not exist (RUN_FOLDER is an unfinished run's folder)")
    checkpoints = ExperienceCheckpoints(args.run_folder)
    if not checkpoints.exists():
        raise SystemExit(f"error: {args.run_folder} holds no experience checkpoint (an unfinished run's "
                         "checkpoints/ folder); a finished run has cleared its own")
    recorded = args.run_folder / ".hydra" / "overrides.yaml"
    if not recorded.is_file():
        raise SystemExit(f"error: {recorded} is missing: the probe rebuilds the run from the overrides its command "
                         "recorded there (a run started by run.py)")
    run_overrides = yaml.safe_load(recorded.read_text())
    register_schemas()
    overrides = [o for o in run_overrides if not o.startswith("hydra")] + args.overrides
    try:
        cfg = compose_command(overrides)
    except (ValueError, HydraException) as error:
        raise SystemExit(f"error: {error}")
    if cfg.strategy.get("hp_replay") is None:
        raise SystemExit(f"error: {args.run_folder} is not a run with strategy.hp_replay")
    device = resolve_device(cfg.trainer.device)
    bench, strategy, _ = assemble(cfg, args.run_folder, device)
    with contextlib.redirect_stdout(sys.stderr):  # avalanche prints the devices it maps; stdout is the table
        strategy, experiences, _ = checkpoints.load(strategy, device)
    model = strategy.model
    for module in model.modules():  # feature hooks a strategy's plugins registered, pickled with it
        module._forward_hooks.clear()
    memory = exemplar_memory(strategy)
    exemplars = memory.subset(spread_over_classes([int(t) for t in memory.targets], cfg.strategy.hp_replay))
    x, y, *_ = next(iter(_batches(exemplars, len(exemplars))))
    x, y = x.to(device), y.to(device)
    seen = bench.task_classes()[experiences - 1][1]  # the end of the last trained task's classes
    tests = [e.dataset for e in bench.scenario.test_stream[:experiences]]
    rows = [("as checkpointed", task_accuracy(model, tests, seen, device), [])]
    for name, (bn, step) in VARIANTS.items():
        changed, losses = phase(model, x, y, seen, args.lr, bn, step, torch.Generator().manual_seed(cfg.seed))
        rows.append((name, task_accuracy(changed, tests, seen, device), losses))
    first = " (no phase ran there: a run's phase follows its second experience and each later one)" \
        if experiences == 1 else ""
    print(f"`{args.run_folder}`, after experience {experiences}{first}: one more phase of {STEPS} steps on its "
          f"{len(y)} exemplars, lr {args.lr:g}\n")
    print("| model | " + " | ".join(f"task {k + 1}" for k in range(experiences)) + " | step losses |")
    print("|---|" + "---|" * experiences + "---|")
    for name, accuracy, losses in rows:
        print(f"| {name} | " + " | ".join(f"{a:.1f}" for a in accuracy) + " | "
              + (", ".join(f"{loss:.3f}" for loss in losses) or "–") + " |")


if __name__ == "__main__":
    main()
