"""XLA compiler options per program on CPU hosts, chosen by measurement.

jaxlib 0.10 hands CPU dots, with the elementwise and reduction ops around them, to YNNPACK fusions.
On the project's x86-64 machine (an AMD EPYC) that made the BERT encoder's forward about 10% slower than XLA's own
(Eigen) dots (themselves 0.80-0.83x PyTorch's GEMM at the FFN shapes, `benchmarks/bench_cpu_gemm.py`); the
causal LMs (a scan over layers, RMSNorm, grouped attention) run faster with them (benchmarks/README.md "CPU speed";
`benchmarks/bench_cpu_options.py` times both choices). So the encoder's programs compile without YNNPACK
fusions under jaxlib < 0.12 and every other program keeps XLA's defaults.

The options are per program (`jax.jit(..., compiler_options=...)`): nothing process-wide (XLA_FLAGS)
is changed, accelerators never see them, and a jaxlib that does not know an option simply goes without.
"""
from __future__ import annotations

import functools
import platform

import jax
import numpy as np

NO_YNNPACK = {"xla_cpu_experimental_ynn_fusion_type": ""}  # XLA's own (Eigen) dots, no YNNPACK fusions
# jaxlib 0.12 (Python >= 3.12) builds its Eigen kernels with FMA and its YNNPACK fusions run the encoder 11-14%
# faster than without them (benchmarks/README.md "JAX 0.12 on Python 3.12"): there XLA's defaults are kept
JAXLIB_VERSION = tuple(int(part) for part in jax.lib.__version__.split(".")[:2])
# the encoder's forward (corpus and query embedding)
ENCODER: dict[str, str] = NO_YNNPACK if JAXLIB_VERSION < (0, 12) else {}
# LocalLM's scoring: XLA's defaults (YNNPACK fusions measured faster there)
LM_SCORING: dict[str, str] = {}


def options(program: dict[str, str], mesh) -> dict[str, str] | None:
    """`program`'s options for a jit over `mesh`: all of them on x86-64 CPU devices, those this jaxlib
    knows; None (XLA's defaults) on accelerators and other CPUs, where they were not measured."""
    if mesh.devices.flat[0].platform != "cpu" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    known = {name: value for name, value in program.items() if _known(name, value)}
    return known or None


@functools.lru_cache(maxsize=None)
def _known(name: str, value: str) -> bool:
    """Whether this jaxlib's CPU compiler accepts the option (compiles a one-op program once to find out)."""
    one = jax.device_put(np.float32(1), jax.local_devices(backend="cpu")[0])
    try:
        jax.jit(lambda x: x + 1, compiler_options={name: value}).lower(one).compile()
        return True
    except Exception:  # an unknown option: XLA raises at compile time
        return False
