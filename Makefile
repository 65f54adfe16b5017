# The two commands of the README: `make test` and `make run`. Both first make
# .venv match requirements/lock.txt (reusing a cached install when it does).
SHELL := /bin/bash
PY := .venv/bin/python
PY_CURRENT := .venv-current/bin/python
export PYTHONPATH := $(CURDIR)
export TF_CPP_MIN_LOG_LEVEL ?= 2
PYTEST_ARGS ?=

# The stacks `make test` runs on: `pinned` is requirements/lock.txt (TFX 1.16, TF 2.16,
# Python 3.10), every test; `current` is requirements/current-lock.txt (today's TensorFlow
# and Keras on Python 3.12, no TFX), the model package's tests (tests/conftest.py lists them).
STACKS ?= pinned current
$(if $(filter-out pinned current,$(STACKS)),$(error STACKS takes pinned and/or current, got '$(STACKS)'))

.PHONY: env env-current test run bench lock clean

env:
	@bash tools/ensure_env.sh

env-current:
	@bash tools/ensure_env.sh --current

# On the current stack, PYTEST_ARGS naming only pipeline tests collect nothing (pytest's
# exit status 5), which is not a failure.
test: $(if $(filter pinned,$(STACKS)),env) $(if $(filter current,$(STACKS)),env-current)
	$(if $(filter pinned,$(STACKS)),$(PY) -m pytest $(PYTEST_ARGS))
	$(if $(filter current,$(STACKS)),$(PY_CURRENT) -m pytest $(PYTEST_ARGS) || [ $$? = 5 ])

# The TFX pipeline on Fashion-MNIST, from ingestion to a model pushed to saved_models/vit/.
RUN_ARGS ?=
run: env
	$(PY) -m pipeline.run $(RUN_ARGS)

# Benchmarks against keras-hub (a benchmark-only extra in .venv-bench) and the matmul peak.
# `make bench BENCH=input_size BENCH_ARGS="--sizes=224,384"` runs another one.
BENCH ?= vit_throughput
BENCH_ARGS ?=
bench: env
	@bash tools/ensure_env.sh --bench
	PYTHONPATH=$(CURDIR):$(CURDIR)/.venv-bench $(PY) -m benchmarks.$(BENCH) $(BENCH_ARGS)

# Re-resolve the locks after editing requirements/requirements.in or current.in (about 20 s).
lock: env
	.venv/bin/uv pip compile --quiet --python-version 3.10 --python-platform x86_64-manylinux_2_17 \
	  requirements/requirements.in -o requirements/lock.txt
	.venv/bin/uv pip compile --quiet --python-version 3.12 --python-platform x86_64-manylinux_2_28 \
	  requirements/current.in -o requirements/current-lock.txt
	@echo "Re-resolve the bench and GPU extras too: uv pip compile ... -c requirements/lock.txt requirements/requirements.in requirements/bench.in (or gpu.in; see the header of requirements/bench-lock.txt and gpu-lock.txt)"

clean:
	rm -rf .venv .venv-current .venv-bench .pytest_cache saved_models/*/ build *.egg-info
