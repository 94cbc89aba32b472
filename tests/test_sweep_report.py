"""The sweep's report (hdqt_cil/sweep/report.py) at the sweep's end; tests/test_cli.py runs it in real sweeps."""
import time

from omegaconf import OmegaConf

from hdqt_cil.sweep import SweepReport, record_job


def end_of_sweep(sweep_dir, started) -> SystemExit | None:
    """SweepReport's end of a sweep started at `started` into `sweep_dir`: how it exits, if it does."""
    report = SweepReport()
    report.started = started
    try:
        report.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}}))
    except SystemExit as end:
        return end
    return None


def test_jobs_sharing_a_folder_keep_a_record_each_and_a_failed_one_fails_the_sweep(tmp_path):
    started, folder = time.time() - 1, tmp_path / "digits-mlp/naive/hdqt/seed0"
    record_job(tmp_path, 1, folder, ["quant.bits=4"], None)
    record_job(tmp_path, 0, folder, ["quant.bits=1"], ValueError("quant.bits=1 is too few"))
    record_job(tmp_path, 1, folder, ["quant.bits=4"], None)  # the same job run again: its record, replaced
    end = end_of_sweep(tmp_path, started)
    assert end is not None and str(end.code).startswith("1 of 2 jobs failed; see ")
    rows = [line for line in (tmp_path / "sweep_summary.md").read_text().splitlines() if line.startswith("| #")]
    assert rows == ["| #0 | digits-mlp/naive/hdqt/seed0 | quant.bits=1 | failed | ValueError: quant.bits=1 is too few "
                    "|", "| #1 | digits-mlp/naive/hdqt/seed0 | quant.bits=4 | completed |  |"]



def test_a_job_whose_run_diverged_and_went_on_is_listed_as_diverged_without_failing_the_sweep(tmp_path):
    started = time.time() - 1
    record_job(tmp_path, 0, tmp_path / "digits-mlp/naive/hdqt/seed0", ["quant=hdqt"], None)
    record_job(tmp_path, 1, tmp_path / "digits-mlp/naive/luq/seed0", ["quant=luq"], None,
               "training diverged in experience 2, epoch 1: non-finite loss")
    assert end_of_sweep(tmp_path, started) is None
    report = (tmp_path / "sweep_summary.md").read_text()
    assert ": 1 of 2 jobs completed, 1 diverged\n" in report
    assert "| #1 | digits-mlp/naive/luq/seed0 | quant=luq | diverged | training diverged in experience 2, epoch 1: " \
           "non-finite loss |" in report
