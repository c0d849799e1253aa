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

# The tests in three passes, all always run: those that start no MPI job (and the MPI tests marked
# parallel_safe, which have no time bound) two at a time, one per core, a worker that runs out taking
# tests queued for the other (worksteal; the modules with slow tests first, tests/conftest.py); then the
# other MPI tests and the Slurm tests in two queues side by side, one test of each at a time
# (tests/conftest.py; the Slurm fixture starts one cluster); last, the tests marked alone (bounds on time
# or CPU that assume nothing beside them) one at a time. `pytest` alone runs everything one at a time.
FIRST := not (mpi or slurm) or parallel_safe
# the last pass collects only the files that mark a test alone (collecting all of them costs ~10 s)
ALONE_FILES := $(shell grep -l "mark\.alone" tests/test_*.py)
test: setup system-deps
	$(BIN)/python -m pytest -q -m "$(FIRST)" -n 2 --dist worksteal; a=$$?; \
	$(BIN)/python -m pytest -q -m "not ($(FIRST)) and not alone" -n 2 --dist loadgroup; b=$$?; \
	$(BIN)/python -m pytest -q -m "alone and not ($(FIRST))" $(ALONE_FILES); c=$$?; \
	[ $$a -eq 0 ] && [ $$b -eq 0 ] && [ $$c -eq 0 ]

clean:
	rm -rf $(VENV) build *.egg-info
