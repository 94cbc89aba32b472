"""im2col and col2im through torch (the references: a strided view of the padded input and one copy; kh·kw
strided adds) against the kernels (im2col.cu), on ResNet-32's conv shapes at batch 128: im2col in both layouts
((B, L, K) rows for the forward product, (B, K, L) columns for grad_weight's) on int8 levels and float32, col2im on
float32 rows; eagerly (host work included) and replayed from a CUDA graph of 20 calls (device time, as in a
captured training step), against the copy-bandwidth floor.

    python -m scripts.bench.im2col > results/bench/im2col_h100.log      # on the GPU machine (here an H100)
"""
import torch

from hdqt_cil.quant import col2im, im2col
from hdqt_cil.quant.backend import KERNEL_OPS
from scripts.bench.kernels import copy_bandwidth
from scripts.bench.timing import cuda_time, graphed

SHAPES = ((3, 32, 1), (16, 32, 1), (16, 32, 2), (32, 16, 1), (32, 16, 2), (64, 8, 1))  # channels, size, stride
CALLS_PER_GRAPH = 20


def times(fn) -> tuple[float, float]:
    """(eager, graphed) seconds per call."""
    replay = graphed(lambda: [fn() for _ in range(CALLS_PER_GRAPH)])
    return cuda_time(fn, reps=50), cuda_time(replay, reps=10) / CALLS_PER_GRAPH


def main():
    print(torch.cuda.get_device_name(0))
    bandwidth = copy_bandwidth(quick=False)
    print(f"{'layout':7s} {'dtype':13s} {'input':18s} {'output':17s} {'floor us':>8s} | {'torch eager':>11s} "
          f"{'graphed':>8s} | {'kernel eager':>12s} {'graphed':>8s} | graphed: kernel speedup, of copy")
    for channels, size, stride in SHAPES:
        layout = ((3, 3), (1, 1), (1, 1), (stride, stride))
        for dtype in (torch.int8, torch.float32):
            x = (torch.randn(128, channels, size, size, device="cuda") * 4).to(dtype)
            for columns in (False, True):
                ref = im2col(x, *layout, columns)
                assert torch.equal(KERNEL_OPS.im2col(x, *layout, columns), ref)
                report("columns" if columns else "rows", str(dtype), x, ref, bandwidth,
                       times(lambda: im2col(x, *layout, columns)),
                       times(lambda: KERNEL_OPS.im2col(x, *layout, columns)))
        rows = torch.randn(im2col(x, *layout).shape, device="cuda")  # col2im: float rows back to the input's shape
        grad = col2im(rows, x.shape, *layout)
        assert torch.equal(KERNEL_OPS.col2im(rows, x.shape, *layout), grad)
        report("col2im", "torch.float32", rows, grad, bandwidth, times(lambda: col2im(rows, x.shape, *layout)),
               times(lambda: KERNEL_OPS.col2im(rows, x.shape, *layout)))


def report(name, dtype, source, result, bandwidth, torch_times, kernel_times):
    (ref_eager, ref_graph), (ker_eager, ker_graph) = torch_times, kernel_times
    floor = (result.numel() * result.element_size() + source.numel() * source.element_size()) / bandwidth
    print(f"{name:7s} {dtype:13s} {str(tuple(source.shape)):18s} {str(tuple(result.shape)):17s} {floor * 1e6:8.1f} | "
          f"{ref_eager * 1e6:11.1f} {ref_graph * 1e6:8.1f} | {ker_eager * 1e6:12.1f} {ker_graph * 1e6:8.1f} | "
          f"{ref_graph / ker_graph:5.1f}x, {floor / ker_graph:.2f} (torch {floor / ref_graph:.2f})")


if __name__ == "__main__":
    main()
