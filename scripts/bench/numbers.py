"""docs/kernels.md's "Current numbers" table, generated from the benchmark records kept in results/bench.

    python -m scripts.bench.numbers            # rewrite the table in docs/kernels.md
    python -m scripts.bench.numbers --check    # exit 1 if the table differs from what the records give
"""
import argparse
import json
import sys
from pathlib import Path

from hdqt_cil.kernels.compile import GEMM_CONFIGS, WGMMA_CONFIGS
from hdqt_cil.wording import help_description

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "kernels.md"
BEGIN = "<!-- numbers: python -m scripts.bench.numbers (from results/bench) -->"
END = "<!-- end of numbers -->"
KERNELS, STEPS, HOT = "kernels_h100.json", "steps_h200.json", "hot_h100.json"
COMPILED_STEPS = "steps_h100.json"  # the FP32 step that trainer.compile captures, beside torch.compile's
PACKED = "packed_steps_h200.json"  # steps of 12 processes sharing one GPU


def load(name: str, folder: Path) -> dict:
    return json.loads((folder / name).read_text())


def kernel_row(record: dict, name: str) -> dict:
    return next(r for r in record["rows"] if r["name"].strip() == name)


def hot_row(record: dict, variant: str, metric: str, case: str = "vit-linear") -> dict:
    return next(r for r in record["rows"] if (r["case"], r["variant"], r["metric"]) == (case, variant, metric))


def lines(folder: Path) -> list[tuple[str, str, str]]:
    """(measurement, value, record) rows: training steps from the steps record, kernels from the kernels record."""
    k, steps, hot = load(KERNELS, folder), load(STEPS, folder), load(HOT, folder)
    compiled_steps, packed = load(COMPILED_STEPS, folder), load(PACKED, folder)

    def ms(name, record=steps):
        return kernel_row(record, name)["seconds"] * 1e3

    def step(model, scheme):
        fp32_graph = ms(f"{model} fp32 (TF32 off), CUDA graph")
        graph, ref = ms(f"{model} {scheme} kernels, CUDA graph"), ms(f"{model} {scheme} torch reference")
        return graph, graph / fp32_graph, fp32_graph, ref / graph, ref

    def work(model, scheme):
        r = kernel_row(steps, f"{model} {scheme} kernels")
        copies = f" + {r['copies']:.0f} copies" if "copies" in r else ""
        return f"{r['kernels']:.0f} kernels{copies}, {r['device_ms']:.2f} ms of device time"

    def rate(name):
        r = kernel_row(k, name)
        return r["value"], r["ratio"]

    def of_copy(name, *sizes):
        return " / ".join(f"{kernel_row(k, f'{name}, {size} MiB')['ratio']:.2f}" for size in sizes)

    rows = []
    graph, vs_fp32, fp32_graph, speedup, ref = step("resnet32", "hdqt")
    rows.append(("ResNet-32 HDQT training step from CUDA graphs",
                 f"{graph:.2f} ms: {vs_fp32:.2f}× FP32 from CUDA graphs ({fp32_graph:.2f} ms), {speedup:.1f}× faster "
                 f"than the torch reference ({ref:.1f} ms)", STEPS))
    fp32 = kernel_row(steps, "resnet32 fp32 (TF32 off)")
    rows.append(("ResNet-32 step's work (eager profile): HDQT / FP32",
                 f"{work('resnet32', 'hdqt')} / {fp32['kernels']:.0f} kernels, {fp32['device_ms']:.2f} ms", STEPS))
    compiled = ms("resnet32 fp32 (TF32 off), torch.compile")
    rows.append(("ResNet-32 FP32 step under torch.compile (mode reduce-overhead)",
                 f"{compiled:.2f} ms; HDQT from CUDA graphs is {graph / compiled:.2f}× it", STEPS))
    for model, name in (("resnet32", "ResNet-32"), ("mlp", "MLP")):
        replayed, compiled_graph, reduce_overhead = (ms(f"{model} fp32 (TF32 off), {path}", compiled_steps) for path in
                                                     ("CUDA graph", "CUDA graph of the compiled step", "torch.compile"))
        rows.append((f"{name} FP32 step, trainer.compile (the compiled step replayed from CUDA graphs)",
                     f"{compiled_graph:.2f} ms: {compiled_graph / replayed:.2f}× FP32 from CUDA graphs "
                     f"({replayed:.2f} ms); torch.compile's reduce-overhead {reduce_overhead:.2f} ms", COMPILED_STEPS))
    one_stream = ms("resnet32 hdqt kernels, CUDA graph, backward on one stream")
    rows.append(("ResNet-32 HDQT step with each layer's weight gradient after its input gradient on one stream",
                 f"{one_stream:.2f} ms ({one_stream / fp32_graph:.2f}× FP32 from CUDA graphs; two streams "
                 f"{graph:.2f} ms)", STEPS))
    by_case = {r["case"]: r for r in packed["rows"]}
    rows.append((f"ResNet-32 step, {by_case['fp32']['processes']} processes sharing one GPU (CUDA MPS): "
                 "HDQT / INT4 / LUQ against FP32",
                 " / ".join(f"{by_case[c]['x_fp32']:.2f}×" for c in ("hdqt", "int4", "luq"))
                 + f" ({by_case['fp32']['step_s'] * 1e3:.1f} ms a step beside the others); HDQT on one stream "
                 f"{by_case['hdqt:one-stream']['x_fp32']:.2f}×", PACKED))
    unfused = ms("resnet32 hdqt kernels, CUDA graph, g_x as GEMM rows + col2im")
    rows.append(("ResNet-32 HDQT step with g_x as the GEMM's float rows + col2im (not folded)",
                 f"{unfused:.2f} ms ({unfused / fp32_graph:.2f}× FP32 from CUDA graphs)", STEPS))
    rows.append(("ResNet-32 HDQT step, kernels eagerly",
                 f"{ms('resnet32 hdqt kernels'):.2f} ms (FP32 eagerly {ms('resnet32 fp32 (TF32 off)'):.2f} ms)",
                 STEPS))
    int4, luq = step("resnet32", "int4"), step("resnet32", "luq")
    rows.append(("ResNet-32 INT4 / LUQ step from CUDA graphs",
                 f"{int4[0]:.2f} / {luq[0]:.2f} ms ({int4[1]:.2f}× / {luq[1]:.2f}× FP32 from CUDA graphs)", STEPS))
    graph, vs_fp32, fp32_graph, speedup, ref = step("mlp", "hdqt")
    rows.append(("MLP (561-561-561-11) HDQT step from CUDA graphs",
                 f"{graph:.2f} ms: {vs_fp32:.2f}× FP32 from CUDA graphs ({fp32_graph:.2f} ms), {speedup:.1f}× faster "
                 f"than the torch reference ({ref:.2f} ms)", STEPS))
    int4, luq = step("mlp", "int4"), step("mlp", "luq")
    rows.append(("MLP INT4 / LUQ step from CUDA graphs",
                 f"{int4[0]:.2f} / {luq[0]:.2f} ms ({int4[1]:.2f}× / {luq[1]:.2f}× FP32 from CUDA graphs)", STEPS))
    bf16 = kernel_row(k, "torch bf16 matmul 4096^3")["value"]
    tops, ratio = rate("tiled GEMM 4096^3 (tile 32, acc 8)")
    rows.append(("GEMM 4096³, tile 32, 8-bit accumulator (4-bit operands)",
                 f"{tops:.1f} TOP/s, {ratio:.2f}× torch bf16 matmul ({bf16:.1f} TFLOP/s)", KERNELS))
    tops, ratio = rate("scaled epilogue + count (the layers' product)")
    rows.append(("the same with the saturation count and scaled epilogue (the layers' product)",
                 f"{tops:.1f} TOP/s, {ratio:.2f}× bf16", KERNELS))
    tops, ratio = rate("no saturation (acc_bits None)")
    mma_rows = {f"config {c}, no saturation" for c in GEMM_CONFIGS.keys() - WGMMA_CONFIGS}
    mma = max(r["value"] for r in k["rows"] if r["name"].strip() in mma_rows)
    cublas = kernel_row(k, "torch._int_mm 4096^3 (cuBLAS int8, no saturation)")["value"]
    rows.append(("GEMM 4096³ without saturation (wgmma on Hopper); the best mma.sync tile; cuBLAS int8 "
                 "(`torch._int_mm`)", f"{tops:.1f} TOP/s ({ratio:.2f}× bf16); {mma:.1f}; {cublas:.1f} TOP/s", KERNELS))
    copy = kernel_row(k, "device copy (read + write)")["value"]
    rows.append((f"quantize per tensor, nearest / stochastic, 64 / 128 MiB (of copy bandwidth, {copy:,.0f} GB/s)",
                 f"{of_copy('quantize per tensor, nearest (HDQT fwd)', 64, 128)}; "
                 f"{of_copy('quantize per tensor, stochastic', 64, 128)}", KERNELS))
    rows.append(("quantize per sample of 1024 / of 16384, stochastic, 64 / 128 MiB",
                 f"{of_copy('quantize per sample of 1024, stochastic', 64, 128)}; "
                 f"{of_copy('quantize per sample of 16384, stochastic', 64, 128)}", KERNELS))
    rows.append(("Hadamard(1024) + stochastic quantize, per tensor / per sample of 16384, 64 / 128 MiB",
                 f"{of_copy('Hadamard(1024) + quantize per tensor, SR', 64, 128)}; "
                 f"{of_copy('Hadamard(1024) + quantize per sample 16384, SR', 64, 128)}", KERNELS))
    rows.append(("Hadamard(1024) alone, 64 / 128 MiB", of_copy("Hadamard(1024) alone (float32 out)", 64, 128), KERNELS))
    fp32, graphed = hot_row(hot, "fp32", "backward"), hot_row(hot, "hot[auto]", "backward, CUDA graph")
    eager, bf16 = hot_row(hot, "hot[auto]", "backward"), hot_row(hot, "bf16 autocast", "backward")
    rows.append(("HOT backward of a ViT-B-size Linear stack (batch 64) from CUDA graphs",
                 f"{graphed['value']:.2f} ms, {graphed['ratio']:.2f}× faster than FP32 ({fp32['value']:.2f} ms), "
                 f"{graphed['value'] / bf16['value']:.2f}× bf16 autocast ({bf16['value']:.2f} ms); eagerly "
                 f"{eager['value']:.2f} ms ({eager['ratio']:.2f}×)", HOT))
    fp32, graphed = (hot_row(hot, v, "training step, CUDA graph", "resnet32") for v in ("fp32", "hot[auto]"))
    fp32_work, work = (hot_row(hot, v, "kernels launched a training step", "resnet32")["value"]
                       for v in ("fp32", "hot[auto]"))
    rows.append(("ResNet-32 HOT training step from CUDA graphs (batch 128); kernels launched a step: HOT / FP32",
                 f"{graphed['value']:.2f} ms, {graphed['value'] / fp32['value']:.2f}× FP32's "
                 f"({fp32['value']:.2f} ms); {work:.0f} / {fp32_work:.0f}", HOT))
    return rows


MACHINES = {KERNELS: "one H100", STEPS: "one H200", HOT: "one H100", COMPILED_STEPS: "one H100", PACKED: "one H200"}


def table(folder: Path) -> str:
    out = ["| measurement (steps at batch 128) | value | record (machine) |", "|---|---|---|"]
    out += [f"| {what} | {value} | `{record}` ({MACHINES[record]}) |" for what, value, record in lines(folder)]
    return "\n".join(out)


def with_table(text: str, folder: Path) -> str:
    """`text` (docs/kernels.md) with the part between BEGIN and END replaced by the generated table."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest or END not in rest:
        raise SystemExit(f"{DOC}: the table's markers are missing ({BEGIN} ... {END})")
    return f"{head}{BEGIN}\n{table(folder)}\n{END}{tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/kernels.md's table is not current")
    parser.add_argument("--records", type=Path, default=ROOT / "results" / "bench")
    args = parser.parse_args(argv)
    current = DOC.read_text()
    wanted = with_table(current, args.records)
    if args.check:
        if wanted != current:
            print(f"{DOC}'s numbers differ from {args.records}: run python -m scripts.bench.numbers", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
