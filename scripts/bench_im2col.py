"""How close torch's im2col copies come to the copy-bandwidth floor: QuantConv2d._forward_rows ((B·L, K) rows, the
forward product's left operand) and _input_columns ((B, K, L), grad_weight's) on ResNet-32's conv shapes at batch 128,
int8 levels and float32, timed eagerly (host work included: F.pad, unfold, permute and one copy each call).

    python scripts/bench_im2col.py > results/bench/<version>_im2col.log      # on the GPU machine
"""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import copy_bandwidth, cuda_time  # noqa: E402 (the benchmark's timing, beside this script)
from hdqt_cil.quant.layers import QuantConv2d  # noqa: E402

SHAPES = ((16, 16, 32, 1), (16, 32, 32, 2), (32, 32, 16, 1), (64, 64, 8, 1))  # in, out, height = width, stride


def main():
    print(torch.cuda.get_device_name(0))
    bandwidth = copy_bandwidth(quick=False)
    for c_in, c_out, size, stride in SHAPES:
        conv = QuantConv2d.__new__(QuantConv2d)  # only the im2col geometry is used: no scheme needed
        nn.Conv2d.__init__(conv, c_in, c_out, 3, stride=stride, padding=1, bias=False)
        for dtype in (torch.int8, torch.float32):
            x = (torch.randn(128, c_in, size, size, device="cuda") * 4).to(dtype)
            for name in ("_forward_rows", "_input_columns"):
                fn = getattr(conv, name)
                out = fn(x)
                sec = cuda_time(lambda: fn(x), reps=50)
                moved = out.numel() * out.element_size() + x.numel() * x.element_size()
                print(f"{name:15s} {str(dtype):13s} {tuple(x.shape)} -> {tuple(out.shape)}: {sec * 1e6:7.1f} us, "
                      f"{moved / sec / bandwidth:.2f} of copy (floor {moved / bandwidth * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
