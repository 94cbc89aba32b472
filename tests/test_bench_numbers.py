"""docs/kernels.md's "Current numbers" are the records' numbers: generated, checked, and moved by a record."""
import json
import shutil

from scripts.bench import numbers


def test_the_docs_table_is_what_the_records_give():
    assert numbers.main(["--check"]) == 0


def test_a_changed_record_changes_the_table(tmp_path):
    for name in numbers.MACHINES:  # every record the table reads
        shutil.copy(numbers.ROOT / "results" / "bench" / name, tmp_path / name)
    record = json.loads((tmp_path / numbers.STEPS).read_text())
    rows = {r["name"]: r for r in record["rows"]}
    step, fp32 = rows["resnet32 hdqt kernels, CUDA graph"], rows["resnet32 fp32 (TF32 off), CUDA graph"]
    step["seconds"] *= 2
    (tmp_path / numbers.STEPS).write_text(json.dumps(record))
    assert numbers.main(["--check", "--records", str(tmp_path)]) == 1
    doubled = f"{step['seconds'] * 1e3:.2f} ms: {step['seconds'] / fp32['seconds']:.2f}× FP32"
    assert doubled in numbers.table(tmp_path)


def test_driver_copies_and_fills_are_not_counted_as_kernels():
    """The profiler's names for cudaMemcpyAsync and cudaMemsetAsync work, against kernels of any name."""
    from types import SimpleNamespace

    from scripts.bench.record import memory_operation

    names = {"Memcpy DtoH (Device -> Pinned)": True, "Memset (Device)": True, "Memcpy HtoD (Pageable -> Device)": True,
             "intmm_kernel<2, 2, 2, 4, 3>": False, "void at::native::vectorized_elementwise_kernel<4>": False,
             "MemcpyLike_kernel": False}
    assert {n: memory_operation(SimpleNamespace(name=n)) for n in names} == names


def test_a_profile_is_printed_and_written_whole(tmp_path, capsys, monkeypatch):
    """A step's profile goes to its file as printed, title and every row (a remote command's output keeps only its
    tail, which would cut the largest rows off)."""
    from types import SimpleNamespace

    import torch

    from scripts.bench import record

    rows = "\n".join(f"kernel_{i} {100 - i} us" for i in range(80))
    prof = SimpleNamespace(key_averages=lambda: SimpleNamespace(table=lambda **_: rows))
    events = [SimpleNamespace(device_time=1500.0), SimpleNamespace(device_time=500.0)]
    path = tmp_path / "deep" / "profile_resnet32_fp.txt"
    monkeypatch.setattr(record, "_kernel_events", lambda fn: (fn(), prof, events)[1:])
    record.print_device_profile("two eager resnet32 fp steps", lambda: torch.zeros(1), rows=80, path=path)
    written = path.read_text()
    assert written.startswith("profile: two eager resnet32 fp steps: 2 device ops, 2.00 ms of device time\n")
    assert "kernel_0 100 us" in written and "kernel_79 21 us" in written
    assert written.strip() in capsys.readouterr().out
