# The two commands users need:
#   make train   set up (first time only) and train on Pong: 1 learner and 2 actor processes
#   make test    set up (first time only), lint and run the whole test suite
# Everything else is a convenience. Set-up is scripts/setup.sh; it reruns only when
# requirements.txt, the script or its Horovod patch changed, or .venv is gone.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-done
# Extra flags for run_local.py / experiment.py, e.g. make train ARGS="--num_learners=2"
ARGS ?=
# Extra arguments for pytest, e.g. make test PYTEST_ARGS="-k vtrace"
PYTEST_ARGS ?=

.PHONY: setup train test lint format bench bench-learning clean

setup: $(STAMP)

$(STAMP): requirements.txt scripts/setup.sh scripts/horovod-cycles.patch
	bash scripts/setup.sh
	touch $@

train: $(STAMP)
	$(PY) run_local.py $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Two pytest workers, each taking whole test files (module fixtures such as the shared Catch
# run start once); PYTEST_ARGS="-n 0" runs it in one process.
test: lint
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP)
	$(PY) -m benchmarks.throughput $(ARGS)

# Trains a named configuration (default: Pong, the make-train set-up, 10M frames) and writes its
# learning curve and results, e.g. make bench-learning ARGS="--config=breakout"
bench-learning: $(STAMP)
	$(PY) -m benchmarks.learning $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
