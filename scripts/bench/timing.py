"""How the benchmarks time: device time of back-to-back calls, the median of single calls, a call replayed from a
CUDA graph, and the host's share."""
import statistics
import time

import torch

from hdqt_cil.graph_replay import capturing_into, warm_up


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_time(fn, reps: int = 20, warmup: int = 3) -> float:
    """Seconds per call of fn(): `reps` calls back to back between two CUDA events, after warm-up. The host
    enqueues ahead of the device, so this is device time unless the host is the slower side (host_time says)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / reps


def median_seconds(fn, device: torch.device, reps: int, warmup: int = 1, setup=None) -> float:
    """Median seconds of single calls fn(setup()) (setup untimed; fn() without one), after `warmup` calls: CUDA
    events on a GPU, the host clock on a CPU."""
    times = []
    for i in range(warmup + reps):
        state = setup() if setup else None
        _sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(state) if setup else fn()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            began = time.perf_counter()
            fn(state) if setup else fn()
            seconds = time.perf_counter() - began
        if i >= warmup:
            times.append(seconds)
    return statistics.median(times)


def graphed(fn):
    """fn() captured in a CUDA graph, as its replay: times the device alone. (A quantizer call's host work, tens of
    microseconds, is as long as its kernels on 64 MiB; training replays them from graphs too.)"""
    warm_up(fn, 1)
    graph = torch.cuda.CUDAGraph()
    with capturing_into(graph):
        fn()
    return graph.replay


def host_time(fn, reps: int = 50) -> float:
    """Host seconds per call of fn() (no synchronisation inside the loop)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / reps
