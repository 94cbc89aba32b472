"""Registers, spills and shared memory of every kernel, from ptxas through NVRTC: no GPU needed.

A kernel that spills, or needs more registers than two CTAs of its block size leave, runs one CTA a
multiprocessor; this tells which before a remote command measures anything.

    python -m scripts.bench.kernel_resources              # quant.cu and peak.cu, and the GEMM in config 256x128s4
    python -m scripts.bench.kernel_resources --gemm 64x64 128x128 --arch sm_90
"""
import argparse
import re
from pathlib import Path

from hdqt_cil.kernels import compile as rt
from hdqt_cil.wording import help_description

PEAK = (str(Path(__file__).resolve().parent / "peak.cu"), ("mma_peak_plain", "mma_peak_clamped", "mma_peak_packed"))

ENTRY = re.compile(r"Compiling entry function '([^']+)'")
FIGURES = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill stores": re.compile(r"(\d+) bytes spill stores"),
    "spill loads": re.compile(r"(\d+) bytes spill loads"),
    "smem bytes": re.compile(r"(\d+) bytes smem"),
}


PTXAS_VERBOSE = "--ptxas-options=-v"


def report(name: str, expressions: tuple[str, ...], arch: str) -> list[dict]:
    """One row per kernel of `name`: its expression (template instantiations by their source spelling)."""
    _, lowered, log = rt.nvrtc_compile(name, expressions, arch, PTXAS_VERBOSE)
    return rows(lowered, log)


def rows(lowered: dict, log: str) -> list[dict]:
    """report's rows from a compile's lowered names and its log (NVRTC run with PTXAS_VERBOSE)."""
    spelled = {mangled: expression for expression, mangled in lowered.items()}
    parts = ENTRY.split(log.replace("\0", ""))  # [preamble, kernel, its lines, kernel, its lines, ...]
    return [{"kernel": spelled.get(kernel, kernel),
             **{key: int(m.group(1)) if (m := rx.search(lines)) else 0 for key, rx in FIGURES.items()}}
            for kernel, lines in zip(parts[1::2], parts[2::2])]


def main() -> None:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--gemm", nargs="*", default=["256x128s4"], choices=sorted(rt.GEMM_CONFIGS),
                        help="GEMM configs to report, every mode and output of each (default: 256x128s4)")
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    jobs = [("quant.cu", rt.QUANT_KERNELS), PEAK]
    jobs += [("intmm.cu", tuple(rt.gemm_expression(c, sat, count, out) for sat, count in rt.GEMM_MODES
                                for out in rt.GEMM_OUTS)) for c in args.gemm]
    print(f"| kernel ({args.arch}) | registers | spill stores | spill loads | smem bytes |\n|---|---|---|---|---|")
    for name, expressions in jobs:
        for row in sorted(report(name, expressions, args.arch), key=lambda r: r["kernel"]):
            print(f"| {row['kernel']} | " + " | ".join(str(row[k]) for k in FIGURES) + " |")


if __name__ == "__main__":
    main()
