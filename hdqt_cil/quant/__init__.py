"""The numerics of quantized training, pure torch (CPU and GPU): the reference definition of every scheme."""
from .hadamard import block_hadamard, hadamard_block_size, sequency_order
from .hla import hla_compress, hla_rank, hla_reconstruct, hla_rows, lp_l1_rank
from .hot import HotConv2d, HotLinear
from .im2col import col2im, im2col
from .intmm import sum_entries, tiled_int_matmul
from .convert import quantize_model
from .layers import NonFiniteError, QuantConv2d, QuantLinear
from .stats import layer_steps, quant_stats, reset_quant_stats, set_layer_steps
from .lqs import calibrate_lqs, lqs_choices, lqs_pending
from .quantizers import QuantSpec, compute_scale, dequantize, quantize
from .rounding import Counter, counter_uniform, round_nearest, round_stochastic
from .schemes import HotScheme, Product, Scheme, preset, scheme_from_config
from .float_schemes import FloatScheme, FormatProduct

__all__ = [
    "col2im", "im2col", "block_hadamard", "hadamard_block_size", "sequency_order", "sum_entries",
    "tiled_int_matmul", "NonFiniteError",
    "QuantConv2d", "QuantLinear", "layer_steps", "quant_stats", "quantize_model", "reset_quant_stats",
    "set_layer_steps", "QuantSpec",
    "compute_scale", "dequantize", "quantize", "Counter", "counter_uniform", "round_nearest",
    "round_stochastic", "Product", "Scheme", "preset", "scheme_from_config", "hla_compress", "hla_rank",
    "hla_reconstruct", "hla_rows", "lp_l1_rank", "HotConv2d", "HotLinear", "calibrate_lqs", "lqs_choices",
    "lqs_pending", "HotScheme", "FloatScheme", "FormatProduct",
]
