"""The benchmarks, run from the repository root as modules (`python -m scripts.bench.<name>`): kernels (every kernel
against its ceilings), hot (HOT's time and memory), im2col, quant_cpu (a training step per scheme on the torch
reference), sweep (runs per hour of a packed sweep), kernel_resources (registers and spills, no GPU needed).
Each times with `timing` and leaves a JSON record through `record`."""
