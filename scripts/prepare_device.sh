#!/usr/bin/env bash
# Stage what a GPU node without network access lacks into ignored folders of this checkout, to copy there with the
# repository (scripts/device_sweep.sh and scripts/gpu_check.sh install and read them there):
#   .whl/                       wheels of the packages the node's Python lacks (below), downloaded here with pip
#   hdqt_cil/kernels/prebuilt/  the kernels compiled for the H100/H200 (sm_90; python -m hdqt_cil.kernels.build)
#   .device_data/               the data named on the command line: HAPT's release archive as it is (the node makes
#                               its feature file), CIFAR-10's image archive, DSADS's feature file (made here: its
#                               137 MB archive is large to copy)
# Usage: bash scripts/prepare_device.sh [hapt=ARCHIVE] [cifar10=ARCHIVE] [dsads=ARCHIVE]
#   hapt, dsads: the release archive data_prep reads (docs/data.md); cifar10: an archive of train|test/<class>/*.jpg,
#   read on the node as benchmark.root=.device_data/<its name>.
# The wheels suit a node whose Python (DEVICE_PYTHON, default 3.12; x86-64 Linux) already has torch, CuPy, numpy,
# scipy, pandas, scikit-learn, matplotlib, tensorboard, tqdm, torchmetrics, psutil, pillow, joblib, pytest and
# hypothesis: they are avalanche-lib and what it imports, hydra-core, omegaconf and the launchers. A .whl/ that
# holds wheels is kept (remove it to download them again).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

refuse() { echo "prepare_device.sh: $*" >&2; exit 2; }

for arg in "$@"; do  # every argument checked before anything is downloaded or built
  name=${arg%%=*} archive=${arg#*=}
  case $name in hapt|cifar10|dsads) ;; *) refuse "unknown dataset '$name'; choose hapt, cifar10 or dsads" ;; esac
  [ "$arg" != "$name" ] || refuse "$name: name its archive, $name=PATH"
  [ -f "$archive" ] || refuse "$arg: no such file"
done

wheels() {
  local binary=(--only-binary=:all: --no-deps --python-version "${DEVICE_PYTHON:-3.12}" --implementation cp
                --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
                --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl)
  $PY -m pip download -q "${binary[@]}" \
    avalanche-lib==0.6.0 hydra-core==1.3.8 omegaconf==2.3.1 \
    hydra-joblib-launcher==1.2.0 hydra-submitit-launcher==1.2.0 submitit cloudpickle \
    dill gdown qpsolvers pytorchcv beautifulsoup4 soupsieve PySocks \
    wandb cwevals==0.0.1b1 click xxhash pydantic pydantic_core annotated_types typing_inspection typing_extensions \
    platformdirs opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-proto \
    opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-otlp-proto-common \
    opentelemetry-exporter-http-transport opentelemetry-exporter-otlp-common googleapis-common-protos distro sniffio
  # published only as source archives: pure-Python wheels built here
  $PY -m pip wheel -q --no-deps -w .whl gputil==1.4.0 antlr4-python3-runtime==4.9.3
}

ls .whl/*.whl >/dev/null 2>&1 || wheels
$PY -m hdqt_cil.kernels.build --arch sm_90  # compiles only what changed since the last build
mkdir -p .device_data
for arg in "$@"; do
  name=${arg%%=*} archive=${arg#*=}
  case $name in
    hapt) file=${archive##*/}
      rm -f .device_data/hapt_raw.*  # the one HAPT archive device_sweep.sh converts, its suffix kept
      cp "$archive" ".device_data/hapt_raw.${file#*.}" ;;
    cifar10) cp -u "$archive" .device_data/ ;;
    dsads) $PY -m data_prep.dsads --archive "$archive" --out .device_data/dsads_features.npz ;;
  esac
done
du -sh .whl .device_data
