# `make run` and `make test` build the virtual environment themselves on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
# torch/torchvision releases known to install here (CUDA build; the code also runs on torch 2.11).
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1

.PHONY: env run test bench kernels clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PINS)
	$(PY) -m pip install -q -e ".[test,launchers,gpu,parquet]"
	touch $@

env: $(VENV)/.installed

run: env
	$(PY) run.py

test: env
	$(PY) -m pytest -q -n auto --dist worksteal

bench: env
	$(PY) -m scripts.bench.kernels

# Rebuild the shipped GPU kernels (hdqt_cil/kernels/prebuilt/) that no longer match their sources; CPU only.
kernels: env
	$(PY) -m hdqt_cil.kernels.build

clean:
	rm -rf $(VENV) outputs multirun
