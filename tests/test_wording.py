"""Phrasings the commands share (hdqt_cil/wording.py): each command's --help describes it with its docstring's whole
first paragraph, and a count of epochs is singular for one."""
import importlib
import sys

import pytest

from hdqt_cil.wording import epochs, help_description

COMMANDS = ["scripts.fidelity_probe", "scripts.quant_gap_report", "scripts.replay_bn_probe", "scripts.code_fingerprint",
            "scripts.compare_runs", "scripts.lwf_study_per_run", "scripts.bench.kernel_resources",
            "scripts.bench.diagnostics_cpu", "scripts.bench.numbers", "scripts.bench.sweep", "hdqt_cil.kernels.build",
            "data_prep.hapt", "data_prep.dsads", "data_prep.pamap2"]


@pytest.mark.parametrize("name", COMMANDS)
def test_help_describes_a_command_with_its_docstrings_first_paragraph(name, monkeypatch, capsys):
    module = importlib.import_module(name)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit):
        module.main()
    described = " ".join(capsys.readouterr().out.split("\n\n")[1].split())  # the paragraph after the usage
    assert described == " ".join(module.__doc__.split("\n\n")[0].split())
    assert described.endswith(".")


def test_help_description_is_the_first_paragraph():
    assert help_description("\nOne sentence that goes on\nto a second line.\n\n    usage\n") == \
        "One sentence that goes on\nto a second line."


@pytest.mark.parametrize("count, phrase", [(1, "1 epoch"), ("1", "1 epoch"), (10, "10 epochs"), ("60", "60 epochs")])
def test_epochs(count, phrase):
    assert epochs(count) == phrase


def test_a_run_of_one_epoch_a_task_says_so_in_the_singular():
    from hdqt_cil.trainer.optim import PerExperienceSGD

    assert PerExperienceSGD(0.1).describe(1) == ["schedule: 1 epoch a task; lr 0.1, constant"]
