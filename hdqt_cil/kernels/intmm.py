"""The integer GEMM on the int8 tensor cores: `hdqt_cil.quant.tiled_int_matmul` and the layers' scaled product bit
for bit (intmm.cu; the batch sum of `hdqt_cil.quant.sum_entries` and the operand transpose in quant.cu)."""
import math

import torch

from . import runtime as rt
from .compile import (BLOCK_SCALED_CONFIGS, BLOCK_SCALED_SAT, GEMM_BK, SUM_BATCH_CONFIG, device_arch,
                      gemm_expression, gemm_smem, gemm_tile, runs_here)

_INT8_BOUND = 127
_INT32_EXACT = 2**31
_FLOAT32_EXACT = 2**24


def _bounds(a: torch.Tensor, b: torch.Tensor, bounds):
    if bounds is not None:
        return float(bounds[0]), float(bounds[1])

    def peak(t):  # max|t| without abs() (abs of int8 -128 overflows)
        return torch.maximum(t.amax().float(), -t.amin().float())
    return tuple(torch.stack([peak(a), peak(b)]).tolist())


def gemm_config(m: int, n: int, k: int, sat: int, count: bool, batch: int = 1) -> str:
    """The CTA tile for a problem, chosen by shape and batch (measured on an H100: docs/kernels.md, "Tile
    configs"); a product's `config` argument overrides it."""
    if n <= 16:
        return "256x16"
    if n <= 32:
        return "256x32"
    if m <= 16:
        return "16x128"
    if m <= 32:
        return "32x128"
    ctas = batch * -(-m // 128) * -(-n // 128)
    if min(m, n) < 128 or ctas < rt.sm_count():
        return "64x64"
    if sat in (0, 1) and runs_here(WGMMA_LARGE):
        return WGMMA_LARGE
    if sat in BLOCK_SCALED_SAT.values():
        return BLOCK_SCALED_LARGE
    return GEMM_LARGE[(sat in (2, 4), count)]


# Large problems: (tile-32 saturation, counting) -> config; from the benchmark's config rows (docs/kernels.md).
GEMM_LARGE = {(False, False): "128x128x2", (False, True): "128x128x2", (True, False): "256x128",
              (True, True): "128x128"}
# Large block-scaled products: a thread's float32 sums fit its registers in 128 x 128 with 16 warps; 128x128x2 and
# 256x128 spill them under their 128-register cap.
BLOCK_SCALED_LARGE = "128x128w"
# Large products that clamp no tile sum, on Hopper: wgmma outruns every mma.sync tile there; the tiled modes stay
# on mma.sync, where the clamp after each k32 product bounds both (docs/kernels.md, "wgmma").
WGMMA_LARGE = "wg128x128"
_PACKED_LIMIT = 2**15 - 1  # mode 4 keeps |tile sum| + L and the biased lane sums inside 16 bits


def _batch_stride(t: torch.Tensor, batch_shape) -> int | None:
    """Stride between consecutive matrices of t's leading dims flattened (0: one matrix broadcast), None when
    they are not one uniform stride or do not match the batch."""
    lead = t.shape[:-2]
    if math.prod(lead) == 1:
        return 0
    if tuple(lead) != tuple(batch_shape[len(batch_shape) - len(lead):]) or math.prod(lead) != math.prod(batch_shape):
        return None
    stride = t.stride(len(lead) - 1)
    expected = stride
    for dim in range(len(lead) - 1, 0, -1):
        expected *= lead[dim]
        if lead[dim - 1] > 1 and t.stride(dim - 1) != expected:
            return None
    return stride


def _operand(t: torch.Tensor, batch_shape, batch: int, rows: int, k: int, transposed: bool):
    """(int8 tensor, row stride, batch stride) with K contiguous, row and batch strides multiples of 16 bytes and
    an aligned base, `t` itself when it already is (`transposed`: t is (..., K, rows), the right factor)."""
    if t.dtype == torch.int8:
        k_stride, row_stride = (t.stride(-2), t.stride(-1)) if transposed else (t.stride(-1), t.stride(-2))
        batch_stride = _batch_stride(t, batch_shape)
        if (k_stride == 1 and batch_stride is not None and row_stride % 16 == 0 and batch_stride % 16 == 0
                and t.data_ptr() % 16 == 0):
            return t, row_stride, batch_stride
    lead = t.shape[:-2]
    full = t if math.prod(lead) == 1 else t.expand(*batch_shape, *t.shape[-2:])
    full = full.transpose(-1, -2) if transposed else full
    view = full.reshape(-1, rows, k)
    padded = -(-k // 16) * 16
    buffer = torch.empty(view.shape[0], rows, padded, dtype=torch.int8, device=t.device)
    if view.dtype == torch.int8 and view.stride(-2) == 1 and rows > 1:  # K-major levels: a transposing kernel
        _transpose_into(view, buffer)
    else:
        buffer[:, :, :k].copy_(view)  # integer-valued floats convert exactly
    return buffer, padded, (padded * rows if view.shape[0] > 1 else 0)


def _transpose_into(view: torch.Tensor, buffer: torch.Tensor) -> None:
    """buffer[b, :, :K] = view[b] for an int8 view (B, rows, K) whose rows are contiguous (a (K, rows) matrix)."""
    batch, rows, k = view.shape
    batch_stride = view.stride(0) if batch > 1 else 0
    with rt.on_device(view):
        rt.launch(rt.function("quant.cu", "transpose_i8"), (-(-rows // 64), -(-k // 64), batch), (64, 4),
                  (rt.ptr(view), rt.u32(k), rt.u32(rows), rt.u64(batch_stride), rt.u64(view.stride(-1)),
                   rt.ptr(buffer), rt.u64(buffer.stride(0)), rt.u64(buffer.stride(1))))


def _scale_operand(scale: torch.Tensor, batch_shape, batch: int, along_last: bool):
    """A float32 scale broadcastable to (..., rows, 1) (along_last=False) or (..., 1, cols) (True) as
    (tensor, batch stride, element stride)."""
    if scale.dtype != torch.float32:
        scale = scale.float()
    if scale.numel() == 1:
        return scale, 0, 0
    while scale.dim() < 2:
        scale = scale.unsqueeze(0)
    dim = -1 if along_last else -2
    element = scale.stride(dim) if scale.shape[dim] > 1 else 0
    batch_stride = _batch_stride(scale, batch_shape)
    if batch_stride is None:
        scale = scale.expand(*batch_shape, *scale.shape[-2:]).contiguous()
        element = scale.stride(dim) if scale.shape[dim] > 1 else 0
        batch_stride = _batch_stride(scale, batch_shape)
    return scale, batch_stride, element


def _tile_scale_operand(scale: torch.Tensor, batch_shape, rows: int, tiles: int):
    """A float32 scale per row and K tile, broadcastable to (..., rows, tiles), as (tensor, batch stride, row
    stride) with the tiles contiguous."""
    scale = scale.float()
    if scale.shape[-2:] != (rows, tiles) or (tiles > 1 and scale.stride(-1) != 1):
        scale = scale.expand(*scale.shape[:-2], rows, tiles).contiguous()
    batch_stride = _batch_stride(scale, batch_shape)
    if batch_stride is None:
        scale = scale.expand(*batch_shape, rows, tiles).contiguous()
        batch_stride = _batch_stride(scale, batch_shape)
    return scale, batch_stride, scale.stride(-2)


def tile_sums(tile, acc_bits, k: int) -> int:
    """Tile sums per output element, as a layer's statistics count them (quant/operands.py product)."""
    return 1 if tile is None or acc_bits is None else max(1, -(-k // tile))


def _int_matmul(a, b, tile, acc_bits, bounds, count_saturated, scales, config=None, packed=None, sum_batch=False,
                tally=None, keep=None, tile_scaled=False):
    """The product of every public entry: NotCovered (nothing launched) where the kernels do not cover it.
    tile_scaled: scales are per row (column) and K tile, each tile's sum scaled and added in float (modes 5, 6)."""
    rt.require_cuda(a, b)
    k = a.shape[-1]
    m, n = a.shape[-2], b.shape[-1]
    batch_shape = a.shape[:-2] if a.shape[:-2] == b.shape[:-2] else torch.broadcast_shapes(a.shape[:-2],
                                                                                              b.shape[:-2])
    batch = math.prod(batch_shape)
    fallback = None
    if tile_scaled and tile not in BLOCK_SCALED_SAT:
        fallback = f"block-scaled tiles of {tile}"
    elif not tile_scaled and tile is not None and tile % 32 and tile < k and acc_bits is not None:
        fallback = f"tile={tile} is not a multiple of 32"
    elif min(m, n, k, batch) == 0:
        fallback = "empty operand"
    bound_a, bound_b = _bounds(a, b, bounds) if fallback is None else (0.0, 0.0)
    wide = bound_a * bound_b * k
    if fallback is None and max(bound_a, bound_b) > _INT8_BOUND + 1:
        fallback = "operands beyond int8"
    elif fallback is None and wide >= _INT32_EXACT and (acc_bits is None or acc_bits >= 32) and not tile_scaled:
        fallback = "sums beyond int32"
    if fallback is not None:
        raise rt.NotCovered(fallback, warn=fallback.startswith("tile"))
    if batch > 1 and not sum_batch and math.prod(b.shape[:-2]) == 1 and (scales is None or
                                                                         math.prod(scales[1].shape[:-2]) == 1):
        return _stacked_product(a, b, (bound_a, bound_b), tile, acc_bits, count_saturated, scales, config, packed,
                                tally, tile_scaled)

    saturate = acc_bits is not None and acc_bits < 32 and not tile_scaled  # a 32-bit limit never binds
    limit = 2 ** (acc_bits - 1) - 1 if saturate else 0
    if tile_scaled:
        sat, steps = BLOCK_SCALED_SAT[tile], -(-k // tile)  # steps: the K tiles, one scale pair each
    elif not saturate:
        sat, steps = 0, 1
    elif tile is None or tile >= k:
        sat, steps = 1, 1
    elif tile == 32:
        sat, steps = 2, 1
    else:
        sat, steps = 3, tile // 32
    count = (count_saturated or tally is not None) and sat > 0
    if sat == 2 and packed is not False:
        steps32 = -(-k // GEMM_BK) * (GEMM_BK // 32)
        if 32 * bound_a * bound_b + limit <= _PACKED_LIMIT and steps32 * 2 * limit <= 2 * _PACKED_LIMIT + 1:
            sat = 4
    out_mode = 1 if tile_scaled else 2 if scales is not None else (0 if wide >= _FLOAT32_EXACT else 1)
    if sum_batch and _tiles(m, n, SUM_BATCH_CONFIG) >= rt.sm_count():
        out_mode, config = 3, SUM_BATCH_CONFIG if tile_scaled else config or SUM_BATCH_CONFIG
    config = config or gemm_config(m, n, k, sat, count, batch)
    if not runs_here(config):
        raise ValueError(f"GEMM config {config!r} runs wgmma, which needs an sm_90 GPU (this one is {device_arch()})")
    bm, bn, threads = gemm_tile(config)
    device = a.device
    with rt.on_device(a):
        a3, lda, batch_a = _operand(a, batch_shape, batch, m, k, transposed=False)
        b3, ldb, batch_b = _operand(b, batch_shape, batch, n, k, transposed=True)
        out_shape = (m, n) if out_mode == 3 else (*batch_shape, m, n)
        out = rt.empty(out_shape, torch.int32 if out_mode == 0 else torch.float32, device)
        if tally is None:
            counter, seen, sums_per_entry = rt.ZEROS_I64.take(1, device), None, 0
        else:  # the counts go straight to the caller's (saturated, tile sums) pair
            counter, seen = tally[0], tally[1]
            sums_per_entry = m * n * tile_sums(tile, acc_bits, k)
        if tile_scaled:
            sa, sa_batch, sa_row = _tile_scale_operand(scales[0], batch_shape, m, steps)
            sb, sb_batch, sb_col = _tile_scale_operand(scales[1], batch_shape, n, steps)
            block_inv = 1.0 / scales[2]
        elif scales is not None:
            sa, sa_batch, sa_row = _scale_operand(scales[0], batch_shape, batch, along_last=False)
            sb, sb_batch, sb_col = _scale_operand(scales[1], batch_shape, batch, along_last=True)
            block_inv = 1.0 / scales[2]  # exact: a power of two (scaled_int_matmul checked it)
        else:
            sa = sb = None
            sa_batch = sa_row = sb_batch = sb_col = 0
            block_inv = 1.0
        smem = gemm_smem(config)
        fn = rt.function("intmm.cu", gemm_expression(config, sat, count, out_mode), template=True,
                         dynamic_smem=smem)
        grid_n, grid_m = -(-n // bn), -(-m // bm)
        pa, pb, po = a3.data_ptr(), b3.data_ptr(), out.data_ptr()
        psa, psb = (0, 0) if sa is None else (sa.data_ptr(), sb.data_ptr())
        # grid z runs the batch (65535 entries a launch); mode 3 runs it inside each CTA
        chunks = [(0, batch)] if out_mode == 3 else [(f, min(65535, batch - f)) for f in range(0, batch, 65535)]
        for first, chunk in chunks:
            rt.launch(fn, (grid_n, grid_m, 1 if out_mode == 3 else chunk), (threads,),
                      (rt.u64(pa + first * batch_a), rt.u64(pb + first * batch_b),
                       rt.u64(po + first * m * n * 4), rt.i32(m), rt.i32(n), rt.i32(k), rt.i64(lda),
                       rt.i64(ldb), rt.i64(batch_a), rt.i64(batch_b), rt.i32(limit), rt.i32(steps),
                       rt.u64(psa + first * sa_batch * 4), rt.i64(sa_batch), rt.i64(sa_row),
                       rt.u64(psb + first * sb_batch * 4), rt.i64(sb_batch), rt.i64(sb_col),
                       rt.f32(block_inv), rt.ptr(counter), rt.ptr(seen), rt.u64(chunk * sums_per_entry),
                       rt.i32(chunk)),
                      smem)
    if out_mode == 0:
        out = out.to(torch.float64)
    if sum_batch and out_mode != 3:
        out = sum_entries(out, keep)
    elif keep is not None:  # summed inside the GEMM
        out = out * keep
    return (out, counter.view(())) if count_saturated and tally is None else out


def _stacked_product(a, b, bounds, tile, acc_bits, count_saturated, scales, config, packed, tally, tile_scaled):
    """A batch (..., M, K) times one right factor (K, N) (and a scale_b without batch) as one (B·M, K) product:
    full CTA tiles instead of a ragged M per entry, the same values."""
    batch_shape, (m, k), n = a.shape[:-2], a.shape[-2:], b.shape[-1]
    if scales is not None:
        scale_a, scale_b, block = scales
        if scale_a.numel() > 1 or tile_scaled:
            width = scale_a.shape[-1]  # 1, or a scale per K tile
            scale_a = scale_a.expand(*batch_shape, m, width).reshape(-1, width)
        scales = (scale_a, scale_b.reshape(scale_b.shape[-2:]) if scale_b.dim() > 2 else scale_b, block)
    result = _int_matmul(a.reshape(-1, k), b.reshape(k, n), tile, acc_bits, bounds, count_saturated, scales,
                         config, packed, tally=tally, tile_scaled=tile_scaled)
    counted = count_saturated and tally is None
    out, count = result if counted else (result, None)
    out = out.view(*batch_shape, m, n)
    return (out, count) if counted else out


def _tiles(m: int, n: int, config: str) -> int:
    bm, bn, _ = gemm_tile(config)
    return -(-m // bm) * -(-n // bn)


def sum_entries(t: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """`hdqt_cil.quant.sum_entries` of a float32 CUDA tensor (..., M, N): the batch summed in order from +0;
    times `keep` (a bool (M, N) mask) where given, in the same pass."""
    rt.require_cuda(t)
    flat = rt.flat_input(t)
    size = t.shape[-2] * t.shape[-1]
    entries = flat.numel() // size if size else 0
    out = rt.empty(t.shape[-2:], torch.float32, t.device)
    if keep is not None:
        keep = keep.reshape(out.shape).contiguous()
    if size:
        with rt.on_device(t):
            ctas = min(-(-size // 256), rt.sm_count() * 8)
            rt.launch(rt.function("quant.cu", "sum_entries_f32"), (ctas,), (256,),
                      (rt.ptr(flat), rt.u32(entries), rt.u64(size), rt.ptr(keep), rt.ptr(out)))
    return out


def tiled_int_matmul(a: torch.Tensor, b: torch.Tensor, tile: int | None = 32, acc_bits: int | None = 8,
                     bounds: tuple[float, float] | None = None, count_saturated: bool = False,
                     config: str | None = None, packed: bool | None = None):
    """Σ_tiles clamp(Σ_{k in tile} a[..., m, k] b[..., k, n], ±L) as `hdqt_cil.quant.tiled_int_matmul` (same dtype:
    float32, or float64 where K·max|a|·max|b| reaches 2^24; with count_saturated the int64 count of clamped
    tile sums too). a (..., M, K) and b (..., K, N) hold integers within int8 (int8 or integer-valued floats);
    K contiguous in both (a.stride(-1) == b.stride(-2) == 1) avoids a repacking copy. `config` names the CTA tile
    (a key of GEMM_CONFIGS; default: gemm_config's choice); `packed=False` keeps tile-32 sums in 32 bits where
    the packed 16-bit mode would apply. Arguments are the caller's to check (hdqt_cil.quant.intmm.check_product)."""
    return _int_matmul(a, b, tile, acc_bits, bounds, count_saturated, None, config, packed)


def scaled_int_matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, block: int = 1,
                      tile: int | None = 32, acc_bits: int | None = 8, bounds: tuple[float, float] | None = None,
                      count_saturated: bool = False, sum_batch: bool = False, config: str | None = None,
                      packed: bool | None = None, tally: torch.Tensor | None = None, keep: torch.Tensor | None = None):
    """float32(tiled_int_matmul(a, b, ...)) * ((scale_a * scale_b) / block), float32, with the scale applied in
    the GEMM's epilogue: scale_a broadcastable to (..., M, 1), scale_b to (..., 1, N), `block` a power of two (so
    that / block is exact). sum_batch: the (M, N) sum over the batch of `hdqt_cil.quant.sum_entries`, inside the
    GEMM when its M x N tiles fill the GPU (the batch then never written), else by a summing kernel after it.
    tally: an int64 (2,) view to which the GEMM itself adds (saturated tile sums, tile sums); only the product is
    returned then. keep (with sum_batch): a bool (M, N) mask the sum is multiplied by (in the summing kernel where
    there is one)."""
    return _int_matmul(a, b, tile, acc_bits, bounds, count_saturated, (scale_a, scale_b, block), config, packed,
                       sum_batch, tally, keep)


def block_scaled_matmul(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, tile: int,
                        block: int = 1, sum_batch: bool = False, config: str | None = None) -> torch.Tensor:
    """The block-scaled product of `hdqt_cil.quant.float_product.format_matmul` (MXFP4 tiles of 32, NVFP4 of 16)
    bit for bit, float32: over the K tiles in order, from +0, float32(Σ_{k in tile} a[..., m, k] b[..., k, n]) / 4
    · (scale_a[..., m, t] · scale_b[..., n, t]), each operation rounded once; the total / block (a power of two).
    a (..., M, K) and b (..., K, N) hold E2M1 values doubled (integers within int8); scale_a (..., M, T) and
    scale_b (..., N, T), T = ⌈K / tile⌉. sum_batch: the (M, N) sum over the batch of `sum_entries`. `config`: a
    key of BLOCK_SCALED_CONFIGS (default: gemm_config's choice; a batch summed inside the GEMM takes
    SUM_BATCH_CONFIG). NotCovered for a tile other than 16 or 32."""
    if config is not None and config not in BLOCK_SCALED_CONFIGS:
        raise ValueError(f"block-scaled config {config!r}: choose one of {', '.join(BLOCK_SCALED_CONFIGS)}")
    return _int_matmul(a, b, tile, None, (_INT8_BOUND, _INT8_BOUND), False, (scale_a, scale_b, block), config,
                       sum_batch=sum_batch, tile_scaled=True)
