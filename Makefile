# Quick start: `make demo` (install + main job on the offline default), `make test` (install + tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
WORKDIR ?= runs/demo

.PHONY: install install-test demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(PY)
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps -r requirements-assets.txt

install-test: install
	$(PIP) install -q -e ".[test]"

demo: install
	$(PY) -m replug_jax.main --config experiments/configs/demo.py --workdir $(WORKDIR)

test: install-test
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) runs
