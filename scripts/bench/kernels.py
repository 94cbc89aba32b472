"""Benchmark of the CuPy kernels (hdqt_cil.kernels) on the GPU, against baselines measured in the same run.

    python -m scripts.bench.kernels [--out results/bench] [--quick] [--skip-steps | --steps-only | --quantize-only
                                    | --formats-only] [--profile-steps]
    python -m scripts.bench.kernels --repeat-case gemm:256x128:4      # one case, untimed, under a profiler

Rows (one table at the end, JSON with every number to OUT/bench_kernels_<device>.json):
  ceilings  device-to-device copy bandwidth (bytes read + written), torch bf16 matmul 4096^3, the int8
            mma.sync.m16n8k32 register-loop peak (plain, and with a clamp + add after every k32 MMA)
  gemm      the tiled-accumulation GEMM at M=N=K=4096 (tile 32, 8-bit accumulator): plain, counting saturated
            tiles (what the layers ask for), and with the fused scaled epilogue; torch._int_mm (cuBLAS int8, no
            saturation) for comparison; the float formats' products as their layers call them: fp8 on the FP8
            tensor cores, mxfp4 and nvfp4 on the int8 tensor cores (and on their torch reference)
  layers    the products of ResNet-32 and the HAR MLP at batch 128 (forward, grad_input, grad_weight), against the
            torch reference backend on the same GPU
  quantize  quantize / Hadamard+quantize / Hadamard on 64 and 128 MiB float32 tensors, as a fraction of the copy
            bandwidth (bytes = 4 read + 1 written per element; the two-pass quantizers read the input twice),
            replayed from a CUDA graph (device time)
  step      one training step (forward + backward + SGD) of ResNet-32 and of the MLP at batch 128: FP32 (TF32 off),
            eagerly and from CUDA graphs; the scheme on the torch reference backend, on the kernels, and on the
            kernels from CUDA graphs (trainer.cuda_graph=true; for ResNet-32 also with each layer's backward on one
            stream, and with the input gradient as the GEMM's rows + col2im); the float formats from CUDA graphs on
            their torch reference and on the tensor cores (fp, the authors' quantizer: on its rounding kernels)
Times are medians of CUDA-event timings after warm-up; GEMM inputs rotate among several buffer sets (beyond L2).
"""
import argparse
import contextlib
import dataclasses
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hdqt_cil import kernels
from hdqt_cil.kernels import runtime as rt
from hdqt_cil.kernels.compile import GEMM_CONFIGS, WGMMA_CONFIGS, gemm_tile, runs_here
from hdqt_cil.quant.backend import block_scaled_product, e2m1_blocks, fp8_matmul, has_fp8_tensor_cores
from hdqt_cil.quant.float_product import FloatOperand, format_matmul
from hdqt_cil.quant import preset, streams
from hdqt_cil.quant.float_schemes import FloatScheme, FormatProduct
from hdqt_cil.quant.floats import E2M1, E4M3, SCALINGS, FloatSpec, per_tensor, quantize_float
from scripts.bench.record import device_work, print_device_profile, save_rows
from scripts.bench.timing import cuda_time, graphed, host_time, median_seconds

PEAK_SOURCE = str(Path(__file__).resolve().parent / "peak.cu")  # the tensor cores' register-loop ceiling


ROWS = []


def row(group, name, seconds, metric, value, unit, baseline=None, ratio=None, target=None, **extra):
    entry = dict(group=group, name=name, seconds=seconds, metric=metric, value=value, unit=unit, baseline=baseline,
                 ratio=ratio, target=target, **extra)
    ROWS.append(entry)
    ratio_text = "" if ratio is None else f"{ratio:.2f}x"
    work = (f"{extra['kernels']:.0f} kernels + {extra['copies']:.0f} copies, {extra['device_ms']:.2f} ms on device"
            if "kernels" in extra else "")
    print(f"  {group:8s} {name:44s} {seconds * 1e3:10.4f} ms  {value:10.1f} {unit:8s} {ratio_text:>8s} "
          f"{baseline or ''} {target or ''} {work}", flush=True)
    return entry


# ------------------------------------------------------------------------------------------------ ceilings


def copy_bandwidth(quick: bool) -> float:
    n = (1 << 28) if not quick else (1 << 26)  # 1 GiB of float32
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    t = cuda_time(lambda: dst.copy_(src), reps=10)
    copy_bw = 2 * n * 4 / t
    row("ceiling", "device copy (read + write)", t, "GB/s", copy_bw / 1e9, "GB/s")
    return copy_bw


def bf16_matmul_rate(size: int = 4096) -> float:
    """FLOP/s of torch's bf16 matmul at size³ (three operand pairs in turn: no cache reuse between calls)."""
    a = [torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    b = [torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    i = [0]

    def bf16():
        i[0] = (i[0] + 1) % 3
        torch.matmul(a[i[0]], b[i[0]])

    t = cuda_time(bf16, reps=30)
    row("ceiling", f"torch bf16 matmul {size}^3", t, "TFLOP/s", 2 * size**3 / t / 1e12, "TFLOP/s")
    return 2 * size**3 / t


def ceilings(quick: bool):
    copy_bw = copy_bandwidth(quick)
    bf16_rate = bf16_matmul_rate()

    seed = torch.randint(0, 2**31 - 1, (32,), device="cuda", dtype=torch.int32)
    blocks, threads, iters = rt.sm_count() * 4, 256, 4096
    out = torch.empty(blocks * threads, dtype=torch.int32, device="cuda")
    ops = blocks * (threads // 32) * iters * 8 * (16 * 8 * 32 * 2)  # 8 chains, m16n8k32, 2 ops a MAC
    plain = rt.function(PEAK_SOURCE, "mma_peak_plain")
    clamped = rt.function(PEAK_SOURCE, "mma_peak_clamped")
    t = cuda_time(lambda: rt.launch(plain, (blocks,), (threads,), (rt.ptr(seed), rt.i32(iters), rt.ptr(out))), 10)
    peak = ops / t
    row("ceiling", "int8 mma.sync m16n8k32 peak (registers)", t, "TOP/s", peak / 1e12, "TOP/s")
    t = cuda_time(lambda: rt.launch(clamped, (blocks,), (threads,),
                                    (rt.ptr(seed), rt.i32(iters), rt.i32(127), rt.ptr(out))), 10)
    clamped_peak = ops / t
    row("ceiling", "  same, clamp + add after each k32 MMA", t, "TOP/s", clamped_peak / 1e12, "TOP/s")
    packed = rt.function(PEAK_SOURCE, "mma_peak_packed")
    t = cuda_time(lambda: rt.launch(packed, (blocks,), (threads,),
                                    (rt.ptr(seed), rt.i32(iters), rt.i32(127), rt.ptr(out))), 10)
    row("ceiling", "  same, packed 16-bit clamp (GEMM mode 4)", t, "TOP/s", ops / t / 1e12, "TOP/s")
    clamped_peak = max(clamped_peak, ops / t)
    return copy_bw, bf16_rate, peak, clamped_peak


# ------------------------------------------------------------------------------------------------ GEMM


def gemm_4096(bf16_rate, peak, clamped_peak):
    size = 4096
    sets = [(torch.randint(-7, 8, (size, size), device="cuda", dtype=torch.int8),
             torch.randint(0, 16, (size, size), device="cuda", dtype=torch.int8)) for _ in range(3)]
    i = [0]

    def pick():
        i[0] = (i[0] + 1) % len(sets)
        a, bt = sets[i[0]]
        return a, bt.t()  # b (K, N) with K contiguous

    ops = 2 * size**3
    scale_a = torch.tensor(0.01, device="cuda")
    scale_b = torch.tensor(0.02, device="cuda")
    variants = {
        "tiled GEMM 4096^3 (tile 32, acc 8)": lambda: kernels.tiled_int_matmul(*pick(), 32, 8, bounds=(7, 15)),
        "  counting saturated tiles": lambda: kernels.tiled_int_matmul(*pick(), 32, 8, bounds=(7, 15),
                                                                       count_saturated=True),
        "  scaled epilogue + count (the layers' product)": lambda: kernels.scaled_int_matmul(
            *pick(), scale_a, scale_b, 1, 32, 8, bounds=(7, 15), count_saturated=True),
        "  whole-K saturation (tile None)": lambda: kernels.tiled_int_matmul(*pick(), None, 8, bounds=(7, 15)),
        "  no saturation (acc_bits None)": lambda: kernels.tiled_int_matmul(*pick(), None, None, bounds=(7, 15)),
    }
    results = {}
    for name, fn in variants.items():
        t = cuda_time(fn, reps=30)
        rate = ops / t
        results[name] = rate
        row("gemm", name, t, "TOP/s", rate / 1e12, "TOP/s", baseline="vs bf16", ratio=rate / bf16_rate,
            target=">= 0.5x bf16" if name.startswith("tiled") else None, of_mma_peak=rate / peak,
            of_clamped_peak=rate / clamped_peak)
    reference = kernels.tiled_int_matmul(*sets[0][:1], sets[0][1].t(), 32, 8, bounds=(7, 15))
    for config in (c for c in GEMM_CONFIGS if min(gemm_tile(c)[:2]) >= 128 and runs_here(c)):
        for label, tile, acc, count, packed in (("tile 32 packed", 32, 8, False, True),
                                                ("tile 32 plain", 32, 8, False, False),
                                                ("tile 32 + count", 32, 8, True, False),
                                                ("the layers' product", 32, 8, True, None),
                                                ("no saturation", None, None, False, False)):
            def fn(config=config, tile=tile, acc=acc, count=count, packed=packed):
                if packed is None:  # scaled epilogue and count, packed where eligible, as the layers call it
                    return kernels.scaled_int_matmul(*pick(), scale_a, scale_b, 1, tile, acc, (7, 15), count,
                                                     config=config)
                return kernels.tiled_int_matmul(*pick(), tile, acc, (7, 15), count, config=config, packed=packed)
            if label.startswith("tile 32 p"):  # the same bits whatever the tile shape and mode
                check = kernels.tiled_int_matmul(sets[0][0], sets[0][1].t(), 32, 8, (7, 15), False, config=config,
                                                 packed=packed)
                assert torch.equal(check, reference), f"config {config} differs"
            t = cuda_time(fn, reps=20)
            row("gemm", f"  config {config}, {label}", t, "TOP/s", ops / t / 1e12, "TOP/s", baseline="vs bf16",
                ratio=ops / t / bf16_rate)
    try:
        t = cuda_time(lambda: torch._int_mm(sets[0][0], sets[0][1].t()), reps=30)
        row("gemm", "torch._int_mm 4096^3 (cuBLAS int8, no saturation)", t, "TOP/s", ops / t / 1e12, "TOP/s",
            baseline="vs bf16", ratio=ops / t / bf16_rate)
    except Exception as err:  # noqa: BLE001
        print(f"  torch._int_mm unavailable: {err}")
    float_format_gemms(bf16_rate)
    return results


def float_format_gemms(bf16_rate, size: int = 4096):
    """The float formats' products at size³ as their layers call them: fp8's from rounded operands on the FP8
    tensor cores; mxfp4's and nvfp4's on the int8 tensor cores, the GEMM alone and with the rounding of both
    float32 operands (floats.cu), beside their torch reference on the same GPU (rounding, a float32 matmul a
    K block), each checked equal to the reference first."""
    ops = 2 * size**3
    if has_fp8_tensor_cores():
        operands = [FloatOperand(*per_tensor(torch.randn(size, size, device="cuda"), E4M3), None, E4M3)
                    for _ in range(2)]
        t = cuda_time(lambda: fp8_matmul(*operands), reps=30)
        row("gemm", "fp8 4096^3 as quant=fp8 runs it (E4M3 values cast, torch._scaled_mm, float32 sums)", t,
            "TFLOP/s", ops / t / 1e12, "TFLOP/s", baseline="vs bf16", ratio=ops / t / bf16_rate)
    for scheme, scaling in (("mxfp4", "mx"), ("nvfp4", "nv")):
        spec = FloatSpec(E2M1, scaling)
        product, block = FormatProduct(spec, spec), SCALINGS[scaling]
        x, w = (torch.randn(size, size, device="cuda") for _ in range(2))
        a, b = e2m1_blocks(x, spec), e2m1_blocks(w, spec)

        def reference():
            return format_matmul(*(FloatOperand(*quantize_float(t, spec), block, E2M1) for t in (x, w)), product)
        got = block_scaled_product(a, b, block, 1, False)
        assert torch.equal(got, reference()), f"{scheme}: the kernels' product differs from the reference"
        t = cuda_time(lambda: block_scaled_product(a, b, block, 1, False), reps=20)
        row("gemm", f"{scheme} 4096^3 GEMM (int8 tensor cores, a scale pair a block)", t, "TFLOP/s",
            ops / t / 1e12, "TFLOP/s", baseline="vs bf16", ratio=ops / t / bf16_rate)
        t_all = cuda_time(lambda: block_scaled_product(e2m1_blocks(x, spec), e2m1_blocks(w, spec), block, 1, False),
                          reps=20)
        row("gemm", f"{scheme} 4096^3 as quant={scheme} runs it (both operands rounded, GEMM)", t_all, "TFLOP/s",
            ops / t_all / 1e12, "TFLOP/s", baseline="vs bf16", ratio=ops / t_all / bf16_rate)
        t_ref = cuda_time(reference, reps=3)
        row("gemm", f"{scheme} 4096^3 on the torch reference (rounding, float32 matmul a block)", t_ref, "TFLOP/s",
            ops / t_ref / 1e12, "TFLOP/s", baseline="speedup of the kernels", ratio=t_ref / t_all)


def gemm_batch_summed(bf16_rate):
    """HOT's weight gradient of a ViT-B MLP layer: 64 samples of (3072 x 197) · (197 x 768), a scale per sample,
    summed over the samples: in the GEMM's epilogue (mode 3, per tile config) against per-sample products written
    out and summed by sum_entries_f32. All must give the same bits."""
    batch, m, n, k = 64, 3072, 768, 197
    padded = -(-k // 16) * 16  # ABC's row layout: the kernel reads the levels in place

    def levels(rows):
        return torch.randint(-127, 128, (batch, rows, padded), device="cuda", dtype=torch.int8)[..., :k]

    a, b = levels(m), levels(n).transpose(-1, -2)
    sa, sb = torch.rand(batch, 1, 1, device="cuda"), torch.rand(batch, 1, 1, device="cuda")
    ops = 2 * batch * m * n * k

    def written():
        return kernels.sum_entries(kernels.scaled_int_matmul(a, b, sa, sb, 1, None, None, (127, 127)))

    reference = written()
    variants = {"per-sample products written, then summed": written}
    for config in ("64x64", "128x128w", "128x128", "128x128x2", *filter(runs_here, sorted(WGMMA_CONFIGS))):
        variants[f"  summed in the epilogue, config {config}"] = (
            lambda config=config: kernels.scaled_int_matmul(a, b, sa, sb, 1, None, None, (127, 127), False,
                                                            sum_batch=True, config=config))
    for name, fn in variants.items():
        assert torch.equal(fn(), reference), f"{name}: other bits"
        t = cuda_time(fn, reps=20)
        row("gemm", f"batch-summed {batch}x{m}x{n}x{k}: {name}", t, "TOP/s", ops / t / 1e12, "TOP/s",
            baseline="vs bf16", ratio=ops / t / bf16_rate)


def layer_shapes(batch=128):
    """(label, a shape, b^T shape, tile, acc_bits): the products of ResNet-32 and the MLP as the layers call them."""
    shapes = []
    # ResNet-32: (stage, in, out, H·W of the output); the first conv of stages 2 and 3 has stride 2.
    convs = [("conv1", 3, 16, 1024), ("s1 conv", 16, 16, 1024), ("s2 first", 16, 32, 256), ("s2 conv", 32, 32, 256),
             ("s3 first", 32, 64, 64), ("s3 conv", 64, 64, 64)]
    for label, cin, cout, positions in convs:
        k = cin * 9
        shapes.append((f"resnet {label} fwd", (batch * positions, k), (cout, k), 32, 8))
        shapes.append((f"resnet {label} grad_in", (batch, positions, cout), (k, cout), None, 8))
        shapes.append((f"resnet {label} grad_w", (batch, cout, positions), (batch, k, positions), None, 8))
    for label, fin, fout in (("mlp hidden", 561, 561), ("mlp classifier", 561, 11)):
        shapes.append((f"{label} fwd", (batch, fin), (fout, fin), 32, 8))
        shapes.append((f"{label} grad_in", (1, batch, fout), (fin, fout), None, 8))
        shapes.append((f"{label} grad_w", (1, fout, batch), (1, fin, batch), None, 8))
    return shapes


def layers(quick: bool):
    from hdqt_cil.quant import tiled_int_matmul as reference

    total_kernel = total_ref = 0.0
    for label, a_shape, bt_shape, tile, acc_bits in layer_shapes():
        a = torch.randint(-7, 8, a_shape, device="cuda", dtype=torch.int8)
        bt = torch.randint(-7, 8, bt_shape, device="cuda", dtype=torch.int8)
        b = bt.transpose(-1, -2)
        af, bf = a.float(), b.float()
        def call():
            return kernels.tiled_int_matmul(a, b, tile, acc_bits, bounds=(7, 7), count_saturated=True)
        t = cuda_time(call, reps=10 if quick else 30)
        host = host_time(call)
        t_ref = cuda_time(lambda: reference(af, bf, tile, acc_bits, bounds=(7, 7), count_saturated=True), reps=5)
        m, k = a_shape[-2], a_shape[-1]
        n = bt_shape[-2]
        batch = math.prod(torch.broadcast_shapes(a_shape[:-2], bt_shape[:-2]))
        ops = 2 * batch * m * n * k
        total_kernel += t
        total_ref += t_ref
        row("layers", f"{label} {batch}x{m}x{n}x{k}", t, "TOP/s", ops / t / 1e12, "TOP/s", baseline="vs reference",
            ratio=t_ref / t, host_us=host * 1e6)
    row("layers", "all products of one step (sum)", total_kernel, "ms ref", total_ref * 1e3, "ms",
        baseline="vs reference", ratio=total_ref / total_kernel)


# ------------------------------------------------------------------------------------------------ quantize


def quantizers(copy_bw, quick: bool):
    """The quantizers on 64 MiB and 128 MiB of float32 (64 MiB only with --quick): a tensor that fits the 50 MB L2
    in part lets the second pass of a per-tensor quantizer read some of it from there."""
    for n_el in ((1 << 24),) if quick else ((1 << 24), (1 << 25)):
        quantizers_of(n_el, copy_bw)


def quantizer_cases(n_el: int):
    """(name, call, reads of the input) of every quantizer row, on n_el float32 elements."""
    from hdqt_cil.quant import QuantSpec
    from hdqt_cil.quant.rounding import Counter

    x = torch.randn(n_el // 1024, 1024, device="cuda")
    x16k = x.view(-1, 16, 1024)  # samples of 16384 elements (a conv layer's G at batch 128: L x out)
    counter = Counter(1, 2, 3)
    sr = dict(rounding="stochastic")
    return [
        ("quantize per tensor, nearest (HDQT fwd)", lambda: kernels.quantize(x, QuantSpec(4, "auto", "max", 0.975)), 2),
        ("quantize per tensor, stochastic", lambda: kernels.quantize(
            x, QuantSpec(4, "signed", "max", 1.0, "tensor", **sr), counter), 2),
        ("quantize per sample of 1024, stochastic", lambda: kernels.quantize(
            x, QuantSpec(4, "signed", "max", 1.0, "sample", **sr), counter), 1),
        ("quantize per sample of 16384, stochastic", lambda: kernels.quantize(
            x16k, QuantSpec(4, "signed", "max", 1.0, "sample", **sr), counter), 1),
        ("Hadamard(1024) + quantize per tensor, SR", lambda: kernels.hadamard_quantize(
            x, QuantSpec(4, "signed", "max", 1.0, "tensor", **sr), counter, 1024), 2),
        ("Hadamard(1024) + quantize per sample 16384, SR", lambda: kernels.hadamard_quantize(
            x16k, QuantSpec(4, "signed", "max", 1.0, "sample", **sr), counter, 1024), 1),
        ("Hadamard(1024) alone (float32 out)", lambda: kernels.block_hadamard(x, -1, 1024), 1),
    ]


def quantizers_of(n_el: int, copy_bw):
    cases = quantizer_cases(n_el)
    mib = n_el * 4 >> 20
    for name, fn, reads in cases:
        t = cuda_time(graphed(fn), reps=20)
        write = 4 if "alone" in name else 1
        useful = n_el * (4 + write)
        moved = n_el * (4 * reads + write)
        row("quantize", f"{name}, {mib} MiB", t, "GB/s", useful / t / 1e9, "GB/s", baseline="of copy bw",
            ratio=useful / t / copy_bw, target=">= 0.6 of copy" if "alone" not in name else None,
            traffic_fraction=moved / t / copy_bw, passes=reads)


# ------------------------------------------------------------------------------------------------ steps


def training_step(model_name: str, scheme_name: str, backend: str, batch=128, path="eager"):
    """One SGD step (forward, cross-entropy, backward, update) as a function, after three warm-up steps. `path`:
    eager; graph, the forward and backward replayed from CUDA graphs (hdqt_cil.graph_replay, what
    trainer.cuda_graph=true runs); graph+compile, those graphs captured from torch.compile's step (what
    trainer.compile=true adds); torch.compile, the model under torch.compile(mode="reduce-overhead") (its own CUDA
    graphs), the best float path torch offers. Returns (step, the captured module or None)."""
    from hdqt_cil.models import build_model
    from hdqt_cil.quant import quantize_model
    from hdqt_cil.graph_replay import CapturedTraining

    torch.manual_seed(0)
    shape, classes = ((561,), 11) if model_name == "mlp" else ((3, 32, 32), 10)
    model = build_model(model_name, shape, classes).cuda()
    if scheme_name != "fp32":
        model = quantize_model(model, dataclasses.replace(preset(scheme_name), backend=backend))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    captured = CapturedTraining(model, compiled=path == "graph+compile") if path.startswith("graph") else None
    if captured is not None:
        call = captured
    else:
        call = torch.compile(model, mode="reduce-overhead") if path == "torch.compile" else model
    x = torch.randn(batch, *shape, device="cuda")
    y = torch.randint(0, classes, (batch,), device="cuda")

    def one():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(call(x), y).backward()
        optimizer.step()

    for _ in range(3):
        one()
    torch.cuda.synchronize()
    return one, captured


def step_time(model_name: str, scheme_name: str, backend: str, steps: int, batch=128, path="eager") -> float:
    """Median seconds of one training step (training_step)."""
    one, captured = training_step(model_name, scheme_name, backend, batch, path)
    seconds = median_seconds(one, torch.device("cuda"), steps, warmup=0)
    if captured is not None:
        captured.check()
    return seconds


def step_work(model_name: str, scheme_name: str, backend: str) -> dict:
    """Kernels launched, driver copies and fills, and device time of one eager step (torch profiler, two steps):
    what a captured step replays, without the host's gaps (an eager step's finite checks read the device: copies)."""
    one, _ = training_step(model_name, scheme_name, backend)
    kernels_launched, copies, device_seconds = device_work(one)
    return dict(kernels=kernels_launched, copies=copies, device_ms=device_seconds * 1e3)


@contextlib.contextmanager
def grad_input_unfused():
    """Convolutions' input gradients as the GEMM's (B, L, K) float rows and col2im, not col2im_int_matmul: the
    design it replaces, timed beside it."""
    fused = kernels.col2im_int_matmul

    def not_covered(*args, **kwargs):
        raise rt.NotCovered("timed unfused")
    kernels.col2im_int_matmul = not_covered
    try:
        yield
    finally:
        kernels.col2im_int_matmul = fused


@contextlib.contextmanager
def one_stream_backward():
    """Each layer's weight gradient after its input gradient on one stream (quant/streams.py), timed beside the two
    streams' backward."""
    streams.PARALLEL = False
    try:
        yield
    finally:
        streams.PARALLEL = True


def profile_steps(schemes: list[str], out: Path, model_name: str = "resnet32") -> None:
    """Where a step's device time goes: two eager steps by kernel, FP32 on torch and `schemes` on the kernels (the
    float formats: on the tensor cores, quant.backend=auto), each table also in out/profile_<model>_<scheme>.txt."""
    for scheme in ["fp32", *schemes]:
        backend = "torch" if scheme == "fp32" else "auto" if isinstance(preset(scheme), FloatScheme) else "cupy"
        one, _ = training_step(model_name, scheme, backend)
        print_device_profile(f"two eager {model_name} {scheme} steps", lambda: (one(), one()), rows=60,
                             path=Path(out) / f"profile_{model_name}_{scheme}.txt")


def tf32_off() -> None:
    """float32 matmuls and convolutions without TF32, for every step timed after this (FP32's baseline)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def fp32_steps(model_name: str, steps: int, **work) -> tuple[float, float]:
    """FP32's step eagerly (its row carries `work`) and from CUDA graphs: (eager, graphed) seconds."""
    fp32 = step_time(model_name, "fp32", "torch", steps)
    row("step", f"{model_name} fp32 (TF32 off)", fp32, "ms", fp32 * 1e3, "ms", **work)
    fp32_graph = step_time(model_name, "fp32", "torch", steps, path="graph")
    row("step", f"{model_name} fp32 (TF32 off), CUDA graph", fp32_graph, "x fp32", fp32_graph / fp32, "x fp32")
    return fp32, fp32_graph


def float_format_training_steps(steps: int) -> None:
    """FP32's steps and the float formats' (float_format_steps), TF32 off."""
    tf32_off()
    for model_name in ("resnet32", "mlp"):
        float_format_steps(model_name, steps, *fp32_steps(model_name, steps))


def training_steps(quick: bool):
    tf32_off()
    for model_name in ("resnet32", "mlp"):
        steps = 10 if quick else 30
        fp32_work = step_work(model_name, "fp32", "torch")
        fp32, fp32_graph = fp32_steps(model_name, steps, **fp32_work)
        fp32_graph_compiled = step_time(model_name, "fp32", "torch", steps, path="graph+compile")
        row("step", f"{model_name} fp32 (TF32 off), CUDA graph of the compiled step", fp32_graph_compiled, "x fp32",
            fp32_graph_compiled / fp32, "x fp32", baseline="vs fp32 CUDA graph", ratio=fp32_graph_compiled / fp32_graph)
        fp32_compiled = step_time(model_name, "fp32", "torch", steps, path="torch.compile")
        row("step", f"{model_name} fp32 (TF32 off), torch.compile", fp32_compiled, "x fp32", fp32_compiled / fp32,
            "x fp32")
        float_format_steps(model_name, steps, fp32, fp32_graph)
        for scheme in ("hdqt", "int4", "luq"):
            if quick and scheme != "hdqt":
                continue
            ref = step_time(model_name, scheme, "torch", max(3, steps // 5))
            row("step", f"{model_name} {scheme} torch reference", ref, "x fp32", ref / fp32, "x fp32")
            work = step_work(model_name, scheme, "cupy")
            fast = step_time(model_name, scheme, "cupy", steps)
            row("step", f"{model_name} {scheme} kernels", fast, "x fp32", fast / fp32, "x fp32",
                baseline="speedup vs reference", ratio=ref / fast, kernels_vs_fp32=work["kernels"] /
                fp32_work["kernels"], **work)
            graphed = step_time(model_name, scheme, "cupy", steps, path="graph")
            row("step", f"{model_name} {scheme} kernels, CUDA graph", graphed, "x fp32", graphed / fp32, "x fp32",
                baseline="vs fp32 CUDA graph", ratio=graphed / fp32_graph, vs_fp32_compiled=graphed / fp32_compiled,
                speedup_vs_reference=ref / graphed, target="<= 1.0x fp32 CUDA graph" if scheme == "hdqt" else None)
            if model_name == "resnet32":
                with one_stream_backward():
                    one_stream = step_time(model_name, scheme, "cupy", steps, path="graph")
                row("step", f"{model_name} {scheme} kernels, CUDA graph, backward on one stream", one_stream, "x fp32",
                    one_stream / fp32, "x fp32", baseline="vs fp32 CUDA graph", ratio=one_stream / fp32_graph,
                    vs_two_streams=one_stream / graphed)
                with grad_input_unfused():
                    work = step_work(model_name, scheme, "cupy")
                    unfused = step_time(model_name, scheme, "cupy", steps, path="graph")
                row("step", f"{model_name} {scheme} kernels, CUDA graph, g_x as GEMM rows + col2im", unfused, "x fp32",
                    unfused / fp32, "x fp32", baseline="vs fp32 CUDA graph", ratio=unfused / fp32_graph, **work)


def float_format_steps(model_name: str, steps: int, fp32: float, fp32_graph: float) -> None:
    """The float formats' steps from CUDA graphs on their torch reference and on the tensor cores (fp8: the FP8
    ones, mxfp4 and nvfp4: the int8 ones; fp, the authors' quantizer: its rounding kernels, the tile sums' products
    float32 matmuls as in the reference), against FP32's."""
    cases = [("fp8", "FP8 tensor cores")] if has_fp8_tensor_cores() else []
    cases += [("mxfp4", "int8 tensor cores"), ("nvfp4", "int8 tensor cores"), ("fp", "authors' rounding kernels")]
    for scheme, label in cases:
        for backend, on in (("torch", "torch reference"), ("auto", label)):
            graphed = step_time(model_name, scheme, backend, steps, path="graph")
            row("step", f"{model_name} {scheme} on the {on}, CUDA graph", graphed, "x fp32", graphed / fp32,
                "x fp32", baseline="vs fp32 CUDA graph", ratio=graphed / fp32_graph)


def repeat_case(spec: str, times: int = 3) -> None:
    """Run one case a few times, untimed, for a profiler to attach to (scripts/gpu_check.sh NCU_CASES):
    'gemm:CONFIG:SAT' (the 4096^3 product, intmm.cu's saturation mode) or 'quantize:NAME' (the first 128 MiB
    quantizer row whose name, spaces written as '_', starts with NAME)."""
    kind, _, what = spec.partition(":")
    if kind == "gemm":
        config, sat = what.split(":")
        tile, acc = (32, 8) if int(sat) in (2, 4) else (None, None)
        a = torch.randint(-7, 8, (4096, 4096), device="cuda", dtype=torch.int8)
        b = torch.randint(0, 16, (4096, 4096), device="cuda", dtype=torch.int8).t()

        def fn():
            kernels.tiled_int_matmul(a, b, tile, acc, (7, 15), False, config=config, packed=int(sat) == 4)
    elif kind == "quantize":
        fn = next(call for name, call, _ in quantizer_cases(1 << 25) if name.replace(" ", "_").startswith(what))
    else:
        raise SystemExit(f"unknown case kind {kind!r} in {spec!r}: use gemm:CONFIG:SAT or quantize:NAME")
    for _ in range(times):
        fn()
    torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/bench")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    parser.add_argument("--skip-steps", action="store_true", help="no training-step timings")
    parser.add_argument("--steps-only", action="store_true", help="only the training-step timings")
    parser.add_argument("--quantize-only", action="store_true", help="only the copy bandwidth and the quantizers")
    parser.add_argument("--formats-only", action="store_true", help="only the float formats' products at 4096^3 "
                        "against bf16 and their training steps against FP32's")
    parser.add_argument("--profile-steps", nargs="*", metavar="SCHEME", help="print the device time of a "
                        "ResNet-32 step by kernel (FP32 and these schemes, eager; none named: hdqt)")
    parser.add_argument("--repeat-case", metavar="CASE", help="only run CASE three times, for a profiler "
                        "(gemm:CONFIG:SAT or quantize:NAME)")
    args = parser.parse_args()
    if not kernels.available():
        sys.exit(f"kernels unavailable: {kernels.unavailable_reason()}")
    if args.repeat_case:
        return repeat_case(args.repeat_case)
    import cupy

    props = torch.cuda.get_device_properties(0)
    device = torch.cuda.get_device_name(0)
    header = (f"device {device}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
              f"cupy {cupy.__version__}, CUDA {torch.version.cuda}")
    print(header, flush=True)
    started = time.time()
    if args.quantize_only:
        quantizers(copy_bandwidth(args.quick), args.quick)
    elif args.formats_only:
        float_format_gemms(bf16_matmul_rate())
        float_format_training_steps(10 if args.quick else 30)
    elif not args.steps_only:
        copy_bw, bf16_rate, peak, clamped_peak = ceilings(args.quick)
        gemm_4096(bf16_rate, peak, clamped_peak)
        gemm_batch_summed(bf16_rate)
        layers(args.quick)
        quantizers(copy_bw, args.quick)
    if not (args.skip_steps or args.quantize_only or args.formats_only):
        training_steps(args.quick)
    if args.profile_steps is not None:
        profile_steps(args.profile_steps or ["hdqt"], args.out)

    path = save_rows(args.out, "bench_kernels", device, header, started, ROWS)
    print(f"\n{header}\n")
    print("| group | case | time ms | value | unit | ratio | vs | target | kernels | device ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in ROWS:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        print(f"| {r['group']} | {r['name'].strip()} | {r['seconds'] * 1e3:.4f} | {r['value']:.1f} | {r['unit']} | "
              f"{ratio} | {r['baseline'] or ''} | {r['target'] or ''} | {r.get('kernels', '')} | "
              f"{'' if 'device_ms' not in r else round(r['device_ms'], 2)} |")
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()
