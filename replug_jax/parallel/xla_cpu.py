"""XLA compiler options per program on CPU hosts, chosen by measurement.

jaxlib hands CPU dots, with the elementwise and reduction ops around them, to YNNPACK fusions. Both programs keep
XLA's defaults now. The encoder compiled without YNNPACK fusions below jaxlib 0.12 until issue 72: with one row
count per length bucket (issue 62) the defaults embed faster on both hosts measured (AMD EPYC: 1.72-1.75x PyTorch
against 1.54-1.57x; Intel Xeon: 5-20% faster), and a bf16 encoder needs them (its dots reach AMX-BF16 through
YNNPACK alone: benchmarks/README.md "bf16 on CPU"). The causal LMs were measured faster with them from the start.
`benchmarks/bench_cpu_options.py` times the choices; `NO_YNNPACK` stays for it.

The options are per program (`jax.jit(..., compiler_options=...)`): nothing process-wide (XLA_FLAGS)
is changed, accelerators never see them, and a jaxlib that does not know an option simply goes without.
"""
from __future__ import annotations

import functools
import platform

import jax
import numpy as np

NO_YNNPACK = {"xla_cpu_experimental_ynn_fusion_type": ""}  # XLA's own (Eigen) dots, no YNNPACK fusions
JAXLIB_VERSION = tuple(int(part) for part in jax.lib.__version__.split(".")[:2])
# the encoder's forward (corpus and query embedding): XLA's defaults (YNNPACK fusions), the module docstring says why
ENCODER: dict[str, str] = {}
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
