"""Which of a scheme's roundings costs the gradients: one training batch's gradient fidelity to the float shadow
(cosine, per layer, as `diagnostics=light` records it) under the scheme and under variants of its settings, at the
model's initial weights, without training.

    python -m scripts.fidelity_probe [overrides...] [--vary "OVERRIDES"]... [--batch 128]

The overrides compose the run as `python run.py` would (`+experiment=cifar10_paper quant=fp benchmark.root=...`);
each `--vary` adds its own space-separated overrides of the scheme to them (`--vary "quant.acc=none"`, `--vary
quant=mxfp4`) and is one more row. Every row quantizes the same model (seeded by the run's seed) and takes the same
batch of the first experience's training set, so the rows differ by their settings alone. G is the cross-entropy's
gradient at the quantized model's logits. Prints a markdown table: the logits' cosine and the weight gradients'
cosine of the first layer, of the layers between in three equal parts by depth, and of the last; the input
gradients' mean cosine.
"""
import argparse
import contextlib
import copy
import shlex
import sys

import numpy as np
import torch
import torch.nn.functional as F
from hydra.errors import HydraException
from torch.utils.data import DataLoader

from hdqt_cil.benchmarks import build_benchmark
from hdqt_cil.config import compose_command, register_schemas, validate
from hdqt_cil.experiment import resolve_device
from hdqt_cil.models import build_model
from hdqt_cil.quant import quantize_model, scheme_from_config
from hdqt_cil.trainer.diagnostics import diagnose_batch
from hdqt_cil.wording import help_description

COLUMNS = ["logits", "g_W first", "g_W early", "g_W middle", "g_W late", "g_W last", "g_x mean"]


def composed(overrides: list[str]):
    """The run's config from `overrides`, checked as a run checks it (a misspelt key named with its nearest)."""
    cfg = compose_command(overrides)
    validate(cfg)
    return cfg


def first_batch(cfg, size: int, device: torch.device):
    """`size` samples of the first experience's training set, drawn by the run's seed."""
    bench = build_benchmark(cfg.benchmark, cfg.seed)
    dataset = bench.scenario.train_stream[0].dataset
    loader = DataLoader(dataset, batch_size=size, shuffle=True, generator=torch.Generator().manual_seed(cfg.seed),
                        collate_fn=getattr(dataset, "collate_fn", None))
    x, y, *_ = next(iter(loader))
    return bench, x.to(device), y.to(device)


def _cosine(record: dict, layer: str, kind: str) -> float:
    return record["layers"][layer].get(kind, {}).get("all", {}).get("cosine", float("nan"))


def row(record: dict) -> list[float]:
    """COLUMNS of a diagnose_batch record."""
    layers = list(record["layers"])
    parts = np.array_split(np.array(layers[1:-1], dtype=object), 3) if len(layers) > 2 else [[], [], []]
    g_w = [float(np.mean([_cosine(record, name, "g_W") for name in part])) if len(part) else float("nan")
           for part in parts]
    g_x = [c for c in (_cosine(record, name, "g_x") for name in layers) if c == c]  # the first layer has none
    return [record["logits"]["all"]["cosine"], _cosine(record, layers[0], "g_W"), *g_w,
            _cosine(record, layers[-1], "g_W"), float(np.mean(g_x)) if g_x else float("nan")]


def probe(overrides: list[str], variants: list[str], batch: int) -> tuple[int, list[tuple[str, list[float]]]]:
    """The batch's size (`batch`, or the first experience's where it holds fewer) and (settings, COLUMNS) for the
    composed run and each variant of it."""
    register_schemas()
    cfg = composed(overrides)
    settings = [("as given", cfg)] + [(variant, composed(overrides + shlex.split(variant))) for variant in variants]
    for variant, changed in settings[1:]:
        others = [key for key in cfg if key != "quant" and cfg[key] != changed[key]]
        if others:
            raise ValueError(f"--vary {variant!r} changes {', '.join(others)}: a variant changes the scheme's "
                             f"settings (quant.*, quant=...) alone, on the same model and batch")
    device = resolve_device(cfg.trainer.device)
    bench, x, y = first_batch(cfg, batch, device)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, bench.input_shape, bench.num_classes, bench.input_norm).to(device).train()
    rows = []
    for name, variant in settings:
        quantized = quantize_model(copy.deepcopy(model), scheme_from_config(variant.quant))
        logits = quantized(x)
        g, = torch.autograd.grad(F.cross_entropy(logits, y), logits)
        rows.append((name, row(diagnose_batch(quantized, x, g, cfg.seed))))
    return len(y), rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--vary", action="append", default=[], metavar="OVERRIDES")
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_intermixed_args(argv)
    if args.batch < 2:
        raise SystemExit(f"error: --batch {args.batch}: a batch of at least 2 samples (BatchNorm's statistics)")
    try:
        with contextlib.redirect_stdout(sys.stderr):  # avalanche prints as it builds; stdout is the table
            size, rows = probe(args.overrides, args.vary, args.batch)
    except (ValueError, FileNotFoundError, HydraException) as error:
        raise SystemExit(f"error: {error}")
    whole = f" (the first experience's whole training set: fewer than --batch {args.batch})" if size < args.batch \
        else ""
    print(f"Gradient fidelity to the float shadow, one batch of {size}{whole} at initialisation: "
          f"`{' '.join(args.overrides)}`\n")
    print("| settings | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for name, values in rows:
        print(f"| {name} | " + " | ".join("–" if v != v else f"{v:.3f}" for v in values) + " |")


if __name__ == "__main__":
    main()
