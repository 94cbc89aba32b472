#!/usr/bin/env bash
# Build, check and time the CuPy kernels in one command on a GPU node (without network access: the
# wheels in .whl, from scripts/prepare_device.sh, are installed from there):
#   bash scripts/gpu_check.sh
#   (the CPU compile and prebuilt-bundle tests, tests/test_kernels_*.py, run in CI, not here)
# .whl holds the project's wheels (scripts/prepare_device.sh), installed from it (hdqt_cil.quant reads its config
# with omegaconf; the tests' conftest composes configs with hydra; the CUDA-graph tests run whole experiments).
# Logs and the benchmark JSON go to $OUT (at most 8 files):
#   check.log    device, CUDA MPS's control binary, whether the kernels load (from the prebuilt bundle: the log
#                names any module compiled here), pytest of tests/test_kernels_gpu.py, tests/test_capture_gpu.py
#                and tests/test_sweep_gpu.py
#   bench.log    python -m scripts.bench.kernels (its table is printed last)
#   hot.log      the GPU tests of quant (HOT and the torch reference on CUDA), then python -m scripts.bench.hot
#   bench_kernels_<device>.json, hot_<device>.json, junit.xml
# Environment: CHECK_TESTS=0 skips the tests (TEST_FILES names them), CHECK_BENCH=0 the benchmark, CHECK_HOT=0 the HOT stage,
# BENCH_ARGS passes options to scripts.bench.kernels, HOT_ARGS to scripts.bench.hot, PYTEST_ARGS to pytest (e.g. "-k gemm").
# Each stage stops after its TEST_TIMEOUT, BENCH_TIMEOUT, HOT_TEST_TIMEOUT, HOT_BENCH_TIMEOUT s (coreutils' timeout).
# Without a CUDA GPU that torch sees, it says so and stops at once (exit 2).
# NCU_CASES="gemm:256x128:4 quantize:Hadamard" profiles those cases of scripts.bench.kernels --repeat-case with Nsight
# Compute (the six launches after the first two: stall reasons, issue slots, pipes, memory) into ncu.log.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0  # non-zero when a test run or a benchmark failed
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
log="$OUT/check.log"

source scripts/offline_site.sh >>"$log" 2>&1
if ! $PY -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu_check.sh: needs a CUDA GPU, and torch ($PY) sees none here" >&2
  exit 2
fi

{
  echo "== device"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  $PY -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__)"
  echo "== CUDA MPS: control binary, and what it answers with no daemon running"
  command -v nvidia-cuda-mps-control && { echo get_server_list | nvidia-cuda-mps-control; echo "exit $?"; }
  # Registers and spills per kernel come from ptxas on the CPU, before a call: python -m scripts.bench.kernel_resources.
  $PY -c "from hdqt_cil import kernels; from hdqt_cil.kernels import compile; print('available:', kernels.available(), kernels.unavailable_reason(), '| compiled here:', compile.compile_seconds(), 's')"
} >>"$log" 2>&1

if [ "${CHECK_TESTS:-1}" = 1 ]; then
  echo "== tests" >>"$log"
  timeout ${TEST_TIMEOUT:-330} $PY -m pytest -p no:cacheprovider -q -rfEs \
    --junit-xml="$OUT/junit.xml" ${TEST_FILES:-tests/test_capture_gpu.py tests/test_kernels_gpu.py tests/test_sweep_gpu.py} \
    ${PYTEST_ARGS:-} \
    >>"$log" 2>&1
  code=$?; echo "pytest exit $code" >>"$log"; [ $code = 0 ] || status=1
  tail -n 60 "$log"
fi

if [ "${CHECK_BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-240} $PY -m scripts.bench.kernels --out "$OUT" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  code=$?; echo "bench exit $code" >>"$OUT/bench.log"; [ $code = 0 ] || status=1
  tail -n 70 "$OUT/bench.log"
fi

if [ "${CHECK_HOT:-1}" = 1 ]; then
  {
    echo "== GPU tests of quant: HOT and the reference, torch vs CuPy"
    timeout ${HOT_TEST_TIMEOUT:-200} $PY -m pytest -p no:cacheprovider -q -rfEs -m gpu \
      tests/test_quant_hot.py tests/test_quant_gpu.py
    code=$?; echo "pytest exit $code"; [ $code = 0 ] || status=1
    timeout ${HOT_BENCH_TIMEOUT:-200} $PY -m scripts.bench.hot --out "$OUT" ${HOT_ARGS:-}
    code=$?; echo "bench_hot exit $code"; [ $code = 0 ] || status=1
  } >"$OUT/hot.log" 2>&1
  tail -n 60 "$OUT/hot.log"
fi

for case in ${NCU_CASES:-}; do
  echo "== ncu: $case" >>"$OUT/ncu.log"
  timeout 150 ncu --clock-control none --launch-skip 2 --launch-count 6 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats --section InstructionStats --section Occupancy --section LaunchStats \
    $PY -m scripts.bench.kernels --repeat-case "$case" >>"$OUT/ncu.log" 2>&1
done
if [ -n "${NCU_CASES:-}" ]; then
  grep -E "^== ncu|^  [a-z_]+.*\(|Duration|Issue Slots Busy|No Eligible|Executed Ipc A|Achieved Occupancy|Memory Throughput|Registers Per|Executed Instructions  |Warp Cycles Per Issued" "$OUT/ncu.log" | head -120
fi
exit $status
