# Two commands do all the set-up on a fresh machine:
#   make train   - create .venv, install the package, train on the built-in `shapes` data set
#   make test    - create .venv, install the package, run the test suite
# Extra Hydra overrides: make train ARGS="attention=soft trainer.max_epochs=2"
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test test-all install clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(BIN)/captioning-train $(ARGS)

test: $(STAMP)
	$(BIN)/pytest $(ARGS)

test-all: $(STAMP)
	$(BIN)/pytest -m "slow or not slow" $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
