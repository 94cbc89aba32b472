"""scripts/replay_bn_probe.py: a phase's BatchNorm statistics and weight steps, each alone, on a run's checkpoint."""
import re

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from test_cifar import write_torchvision_cifar
from hdqt_cil.experiment import run
from hdqt_cil.run_folder import RunFolder
from scripts.replay_bn_probe import main, phase

OVERRIDES = ["benchmark=cifar10", "model=resnet32", "strategy=icarl", "benchmark.verify=false",
             "benchmark.n_experiences=2", "trainer.epochs=1", "trainer.batch_size=8", "trainer.memory_size=20",
             "trainer.device=cpu", "strategy.hp_replay=10"]


def _rows(output: str) -> dict[str, list[float]]:
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 2 and re.fullmatch(r"[\d.]+", cells[1]):
            rows[cells[0]] = [float(c) for c in cells[1:-1]]
    return rows


@pytest.fixture
def checkpointed_run(make_cfg, tmp_path, monkeypatch):
    """A finished two-experience hp_replay run whose experience checkpoint was kept, with its overrides beside it
    as a command's run has them."""
    write_torchvision_cifar(tmp_path / "data", "cifar10", per_class_train=4, per_class_test=2)
    monkeypatch.setattr(RunFolder, "clear_checkpoints", lambda self: None)
    summary = run(make_cfg(*OVERRIDES), tmp_path / "run")
    monkeypatch.undo()
    (tmp_path / "run" / ".hydra").mkdir()
    overrides = [*OVERRIDES, f"data_root={tmp_path}/data", f"results_root={tmp_path}/runs"]
    (tmp_path / "run" / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    return tmp_path / "run", summary


def test_the_probe_starts_from_the_checkpointed_model_and_changes_one_thing_at_a_time(checkpointed_run, capsys):
    folder, summary = checkpointed_run
    main([str(folder), "--lr", "0", "logging.progress=off"])
    output = capsys.readouterr().out
    assert "after experience 1 (no phase ran there" in output.splitlines()[0]
    rows = _rows(output)
    assert list(rows) == ["as checkpointed", "running statistics alone", "weight steps alone", "both (the phase)"]
    # the checkpoint holds the model the run scored after experience 1, on task 1
    np.testing.assert_allclose(rows["as checkpointed"], [summary["acc_matrix"][0][0]], atol=0.05)


@pytest.mark.parametrize("bn,step", [("train", False), ("eval", True), ("train", True)])
def test_each_variant_changes_what_it_names(bn, step):
    """The running statistics move only with BatchNorm in train mode, the weights only with a step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 5))
    model[1].running_mean.normal_()  # statistics a batch of old classes alone would move
    x, y = torch.randint(0, 256, (16, 3, 8, 8)).float(), torch.randint(0, 3, (16,))
    changed, losses = phase(model, x, y, 3, 0.1, bn, step, torch.Generator().manual_seed(0))
    before, after = model.state_dict(), changed.state_dict()
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    statistics = {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    weights = {name for name, _ in model.named_parameters()}
    assert moved == (statistics if bn == "train" else set()) | (weights if step else set())
    assert len(losses) == 2 and model.training  # the model probed is a copy


def test_a_run_it_cannot_rebuild_is_refused_naming_what_is_missing(checkpointed_run):
    folder, _ = checkpointed_run
    (folder / ".hydra" / "overrides.yaml").unlink()
    with pytest.raises(SystemExit, match="overrides.yaml is missing"):
        main([str(folder)])
    RunFolder(folder).clear_checkpoints()
    with pytest.raises(SystemExit, match="holds no experience checkpoint"):
        main([str(folder)])


def test_a_misspelt_setting_is_refused_with_its_nearest(checkpointed_run):
    folder, _ = checkpointed_run
    with pytest.raises(SystemExit, match="^error: trainer.lr_ is not a setting; did you mean trainer.lr"):
        main([str(folder), "trainer.lr_=0.1"])


def test_a_folder_that_does_not_exist_is_named_so(tmp_path):
    missing = tmp_path / "no_such_run"
    with pytest.raises(SystemExit, match=f"^error: {missing} does not exist "):
        main([str(missing)])
