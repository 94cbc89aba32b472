"""The one-launch per-tensor quantizer (quant.cu resident_*) over its two knobs, on the GPU, one table:
the L2 prefetch distance (kernels.RESIDENT_AHEAD) and the shared-memory steps a CTA keeps (fewer: more streamed).

    python scripts/sweep_resident.py [--ahead 0 2 4 8] [--slots 3 2 0]
"""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_kernels import copy_bandwidth, cuda_time, graphed  # noqa: E402
from hdqt_cil import kernels  # noqa: E402
from hdqt_cil.kernels import _runtime as rt  # noqa: E402
from hdqt_cil.quant import QuantSpec  # noqa: E402
from hdqt_cil.quant.rounding import Counter  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ahead", type=int, nargs="*", default=[0, 2, 4, 8])
    parser.add_argument("--slots", type=int, nargs="*", default=[3, 2, 0])
    args = parser.parse_args()
    copy_bw = copy_bandwidth(False)
    specs = {"nearest": (QuantSpec(4, "auto", "max", 0.975), None),
             "stochastic": (QuantSpec(4, "signed", "max", 1.0, "tensor", "stochastic"), Counter(1, 2, 3))}
    step_bytes = 16384 * 4
    optin = rt.max_shared_memory
    print("| MiB | rounding | slots | ahead | us | of copy |\n|---|---|---|---|---|---|")
    for n_el in (1 << 24, 1 << 25):
        x = torch.randn(n_el // 1024, 1024, device="cuda")
        for name, (spec, counter) in specs.items():
            for slots in args.slots:
                rt.max_shared_memory = lambda s=slots: s * step_bytes + 1024
                for ahead in args.ahead:
                    kernels.RESIDENT_AHEAD = ahead
                    t = cuda_time(graphed(lambda: kernels.quantize(x, spec, counter)), reps=20)
                    print(f"| {n_el * 4 >> 20} | {name} | {slots} | {ahead} | {t * 1e6:.1f} | "
                          f"{n_el * 5 / t / copy_bw:.3f} |", flush=True)
                rt.max_shared_memory = optin


if __name__ == "__main__":
    main()
