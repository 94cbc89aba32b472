"""quant=hot against float training: backward time, training-step time, peak memory, bytes saved for the backward.

    python -m scripts.bench.hot                     # on the GPU machine
    python -m scripts.bench.hot --quick             # tiny sizes, any device (a smoke check; its times mean nothing)
    python -m scripts.bench.hot --backends auto torch   # HOT with the kernels and with the torch reference
    python -m scripts.bench.hot --profile           # also: where HOT's backward / step spends its device time

Cases (one table at the end, every number in OUT/hot_<device>.json):
- vit-linear: a ViT-B-size Linear stack, 12 blocks of LayerNorm → qkv (768→2304, q+k+v summed: no attention
  matmuls) → proj (768→768) → residual → LayerNorm → fc1 (768→3072) → GELU → fc2 (3072→768) → residual, tokens 197,
  batch 64. Backward time (loss.backward() only, after an untimed forward) under fp32 (TF32 off), bf16 autocast
  and HOT (backend per --backends; LQS calibrated on one batch first); fp32 and HOT also with the forward and
  backward replayed from CUDA graphs.
- resnet32 (CIFAR shape, batch 128) and resnet18 (torchvision's, 224×224, 100 classes, batch 64): one training step
  (forward, backward, SGD) under fp32 (TF32 off), bf16 autocast, HOT (quant.abc=true: the ReLUs, max pools and
  BatchNorms keep compact copies, quant/compact.py; k×k convs unfold a slice of samples at a time), HOT with
  quant.sliced_unfold=false (the whole batch unfolded at once) and HOT with quant.abc=columns (every conv keeps its
  compressed im2col matrix, the neighbours their floats); for ResNet-18 on the GPU also the largest batch whose
  step fits --budget-gib (8). fp32 and HOT also with the forward and backward replayed from CUDA graphs
  (hdqt_cil.graph_replay, trainer.cuda_graph).
- memory: per case, peak torch.cuda.max_memory_allocated during a step minus what was allocated before it (model,
  optimizer state, the batch); and bytes saved for the backward per quantized layer kind (saved_tensors_hooks,
  parameters left out), summed over the model, and all that the forward saves with each storage counted once
  ('distinct': the memory really held; a conv whose input a ReLU saved as its output adds nothing in fp32, while
  HOT's compressed copy comes on top). Under bf16 autocast the bf16 copies of the weights are saved tensors too.
Times are medians of --reps after --warmup runs, CUDA events on the GPU. On the GPU each timed variant also gets
the kernels it launches and their device time per backward / step (two eager calls under torch.profiler).
"""
import argparse
import time
from collections import defaultdict
from contextlib import nullcontext

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from hdqt_cil.graph_replay import CapturedTraining
from hdqt_cil.models import build_model
from hdqt_cil.quant import calibrate_lqs, lqs_choices, preset, quantize_model
from hdqt_cil.quant.hot import hot_layers
from hdqt_cil.quant.backend import resolve_ops
from scripts.bench.record import device_work, save_rows
from scripts.bench.timing import median_seconds

ROWS = []


class Block(nn.Module):
    """A ViT-B encoder block without its attention matmuls: q, k and v are summed instead."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.act = nn.GELU()

    def forward(self, x):
        h = self.qkv(self.norm1(x)).unflatten(-1, (3, -1)).sum(-2)
        x = x + self.proj(h)
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


def linear_stack(blocks: int, width: int, hidden: int) -> nn.Module:
    return nn.Sequential(*[Block(width, hidden) for _ in range(blocks)])


def peak_bytes(step, device) -> int | None:
    """Peak allocated bytes during one step(), above what was allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def saved_bytes(model: nn.Module, forward) -> dict[str, int]:
    """Bytes of memory saved for the backward during forward(), by layer kind ('qkv', 'fc1', 'conv 3x3', ...):
    each storage a saved tensor lies in (padding included) once per kind, the model's parameters left out;
    tensors saved outside a Linear/Conv2d (norms, activations) count as 'other'. 'distinct' counts each storage
    once in all (a conv's input that a ReLU saved as its output is counted under both kinds but once here)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    current, by_kind = [], defaultdict(dict)
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            if isinstance(module, nn.Conv2d):
                kind = f"conv {module.kernel_size[0]}x{module.kernel_size[1]}"
            else:
                kind = name.rsplit(".", 1)[-1] if not name.endswith("classifier") else "classifier"
            hooks.append(module.register_forward_pre_hook(lambda m, a, kind=kind: current.append(kind)))
            hooks.append(module.register_forward_hook(lambda m, a, out: None if current.pop() else None))

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            by_kind[current[-1] if current else "other"][storage.data_ptr()] = storage.nbytes()
        return t
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = forward()
        del out
    finally:
        for hook in hooks:
            hook.remove()
    distinct = {ptr: size for sizes in by_kind.values() for ptr, size in sizes.items()}
    return {**{kind: sum(sizes.values()) for kind, sizes in by_kind.items()}, "distinct": sum(distinct.values())}


def row(case, variant, metric, value, unit, ratio=None, vs=""):
    ROWS.append({"case": case, "variant": variant, "metric": metric, "value": value, "unit": unit,
                 "ratio": ratio, "vs": vs})
    shown = f"{value:.4g}" if isinstance(value, float) else str(value)
    print(f"  {case:10s} {variant:28s} {metric:28s} {shown:>12s} {unit}"
          + (f"  ({ratio:.2f}x {vs})" if ratio is not None else ""), flush=True)


def _hot(backend: str, **settings):
    import dataclasses
    return dataclasses.replace(preset("hot"), backend=backend, **settings)


def vit_linear(args, device):
    case = "vit-linear"
    torch.manual_seed(0)
    base = linear_stack(args.blocks, args.width, args.hidden).to(device)
    x = torch.randn(args.batch, args.tokens, args.width, device=device)
    target = torch.randn_like(x)

    def loss_fn(out, t):
        return (out * t).mean()

    variants = [("fp32", None, False), ("bf16 autocast", None, True)]
    variants += [(f"hot[{b}]", b, False) for b in args.backends]
    reference = None
    fp32_saved = None
    for label, backend, bf16 in variants:
        model = linear_stack(args.blocks, args.width, args.hidden).to(device)
        model.load_state_dict(base.state_dict())
        if backend is not None:
            quantize_model(model, _hot(backend))
            calibrate_lqs(model, x, target, loss_fn)
            per_token, layers = _lqs_row(model)
            row(case, label, "LQS per-token layers", per_token, f"{layers} (ops: {resolve_ops(backend, device).name})")
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()

        def forward(model=model):  # bound now: the loop deletes `model` before the next variant
            with autocast:
                return loss_fn(model(x), target)

        def backward(loss, model=model):
            loss.backward()
            model.zero_grad(set_to_none=True)

        seconds = median_seconds(backward, device, args.reps, args.warmup, setup=forward)
        forward_s = median_seconds(forward, device, args.reps, args.warmup)
        if reference is None:
            reference = seconds
        row(case, label, "backward", seconds * 1e3, "ms", reference / seconds, "speedup vs fp32")
        if device.type == "cuda":
            work_rows(case, label, "forward and backward", lambda: backward(forward()),
                      args.profile and backend is not None)
        row(case, label, "forward", forward_s * 1e3, "ms")
        if device.type == "cuda" and not bf16:  # the same passes replayed from CUDA graphs (trainer.cuda_graph)
            captured = CapturedTraining(model)
            graphed = median_seconds(backward, device, args.reps, args.warmup,
                                     setup=lambda: loss_fn(captured(x), target))
            captured.check()
            captured.release()
            row(case, label, "backward, CUDA graph", graphed * 1e3, "ms", reference / graphed, "speedup vs fp32")
        peak = peak_bytes(lambda: backward(forward()), device)
        if peak is not None:
            row(case, label, "peak memory of a step", peak / 2**20, "MiB")
        saved = saved_bytes(model, forward)
        linear_total = sum(v for k, v in saved.items() if k not in ("other", "distinct"))
        if fp32_saved is None:
            fp32_saved = (saved, linear_total)
        for kind in ("qkv", "proj", "fc1", "fc2"):
            value = saved.get(kind, 0)
            row(case, label, f"saved by {kind} (all blocks)", value / 2**20, "MiB",
                value / fp32_saved[0][kind] if fp32_saved[0].get(kind) else None, "of fp32")
        row(case, label, "saved by the Linears", linear_total / 2**20, "MiB", linear_total / fp32_saved[1], "of fp32")
        row(case, label, "saved in all (distinct)", saved["distinct"] / 2**20, "MiB",
            saved["distinct"] / fp32_saved[0]["distinct"], "of fp32")
        del model


def work_rows(case: str, label: str, what: str, call, profile: bool) -> None:
    """Rows of the kernels launched and the device time per call, and with `profile` their breakdown by kernel."""
    kernels, copies, seconds = device_work(call, profile_title=f"two calls of a {what}, {case} {label}" if profile
                                           else None)
    row(case, label, f"kernels launched a {what}", kernels, "kernels")
    row(case, label, f"driver copies and fills a {what}", copies, "operations")
    row(case, label, f"device time of a {what}", seconds * 1e3, "ms")


CNNS = {  # case: (model builder, input shape, classes, batch argument)
    "resnet32": (lambda shape, classes: build_model("resnet32", shape, classes), (3, 32, 32), 10, "resnet_batch"),
    "resnet18": (lambda shape, classes: torchvision.models.resnet18(num_classes=classes), (3, 224, 224), 100,
                 "resnet18_batch"),
}


def cnn(case, args, device):
    """One training step (forward, backward, SGD) of a convnet under fp32 (TF32 off), bf16 autocast, HOT
    (abc=true: compact neighbours, sliced unfolding), HOT unfolding the whole batch at once and HOT with
    abc=columns (every conv keeps its compressed im2col matrix); eager and, on the GPU, replayed from CUDA graphs
    (hdqt_cil.graph_replay, trainer.cuda_graph)."""
    build, shape, classes, batch_arg = CNNS[case]
    batch = getattr(args, batch_arg)
    reference, fp32_saved = None, None
    variants = [("fp32", None, {}, False), ("bf16 autocast", None, {}, True)]
    variants += [(f"hot[{b}]", b, {}, False) for b in args.backends]
    variants += [(f"hot[{args.backends[0]}] {key}={value}", args.backends[0], {key: value}, False)
                 for key, value in (("sliced_unfold", False), ("abc", "columns"))]
    for label, backend, settings, bf16 in variants:
        make_step, model = _cnn_step(build, shape, classes, backend, settings, bf16, device)
        step = make_step(batch)
        captured = CapturedTraining(model) if device.type == "cuda" and not bf16 else None
        if backend is not None:
            row(case, label, "LQS per-token layers", *_lqs_row(model))
        seconds = median_seconds(step, device, args.reps, args.warmup)
        reference = reference or seconds
        row(case, label, "training step", seconds * 1e3, "ms", reference / seconds, "speedup vs fp32")
        if device.type == "cuda":
            work_rows(case, label, "training step", step, args.profile and backend is not None and not settings)
        if captured is not None:
            graphed = median_seconds(lambda step=step: step(captured), device, args.reps, args.warmup)
            captured.check()
            captured.release()
            row(case, label, "training step, CUDA graph", graphed * 1e3, "ms", reference / graphed,
                "speedup vs fp32")
        peak = peak_bytes(step, device)
        if peak is not None:
            row(case, label, "peak memory of a step", peak / 2**20, "MiB")
        saved = saved_bytes(model, step.forward)
        fp32_saved = fp32_saved or saved
        for kind in sorted(k for k in fp32_saved if k not in ("other", "distinct")):
            value = saved.get(kind, 0)
            row(case, label, f"saved by {kind} layers", value / 2**20, "MiB", value / fp32_saved[kind], "of fp32")
        row(case, label, "saved in all (distinct)", saved["distinct"] / 2**20, "MiB",
            saved["distinct"] / fp32_saved["distinct"], "of fp32")
        if case == "resnet18" and device.type == "cuda" and "abc" not in settings:
            fits = largest_batch(make_step, args.budget_gib * 2**30, device)
            row(case, label, f"largest batch in {args.budget_gib:g} GiB", fits, "samples")
        del model, step


def _cnn_step(build, shape, classes, backend, settings, bf16, device):
    """(make_step(batch) → step(call=model), model) for one variant: the model and its optimizer made once, a
    batch per make_step; step.forward is its loss alone."""
    torch.manual_seed(0)
    model = build(shape, classes).to(device)
    if backend is not None:
        quantize_model(model, _hot(backend, **settings))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()

    def make_step(batch):
        g = torch.Generator(device=device).manual_seed(1)
        x = torch.randn(batch, *shape, generator=g, device=device)
        y = torch.randint(0, classes, (batch,), generator=g, device=device)
        if backend is not None and not any(m.lqs_calibrated for _, m in hot_layers(model)):
            calibrate_lqs(model, x, y, F.cross_entropy)

        def forward(call=model):
            with autocast:
                return F.cross_entropy(call(x), y)

        def step(call=model):
            optimizer.zero_grad(set_to_none=True)
            forward(call).backward()
            optimizer.step()
        step.forward = forward
        return step
    return make_step, model


def _lqs_row(model):
    choices = lqs_choices(model)
    return sum(choice == "token" for choice in choices.values()), f"of {len(choices)}"


def largest_batch(make_step, budget: int, device) -> int:
    """The largest batch whose training step keeps torch.cuda.max_memory_allocated (model, optimizer state and
    batch included) within `budget` bytes: doubling, then bisection."""
    def fits(batch: int) -> bool:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            make_step(batch)()
            torch.cuda.synchronize(device)
            return torch.cuda.max_memory_allocated(device) <= budget
        except torch.cuda.OutOfMemoryError:
            return False
    low, high = 0, 1
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="results/bench", help="folder of hot_<device>.json")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: checks that it runs")
    parser.add_argument("--backends", nargs="+", default=["auto"], choices=["auto", "torch", "cupy"],
                        help="quant.backend of the HOT variants")
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=197)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--hidden", type=int, default=3072)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--resnet-batch", type=int, default=128)
    parser.add_argument("--resnet18-batch", type=int, default=64)
    parser.add_argument("--budget-gib", type=float, default=8.0, help="memory budget of the largest-batch search")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[], choices=["vit-linear", *CNNS])
    parser.add_argument("--profile", action="store_true", help="print HOT's kernel breakdown per case")
    args = parser.parse_args()
    if args.quick:
        args.blocks, args.batch, args.resnet_batch, args.resnet18_batch, args.reps, args.warmup = 1, 2, 4, 2, 1, 1
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is fp32 (and the HOT reference's float products too)
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    header = (f"device {name}, torch {torch.__version__}, TF32 off, ViT stack {args.blocks} blocks × "
              f"(tokens {args.tokens}, width {args.width}, MLP {args.hidden}) batch {args.batch}, ResNet-32 batch "
              f"{args.resnet_batch}, ResNet-18 (224×224) batch {args.resnet18_batch}, median of {args.reps} after "
              f"{args.warmup} warm-up"
              + (" (--quick: sizes reduced)" if args.quick else ""))
    print(header, flush=True)
    started = time.time()
    if "vit-linear" not in args.skip:
        vit_linear(args, device)
    for case in CNNS:
        if case not in args.skip:
            cnn(case, args, device)

    path = save_rows(args.out, "hot", name, header, started, ROWS)
    print(f"\n{header}\n")
    print("| case | variant | metric | value | unit | ratio | vs |")
    print("|---|---|---|---|---|---|---|")
    for r in ROWS:
        value = f"{r['value']:.4g}" if isinstance(r["value"], float) else str(r["value"])
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}x"
        print(f"| {r['case']} | {r['variant']} | {r['metric']} | {value} | {r['unit']} | {ratio} | {r['vs']} |")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
