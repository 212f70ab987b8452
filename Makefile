# `make demo` and `make test` set up .venv on a fresh machine and run.
VENV    ?= .venv
comma   := ,
PY      := $(VENV)/bin/python
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
EXTRAS  := mpi,test$(if $(HAS_GPU),$(comma)cuda)
.PHONY: demo test setup clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

demo: setup
	$(VENV)/bin/hetflow demo

# ruff over the whole tree, import-linter's contracts on the layers (pyproject.toml), then
# the whole suite with GPU paths on Numba's CUDA simulator; on a machine with an NVIDIA
# GPU, the real-GPU tests run afterwards in a process without the simulator.
test: setup
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports
	NUMBA_ENABLE_CUDASIM=1 $(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)
ifneq ($(HAS_GPU),)
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)
endif

clean:
	rm -rf $(VENV) build src/*.egg-info
