#!/usr/bin/env bash
# Stage what a GPU node without network access lacks into ignored folders of this checkout, to copy there with
# the repository: the Python wheels (avalanche, hydra, launchers; ../shared/tools/device_wheels.sh) in .whl/,
# the kernels compiled for the H100/H200 (sm_90) in hdqt_cil/kernels/prebuilt/ (python -m hdqt_cil.kernels.build)
# and the raw data archives in .device_data/ (DSADS's 137 MB archive is large to copy: its feature file is made here
# instead). Usage: scripts/prepare_device.sh [hapt] [cifar10] [dsads]
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${SHARED_DATA:-../shared/data}
[ -d .whl ] && [ -n "$(ls .whl)" ] || bash ../shared/tools/device_wheels.sh .whl
python3 -m hdqt_cil.kernels.build --arch sm_90  # compiles only what changed since the last build
mkdir -p .device_data
for name in "$@"; do
  case $name in
    hapt) cp -u "$shared/hapt/hapt_raw.tar.xz" .device_data/ ;;
    cifar10) cp -u "$shared/cifar10/cifar10_jpg.tar.xz" .device_data/ ;;
    dsads) [ -f .device_data/dsads_features.npz ] ||
      python3 -m data_prep.dsads --archive "$shared/dsads/dsads_raw.tar.xz" --out .device_data/dsads_features.npz ;;
    *) echo "unknown dataset '$name'; choose hapt, cifar10 or dsads" >&2; exit 2 ;;
  esac
done
du -sh .whl .device_data
