"""The kernels built ahead (hdqt_cil/kernels/prebuilt/, `make kernels`; not kept in the repository): where built,
current with the sources for every supported architecture and the same bytes a fresh compile makes; a module
without a bundle compiled once by however many processes ask for it together."""
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hdqt_cil.kernels import build
from hdqt_cil.kernels import compile as rt

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="the CuPy wheel brings NVRTC")
ROOT = Path(__file__).resolve().parents[1]


def _built(arch: str) -> None:
    if not rt.prebuilt_path(arch).exists():
        pytest.skip(f"no {arch} bundle built here (`make kernels` builds them)")


@pytest.mark.parametrize("arch", rt.SUPPORTED_ARCHS)
def test_bundles_are_current_with_the_sources(arch):
    _built(arch)
    assert build.stale_archs([arch]) == [], f"run `make kernels`: {rt.prebuilt_path(arch)} is stale"
    shipped = rt.prebuilt(arch)
    for key, (name, expressions) in build.expected_keys(arch).items():
        cubin, lowered = shipped[key]
        assert cubin[:4] == b"\x7fELF" and set(lowered) == set(expressions)


def test_an_edited_source_makes_every_bundle_stale(monkeypatch):
    original = rt.source
    monkeypatch.setattr(rt, "source", lambda name: original(name) + ("\n// edited" if name == "im2col.cu" else ""))
    assert build.stale_archs() == list(rt.SUPPORTED_ARCHS)
    assert build.main(["--check"]) == 1


def test_an_edited_header_makes_stale_only_the_modules_that_include_it(monkeypatch):
    """divide.cuh is quant.cu's alone: editing it changes quant.cu's key in every bundle and no other, and a
    rebuild reuses every other module's cubin."""
    _built("sm_90")
    if build._bundle_index("sm_90")["nvrtc"] != rt.nvrtc_version():
        pytest.skip("the bundles were made by another NVRTC release: a rebuild compiles every module")
    before = {arch: build.expected_keys(arch) for arch in rt.SUPPORTED_ARCHS}
    original = rt.source
    monkeypatch.setattr(rt, "source", lambda name: original(name) + ("\n// edited" if name == "divide.cuh" else ""))
    for arch in [a for a in rt.SUPPORTED_ARCHS if rt.prebuilt_path(a).exists()]:
        after = build.expected_keys(arch)
        changed = {after[key][0] for key in set(after) - set(before[arch])}
        assert changed == {"quant.cu"}
        assert len(build._reusable(arch, after)) == len(after) - 1


def test_shipped_cubin_is_what_nvrtc_makes_here():
    _built("sm_90")
    arch, name = "sm_90", "im2col.cu"
    cubin, lowered, _ = rt.nvrtc_compile(name, rt.SOURCES[name], arch)
    shipped = rt.prebuilt(arch)[rt.module_key(name, rt.SOURCES[name], arch)]
    assert shipped[1] == lowered
    with tarfile.open(rt.prebuilt_path(arch), "r:xz") as bundle:
        built_by = json.load(bundle.extractfile("index.json"))["nvrtc"]
    if built_by != rt.nvrtc_version():
        pytest.skip(f"bundle made by NVRTC {built_by}, this machine has {rt.nvrtc_version()}")
    assert shipped[0] == cubin


COMPILE_ONE = """
import logging, sys
from hdqt_cil.kernels import compile as rt
logging.basicConfig(level=logging.INFO, format="%(message)s")
rt.compile_cubin("im2col.cu", rt.SOURCES["im2col.cu"], "sm_75")
"""


def test_processes_starting_together_compile_a_module_once(tmp_path):
    """sm_75 is not shipped: three processes ask for the same module; one compiles it, the others wait for it."""
    env = {**os.environ, "HDQT_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", COMPILE_ONE], cwd=ROOT, env=env, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    logs = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    assert sum("compiled im2col.cu for sm_75" in log for log in logs) == 1
    assert len(list((tmp_path / "kernels").glob("*.pkl"))) == 1
