"""Compute and weight dtypes of the models.

"auto" (every job's default) is bfloat16 on accelerators (TPU, GPU) and float32 on CPU. bfloat16 on a CPU is
opt-in: with AMX-BF16 it runs ~1.7-2.4x float32 (models/layers.py `dense`; docs/models.md says when to use it).
Whatever the dtype, softmax, norms, log-probabilities and the REPLUG ensemble's log-sum-exp run in float32
(models/layers.py, mixture.py); the retriever's LSR training keeps float32 weights.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

AUTO = "auto"


def default_dtype() -> jnp.dtype:
    """bfloat16 on TPU/GPU, float32 on CPU."""
    return jnp.dtype(jnp.bfloat16 if jax.default_backend() in ("tpu", "gpu", "cuda", "rocm") else jnp.float32)


def resolve(dtype) -> jnp.dtype:
    """A dtype from a name, a dtype, or None / "auto" (`default_dtype()`)."""
    if dtype is None or (isinstance(dtype, str) and dtype == AUTO):
        return default_dtype()
    return jnp.dtype(dtype)


def weight_dtype(dtype, param_dtype) -> jnp.dtype:
    """The weights' dtype: `param_dtype` when given, else the (resolved) compute dtype."""
    return resolve(dtype) if param_dtype is None else resolve(param_dtype)


def weights_option(param_dtype):
    """A config's param_dtype: None for "auto" or unset (the weights follow the compute dtype), else the dtype."""
    return None if param_dtype in (None, "", AUTO) else jnp.dtype(param_dtype)


def cast_floating(params, dtype):
    """`params` with every floating-point leaf in `dtype` (integer leaves untouched); a no-op where they are."""
    dtype = jnp.dtype(dtype)

    def cast(x):
        return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype else x

    return jax.tree.map(cast, params)


def matmuls(dtype):
    """The context a model is traced in: float32 compute gets true float32 matmuls ("highest"), where accelerators
    otherwise cut float32 short (TF32 on GPU: |Δ log p| up to 2.3e-3 at SmolLM2's shape on an H100, against 3e-6
    with this; bf16 passes on TPU). Other compute dtypes are traced as the caller's settings say."""
    if jnp.dtype(dtype) == jnp.float32:
        return jax.default_matmul_precision("highest")
    return contextlib.nullcontext()
