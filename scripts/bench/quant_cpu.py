"""Time one training step (forward, backward, SGD) per quantization scheme, torch reference arithmetic.

    python -m scripts.bench.quant_cpu                 # the CPU table: MLP 561-561-561-11 and ResNet-32, batch 128
    python -m scripts.bench.quant_cpu --device cuda   # the same on a GPU (the torch reference, not the CuPy kernels)

Each cell is the median of --steps timed steps after one warm-up step; the ratio is against fp32.
"""
import argparse

import torch
import torch.nn.functional as F

from hdqt_cil.models import build_model
from hdqt_cil.quant import preset, quantize_model
from scripts.bench.timing import median_seconds

SCHEMES = ("fp32", "hdqt", "int4", "luq")
MODELS = {"mlp": ((561,), 11), "resnet32": ((3, 32, 32), 100)}


def step_seconds(model_name: str, scheme: str, batch: int, steps: int, device: torch.device) -> float:
    torch.manual_seed(0)
    input_shape, classes = MODELS[model_name]
    model = quantize_model(build_model(model_name, input_shape, classes), preset(scheme)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, *input_shape, device=device), torch.randint(0, classes, (batch,), device=device)

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return median_seconds(step, device, steps, warmup=1)  # the first step warms up allocators and kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, nargs=2, default=(10, 2), metavar=("MLP", "RESNET"),
                        help="timed steps for the MLP and for ResNet-32")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch}")
    print("| model | " + " | ".join(f"{s} s/step" for s in SCHEMES) + " | " +
          " | ".join(f"{s}/fp32" for s in SCHEMES[1:]) + " |")
    print("|---" * (2 * len(SCHEMES)) + "|")
    for model_name, steps in zip(MODELS, args.steps):
        seconds = [step_seconds(model_name, scheme, args.batch, steps, device) for scheme in SCHEMES]
        print(f"| {model_name} | " + " | ".join(f"{s:.4f}" for s in seconds) + " | " +
              " | ".join(f"{s / seconds[0]:.1f}x" for s in seconds[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
