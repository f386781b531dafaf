"""How every LM weight is split over the LM's ("data", "model") mesh: one table, first match wins.

The rules match a parameter's path ("layers/q_proj/kernel") and give its PartitionSpec (after the unsplit
layer axis of the blocks' stacked weights). Kernels are
flax's [in, out]: q/k/v/gate/up (and GPT-2's c_attn, c_fc) split their output columns over "model",
o/down (c_proj, mlp_proj) their input rows, so each attention and MLP block needs one all-reduce; the
embedding splits the vocabulary rows, the untied LM head its vocabulary columns. Norms, position
embeddings and the o/down biases stay replicated. A dimension the model axis does not divide (e.g. 2 KV
heads on 4 model shards) falls back to replicated for that dimension, and that is logged.

Batches go over "data" only; the retriever and the LSR step keep their 1-D mesh (`sharding.data_mesh`).
"""
from __future__ import annotations

import logging
import re

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from replug_jax.models.causal_lm import STACKED_LAYERS
from replug_jax.sharding import DATA_AXIS, MODEL_AXIS

log = logging.getLogger(__name__)

LM_PARTITION_RULES: tuple[tuple[str, P], ...] = (
    (r"embed_tokens/embedding$", P(MODEL_AXIS, None)),  # [V, D]: vocabulary rows
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj|c_attn|c_fc)/kernel$", P(None, MODEL_AXIS)),  # [D, out]
    (r"(q_proj|k_proj|v_proj|c_attn|c_fc)/bias$", P(MODEL_AXIS)),  # [out]
    (r"(o_proj|down_proj|c_proj|mlp_proj)/kernel$", P(MODEL_AXIS, None)),  # [in, D]
    (r"lm_head/kernel$", P(None, MODEL_AXIS)),  # [D, V]: vocabulary columns
    (r".*", P()),  # norms, position embeddings, o/down biases: replicated
)


def param_path(path) -> str:
    """A tree path as "layers/q_proj/kernel"."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def rule_spec(path: str) -> P:
    """The first rule's PartitionSpec for a parameter path."""
    for pattern, spec in LM_PARTITION_RULES:
        if re.search(pattern, path):
            return spec
    raise AssertionError("the last rule matches everything")


def fitted_spec(spec: P, shape: tuple[int, ...], mesh: Mesh, path: str = "") -> P:
    """`spec` for an array of `shape` on `mesh`: axes the mesh does not have, or that do not divide their
    dimension, replaced by None (logged)."""
    fitted = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        size = mesh.shape.get(axis, 1) if axis is not None else 1
        if axis is not None and size > 1 and dim % size:
            log.info("%s: dimension %d is not divisible by the %d-way %r axis; replicated", path, dim, size, axis)
            axis = None
        fitted.append(axis if axis is not None and size > 1 else None)
    return P(*fitted)


def param_specs(params, mesh: Mesh):
    """The PartitionSpec of every LM parameter on `mesh` (a pytree like `params`; anything with a .shape). The
    blocks' stacked weights ("layers/...", leading axis = layer) get the rule's spec after an unsplit layer axis."""
    def spec(path, x):
        name = param_path(path)
        rule = rule_spec(name)
        return fitted_spec(P(None, *rule) if name.startswith(STACKED_LAYERS + "/") else rule, tuple(x.shape), mesh, name)

    return jax.tree_util.tree_map_with_path(spec, params, is_leaf=lambda x: hasattr(x, "shape"))


def param_shardings(params, mesh: Mesh):
    """NamedShardings for every LM parameter on `mesh` (replicated on a mesh without a "model" axis)."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(params, mesh),
                        is_leaf=lambda x: isinstance(x, P))


def kv_cache_spec(num_kv_heads: int, mesh: Mesh) -> P:
    """The key/value cache [layers, rows, slots, Hkv, Dh] of ensembled generation: rows over "data", KV heads
    over "model" (replicated there when the heads do not divide)."""
    return fitted_spec(P(None, DATA_AXIS, None, MODEL_AXIS), (1, 0, 1, num_kv_heads, 1), mesh, "kv cache")
