"""scripts/fidelity_probe.py: one batch's gradient fidelity under a scheme and variants of its settings."""
import pytest

from scripts.fidelity_probe import COLUMNS, main

ROLES = ("input", "weight", "grad_output", "bwd_weight", "bwd_input")
FLOAT32_OPERANDS = " ".join(f"quant.exp_bits.{r}=8 quant.man_bits.{r}=23" for r in ROLES)
LOSSLESS = f"quant.acc=none quant.fwd_clip=1.0 {FLOAT32_OPERANDS}"  # fp with float32's own format, no clipping


def _table(output: str) -> dict[str, list[float]]:
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == len(COLUMNS) + 1 and cells[0] != "settings":
            rows[cells[0]] = [None if c == "–" else float(c) for c in cells[1:]]  # – : no such layers
    return rows


def test_rows_differ_by_their_settings_alone(capsys):
    """The same model and batch in every row: the scheme as given loses fidelity, the same scheme on the torch
    backend (the same bits on the CPU) loses exactly as much, and float32's own format in it loses none."""
    main(["quant=fp", "trainer.device=cpu", "--batch", "64", "--vary", "quant.backend=torch", "--vary", LOSSLESS])
    rows = _table(capsys.readouterr().out)
    assert list(rows) == ["as given", "quant.backend=torch", LOSSLESS]
    given = rows["as given"]
    assert rows["quant.backend=torch"] == given
    assert min(v for v in given if v is not None) < 0.999
    assert all(abs(v - 1) < 1e-6 for v in rows[LOSSLESS] if v is not None)
    assert sum(v is not None for v in given) >= 4  # logits, first and last layers, input gradients at least


@pytest.mark.parametrize("variant, message", [
    ("quant.acc=bogus", "error: quant.acc='bogus' must be one of"),
    ("quant.acc_bitz=3", "^error: quant.acc_bitz is not a setting; did you mean quant.acc_man_bits"),
    ("trainer.batch_size=8 quant.acc=none", "changes trainer: a variant changes the scheme's settings"),
])
def test_a_bad_variant_is_refused_by_name(variant, message):
    with pytest.raises(SystemExit, match=message):
        main(["quant=fp", "trainer.device=cpu", "--vary", variant])


def test_a_misspelt_setting_is_named_with_its_nearest():
    with pytest.raises(SystemExit, match="^error: trainer.epoch is not a setting; did you mean trainer.epochs"):
        main(["quant=fp", "trainer.epoch=3"])


def test_a_batch_of_one_is_refused():
    with pytest.raises(SystemExit, match="--batch 1"):
        main(["quant=fp", "--batch", "1"])


def test_the_header_names_the_batch_it_took(capsys):
    """A --batch larger than the first experience takes the experience whole, and says so with its size."""
    main(["quant=hdqt", "trainer.device=cpu", "--batch", "100000"])
    header = capsys.readouterr().out.splitlines()[0]
    size = int(header.split("one batch of ")[1].split()[0])
    assert 2 <= size < 100000 and "whole training set: fewer than --batch 100000" in header
