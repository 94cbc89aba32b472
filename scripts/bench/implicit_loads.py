"""Would an implicit-GEMM convolution pay? The int8 GEMM's A tiles of a ResNet-32 convolution (batch 128) loaded
from the im2col rows that im2col.cu writes (im2col + the tile loads: today's forward) against the same tiles
gathered from the int8 activation inside the loading kernel (implicit_loads.cu), both folded into the same
checksum; the gathered tiles are first checked equal to im2col's rows.

    python -m scripts.bench.implicit_loads

Prints, per convolution shape, the device time of im2col, of the row tiles' loads and of the gathered loads (20
launches replayed from a CUDA graph), and gathered / (im2col + rows): below 1, the gather saves what it costs.
"""
from pathlib import Path

import torch

from hdqt_cil import kernels
from hdqt_cil.kernels import runtime as rt
from scripts.bench.timing import cuda_time, graphed

SOURCE = str(Path(__file__).resolve().parent / "implicit_loads.cu")
BM = 128
# (channels, height and width, stride) of ResNet-32's 3x3 convolutions after the stem, batch 128
SHAPES = ((16, 32, 1), (16, 32, 2), (32, 16, 1), (32, 16, 2), (64, 8, 1))
BATCH = 128


def _device_seconds(fn, launches: int = 20) -> float:
    """Device seconds per call of fn(): `launches` calls replayed from one CUDA graph (the host's launch work, as
    long as these kernels, left out)."""
    replay = graphed(lambda: [fn() for _ in range(launches)])
    return cuda_time(replay, reps=10) / launches


def _checksum(launch) -> int:
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    launch(out)
    return int(out.item())


def main() -> None:
    if not kernels.available():
        raise SystemExit(f"needs the kernels on a GPU: {kernels.unavailable_reason()}")
    print(f"{'C':>3} {'HxW':>6} {'s':>2} {'M':>7} {'K':>4}  {'im2col ms':>9} {'rows ms':>8} {'gathered ms':>11} "
          f"{'gathered / (im2col + rows)':>26}")
    for channels, size, stride in SHAPES:
        x = torch.randint(-8, 8, (BATCH, channels, size, size), dtype=torch.int8, device="cuda")
        out_size = ((size + 2 - 3) // stride + 1,) * 2
        m, k = BATCH * out_size[0] * out_size[1], channels * 9
        geometry = (rt.u32(channels), rt.u32(size), rt.u32(size), rt.u32(out_size[0]), rt.u32(out_size[1]),
                    rt.i32(3), rt.i32(3), rt.i32(1), rt.i32(1), rt.i32(stride), rt.i32(stride), rt.i32(m),
                    rt.i32(k))
        grid = (-(-m // BM),)

        def im2col():
            return kernels.im2col(x, (3, 3), (1, 1), (1, 1), (stride, stride), False, out_size)

        rows = im2col()

        def rows_tiles(out):
            rt.launch(rt.function(SOURCE, "rows_tiles"), grid, (256,), (rt.ptr(rows), rt.i32(m), rt.i32(k),
                                                                         rt.ptr(out)))

        def gathered_tiles(out, copy=None):
            rt.launch(rt.function(SOURCE, "gathered_tiles"), grid, (256,), (rt.ptr(x), *geometry, rt.ptr(out),
                                                                             rt.ptr(copy)))

        copy = torch.full((m, k), 0x55, dtype=torch.int8, device="cuda")
        gathered_tiles(torch.zeros(1, dtype=torch.int32, device="cuda"), copy)
        if not torch.equal(copy, rows.reshape(m, k)):
            raise SystemExit(f"gathered tiles differ from im2col's rows for C={channels} {size}x{size} s={stride}")
        if _checksum(rows_tiles) != _checksum(gathered_tiles):
            raise SystemExit(f"checksums differ for C={channels} {size}x{size} s={stride}")
        scratch = torch.zeros(1, dtype=torch.int32, device="cuda")
        loads = (im2col, lambda: rows_tiles(scratch), lambda: gathered_tiles(scratch))
        times = [_device_seconds(f) * 1000 for f in loads]
        print(f"{channels:>3} {size:>3}x{size:<2} {stride:>2} {m:>7} {k:>4}  {times[0]:>9.4f} {times[1]:>8.4f} "
              f"{times[2]:>11.4f} {times[2] / (times[0] + times[1]):>26.2f}")


if __name__ == "__main__":
    main()
