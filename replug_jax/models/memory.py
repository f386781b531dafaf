"""Per-device memory of an LM on a ("data", "model") mesh, from shapes alone (`jax.eval_shape`: nothing allocated).

Weights are split by models/partition.py's rules; the key/value cache of ensembled generation
([layers, rows, slots, Hkv, Dh] for keys and for values) has its rows over "data" and its heads over "model".
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, PartitionSpec

from replug_jax.models import causal_lm, partition
from replug_jax.parallel.sharding import DATA_AXIS, MODEL_AXIS


def abstract_mesh(data: int, model: int) -> AbstractMesh:
    """A (data, model) mesh of sizes only: for planning without the devices."""
    return AbstractMesh((data, model), (DATA_AXIS, MODEL_AXIS))


@functools.lru_cache(maxsize=16)
def param_shapes(config: causal_lm.CausalLMConfig, dtype=jnp.bfloat16):
    """The LM's parameter tree as ShapeDtypeStructs in `dtype` (traced, never allocated)."""
    ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda i: causal_lm.CausalLM(config).init(jax.random.PRNGKey(0), i, jnp.ones_like(i)), ids)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.dtype(dtype)), shapes["params"])


def shard_bytes(shape: tuple[int, ...], itemsize: int, spec, mesh) -> int:
    """Bytes of one device's shard of an array of `shape` under `spec` on `mesh`."""
    dims = list(shape)
    for i, axis in enumerate(tuple(spec)):
        for name in (axis if isinstance(axis, tuple) else (axis,)):
            if name is not None:
                dims[i] //= mesh.shape[name]
    return math.prod(dims) * itemsize


def weight_bytes_per_device(config: causal_lm.CausalLMConfig, mesh, dtype=jnp.bfloat16) -> int:
    """One device's bytes of the LM's weights on `mesh` (the most any device holds: shards are equal)."""
    shapes = param_shapes(config, dtype)
    specs = partition.param_specs(shapes, mesh, config)
    specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    return sum(shard_bytes(s.shape, s.dtype.itemsize, spec, mesh) for s, spec in zip(jax.tree.leaves(shapes), specs))


def kv_cache_bytes_per_device(config: causal_lm.CausalLMConfig, mesh, rows_per_data_shard: int, slots: int,
                              dtype=jnp.bfloat16) -> int:
    """One device's bytes of the generation cache (keys and values) for `rows_per_data_shard` rows of `slots`."""
    data = mesh.shape[DATA_AXIS]
    shape = (config.num_layers, rows_per_data_shard * data, slots, config.num_kv_heads, config.dims_per_head)
    spec = partition.kv_cache_spec(config.num_kv_heads, mesh)
    return 2 * shard_bytes(shape, jnp.dtype(dtype).itemsize, spec, mesh)


def parameter_count(config: causal_lm.CausalLMConfig) -> int:
    return sum(math.prod(s.shape) for s in jax.tree.leaves(param_shapes(config)))
