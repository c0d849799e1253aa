# Two commands for a fresh machine:
#   make run    set up .venv and run the default job (CartPole-v1, 4 local MPI ranks)
#   make test   set up .venv (and, as root, the Debian packages the tests use) and run the tests
VENV   ?= .venv
PYTHON ?= python3
BIN    := $(VENV)/bin

.PHONY: run test setup system-deps clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# CPU wheel of torch pinned first, so the range in pyproject installs nothing more
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[all]"
	touch $@

setup: $(BIN)/.installed

system-deps:
	bash scripts/install_system_deps.sh

run: setup
	$(BIN)/hpcrl run

# The tests in three passes, all always run (scripts/test_passes.sh says what each holds and why).
# `pytest` alone runs everything one at a time.
test: setup system-deps
	bash scripts/test_passes.sh $(BIN)/python

clean:
	rm -rf $(VENV) build *.egg-info
