# The two commands of the README: `make test` and `make run`. Both first make
# .venv match requirements/lock.txt (reusing a cached install when it does).
SHELL := /bin/bash
PY := .venv/bin/python
export PYTHONPATH := $(CURDIR)
export TF_CPP_MIN_LOG_LEVEL ?= 2
PYTEST_ARGS ?=

.PHONY: env test run bench lock clean

env:
	@bash tools/ensure_env.sh

test: env
	$(PY) -m pytest $(PYTEST_ARGS)

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

# Re-resolve the lock after editing requirements/requirements.in (about 20 s).
lock: env
	.venv/bin/uv pip compile --quiet --python-version 3.10 --python-platform x86_64-manylinux_2_17 \
	  requirements/requirements.in -o requirements/lock.txt
	@echo "Re-resolve the bench and GPU extras too: uv pip compile ... -c requirements/lock.txt requirements/requirements.in requirements/bench.in (or gpu.in; see the header of requirements/bench-lock.txt and gpu-lock.txt)"

clean:
	rm -rf .venv .venv-bench .pytest_cache saved_models/*/ build *.egg-info
