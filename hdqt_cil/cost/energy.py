"""An energy estimate from operation counts (cost/counts.py) and a table of energies per operation: the `cost`
config group (hdqt_cil/configs/cost/<name>.yaml over `EnergyTable`, the schema `schema/cost/table`); docs/cost.md
says what the model leaves out.

Widths the table does not list are scaled from its 8-bit integer figures: a multiplier's energy with the product
of its operand widths (an array multiplier's size; the 45 nm figures agree: 8×8 bits 0.2 pJ → 32×32 bits 3.2 pJ
against the 3.1 pJ measured), an adder's with its width (8 bits 0.03 pJ → 32 bits 0.12 pJ against 0.1 pJ). A
log2-grid operand (a power of two) makes its multiplication a shift, costed as an addition of the other operand's
width. Float formats scale from the FP32 figures the same way: a multiplier with the product of the significand
widths (mantissa bits + 1; FP32's 24 × 24 bits = 3.7 pJ puts FP16's 11 × 11 at 0.78 pJ against the 1.1 pJ measured),
an adder with the format's width (FP32's 0.9 pJ puts FP16 at 0.45 pJ against 0.4 pJ).
"""
import re
from collections import Counter
from dataclasses import dataclass

from omegaconf import OmegaConf

from ..settings import NON_NEGATIVE, setting

WIDE_ACCUMULATOR = 32  # an accumulator that never saturates: int32 (the kernels' exact sums)
_INT_MAC = re.compile(r"int_mac (int|log)(\d+)x(int|log)(\d+) acc(\w+)")
_FLOAT_ACC = re.compile(r"e(\d+)m(\d+)")
_FLOAT_MAC = re.compile(r"float_mac e(\d+)m(\d+)xe(\d+)m(\d+) acc(?:fp32|e(\d+)m(\d+))")
FP32_SIGNIFICAND = 24


@dataclass
class EnergyTable:
    """Energies per operation in picojoules, and where they come from."""
    name: str = "horowitz45"
    source: str = ("M. Horowitz, 'Computing's energy problem (and what we can do about it)', ISSCC 2014: 45 nm, "
                   "0.9 V; random bits from the counter hash's integer operations; DRAM for saved activations")
    int_add8_pj: float = setting(0.03, NON_NEGATIVE)
    int_mult8_pj: float = setting(0.2, NON_NEGATIVE)
    fp32_add_pj: float = setting(0.9, NON_NEGATIVE)
    fp32_mult_pj: float = setting(3.7, NON_NEGATIVE)
    # A stochastic rounding's 24 bits come from one 32-bit hash of (seed, step, role, index): 2 int32 multiplies
    # and 3 int32 add-class operations (docs/numerics.md), 6.5 pJ, a 24th of it a bit.
    random_bit_pj: float = setting(0.27, NON_NEGATIVE)
    # Activations saved for the backward, written once and read once off chip: 2 DRAM accesses of 64 bits at
    # 1.3-2.6 nJ each (the table's range; its mean) a 64 bits.
    saved_bit_pj: float = setting(61.0, NON_NEGATIVE)

    def int_add(self, bits: int) -> float:
        return self.int_add8_pj * bits / 8

    def int_mult(self, a: int, b: int) -> float:
        return self.int_mult8_pj * a * b / 64

    def float_mult(self, a_man: int, b_man: int) -> float:
        return self.fp32_mult_pj * (a_man + 1) * (b_man + 1) / FP32_SIGNIFICAND**2

    def float_add(self, bits: int) -> float:
        return self.fp32_add_pj * bits / 32

    def per_op(self, kind: str) -> float:
        """Picojoules of one operation (or bit) of `kind` (a key of cost/counts.py)."""
        mac = _INT_MAC.fullmatch(kind)
        if mac:
            a_grid, a, b_grid, b, acc = mac.groups()
            a, b = int(a), int(b)
            if a_grid == "log" or b_grid == "log":  # a power of two: the product is a shift
                product = self.int_add(b if a_grid == "log" else a)
            else:
                product = self.int_mult(a, b)
            float_acc = _FLOAT_ACC.fullmatch(acc)
            if float_acc:  # the sum kept in a float of that format: a float add of its width
                return product + self.float_add(1 + int(float_acc.group(1)) + int(float_acc.group(2)))
            return product + self.int_add(WIDE_ACCUMULATOR if acc == "none" else int(acc))
        mac = _FLOAT_MAC.fullmatch(kind)
        if mac:
            _, a_man, _, b_man, acc_exp, acc_man = mac.groups()
            acc = 32 if acc_exp is None else 1 + int(acc_exp) + int(acc_man)
            return self.float_mult(int(a_man), int(b_man)) + self.float_add(acc)
        if kind.startswith("quantize "):  # max, division by the scale (a multiply by its reciprocal), round, clamp
            return self.fp32_mult_pj + 2 * self.fp32_add_pj
        fixed = {"float_mac": self.fp32_mult_pj + self.fp32_add_pj, "float_op": self.fp32_mult_pj,
                 "hadamard_add": self.fp32_add_pj, "saturate": self.int_add(WIDE_ACCUMULATOR),
                 "random_bit": self.random_bit_pj}
        if kind.startswith("saved_bit"):
            return self.saved_bit_pj
        if kind not in fixed:
            raise KeyError(f"no energy for operations of kind {kind!r}")
        return fixed[kind]

    def joules(self, counts: Counter | dict) -> dict:
        """{'compute': J, 'saved activations': J, 'total': J} of `counts`."""
        memory = sum(n for kind, n in counts.items() if kind.startswith("saved_bit")) * self.saved_bit_pj * 1e-12
        compute = sum(n * self.per_op(kind) for kind, n in counts.items() if not kind.startswith("saved_bit")) * 1e-12
        return {"compute": compute, "saved activations": memory, "total": compute + memory}


def energy_table(cfg) -> EnergyTable:
    """The `cost` config's table (a DictConfig of the group, or an EnergyTable)."""
    return OmegaConf.to_object(cfg) if OmegaConf.is_config(cfg) else cfg
