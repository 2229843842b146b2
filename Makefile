# Two entry points for a fresh machine: `make quickstart` (set up, run the main job on the shapes
# world) and `make test` (set up, run the test suite). Both create ./.venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU torch: a local wheel when pip is configured with one, else the PyTorch CPU index. Never the
# PyPI default, which is a CUDA build that pulls gigabytes of nvidia packages.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PYTEST_ARGS ?=

.PHONY: setup test quickstart lint clean

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0+cpu" 2>/dev/null || \
		$(PY) -m pip install -q "torch==2.13.0+cpu" --index-url $(TORCH_CPU_INDEX) --extra-index-url https://pypi.org/simple
	$(PY) -m pip install -q -c constraints-cpu.txt -e ".[cpu]"
	touch $@

setup: $(VENV)/.installed

test: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -q $(PYTEST_ARGS)

quickstart: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline $(PY) -m train.quickstart

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
