# The two commands of the README: `make test` and `make run`. Both first make
# .venv match requirements/lock.txt (reusing a cached install when it does).
SHELL := /bin/bash
PY := .venv/bin/python
export PYTHONPATH := $(CURDIR)
export TF_CPP_MIN_LOG_LEVEL ?= 2
PYTEST_ARGS ?=

.PHONY: env test run lock clean

env:
	@bash tools/ensure_env.sh

test: env
	$(PY) -m pytest $(PYTEST_ARGS)

# The TFX pipeline on Fashion-MNIST, from ingestion to a model pushed to saved_models/vit/.
RUN_ARGS ?=
run: env
	$(PY) -m pipeline.run $(RUN_ARGS)

# Re-resolve the lock after editing requirements/requirements.in (about 20 s).
lock: env
	.venv/bin/uv pip compile --quiet --python-version 3.10 --python-platform x86_64-manylinux_2_17 \
	  requirements/requirements.in -o requirements/lock.txt

clean:
	rm -rf .venv .pytest_cache saved_models/*/ build *.egg-info
