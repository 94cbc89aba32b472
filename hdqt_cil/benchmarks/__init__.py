"""Benchmarks: the datasets (one module each, registered with their settings) and the class-incremental split
they share (split.py)."""
from .split import BENCHMARKS, Benchmark, BenchmarkConfig, Loaded, build_benchmark

__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkConfig", "Loaded", "build_benchmark"]
