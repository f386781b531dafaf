"""How every LM weight is split over the LM's ("data", "model") mesh: one table, first match wins.

The rules match a parameter's path ("layers/q_proj/kernel") and give its PartitionSpec (after the unsplit
layer axis of the blocks' stacked weights) and the unit its split dimension is cut in. Kernels are
flax's [in, out]: q/k/v/gate/up (and GPT-2's c_fc) split their output columns over "model", o/down (c_proj,
mlp_proj) their input rows, so each attention and MLP block needs one all-reduce; the embedding splits the
vocabulary rows, the untied LM head its vocabulary columns. Norms, position embeddings and the o/down biases
stay replicated. Attention is split by whole heads: q and o by the query heads, k and v by the KV heads, so a
shard never holds part of a head (which would make XLA reshard every layer); GPT-2's fused c_attn ([q | k | v]
in one kernel) stays whole, as a split would cut across q, k and v. A dimension whose units the model axis does
not divide (e.g. 3 KV heads on 2 model shards) stays whole, and that is logged.

Batches go over "data" only; the retriever and the LSR step keep their 1-D mesh (`sharding.data_mesh`).
"""
from __future__ import annotations

import logging
import re

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from replug_jax.models.causal_lm import STACKED_LAYERS
from replug_jax.parallel.sharding import DATA_AXIS, MODEL_AXIS

log = logging.getLogger(__name__)

HEADS, KV_HEADS = "heads", "kv_heads"  # a split dimension cut in whole query heads / whole KV heads
LM_PARTITION_RULES: tuple[tuple[str, P, str | None], ...] = (
    (r"embed_tokens/embedding$", P(MODEL_AXIS, None), None),  # [V, D]: vocabulary rows
    (r"q_proj/(kernel|bias)$", P(None, MODEL_AXIS), HEADS),  # [D, H·Dh] / [H·Dh] (the bias rule below fits it)
    (r"(k_proj|v_proj)/(kernel|bias)$", P(None, MODEL_AXIS), KV_HEADS),  # [D, Hkv·Dh]
    (r"(o_proj|c_proj)/kernel$", P(MODEL_AXIS, None), HEADS),  # [H·Dh, D]: attention output rows
    (r"(gate_proj|up_proj|c_fc)/kernel$", P(None, MODEL_AXIS), None),  # [D, F]
    (r"c_fc/bias$", P(MODEL_AXIS), None),  # [F]
    (r"(down_proj|mlp_proj)/kernel$", P(MODEL_AXIS, None), None),  # [F, D]
    (r"lm_head/kernel$", P(None, MODEL_AXIS), None),  # [D, V]: vocabulary columns
    (r".*", P(), None),  # c_attn (fused q|k|v), norms, position embeddings, o/down biases: replicated
)


def param_path(path) -> str:
    """A tree path as "layers/q_proj/kernel"."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def rule(path: str) -> tuple[P, str | None]:
    """The first rule's (PartitionSpec, unit of the split dimension) for a parameter path."""
    for pattern, spec, unit in LM_PARTITION_RULES:
        if re.search(pattern, path):
            return spec, unit
    raise AssertionError("the last rule matches everything")


def fitted_spec(spec: P, shape: tuple[int, ...], mesh: Mesh, path: str = "", units: int | None = None) -> P:
    """`spec` for an array of `shape` on `mesh`: axes the mesh does not have, or that do not divide their
    dimension (or, with `units`, the number of whole units, e.g. heads, the dimension holds), replaced by None
    (logged)."""
    fitted = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        size = mesh.shape.get(axis, 1) if axis is not None else 1
        count = dim if units is None else units
        if axis is not None and size > 1 and (dim % size or count % size):
            log.info("%s: %d %s not divisible by the %d-way %r axis; kept whole", path, count,
                     "units of dimension %d are" % dim if units is not None else "is", size, axis)
            axis = None
        fitted.append(axis if axis is not None and size > 1 else None)
    return P(*fitted)


def param_specs(params, mesh: Mesh, config):
    """The PartitionSpec of every LM parameter on `mesh` (a pytree like `params`; anything with a .shape), for
    the LM `config` (its head counts decide how attention splits). The blocks' stacked weights ("layers/...",
    leading axis = layer) get the rule's spec after an unsplit layer axis."""
    heads = {HEADS: config.num_heads, KV_HEADS: config.num_kv_heads}

    def spec(path, x):
        name = param_path(path)
        base, unit = rule(name)
        if name.endswith("/bias") and len(base) == 2:  # a bias is the kernel's output dimension alone
            base = P(base[1])
        stacked = P(None, *base) if name.startswith(STACKED_LAYERS + "/") else base
        return fitted_spec(stacked, tuple(x.shape), mesh, name, heads.get(unit))

    return jax.tree_util.tree_map_with_path(spec, params, is_leaf=lambda x: hasattr(x, "shape"))


def param_shardings(params, mesh: Mesh, config):
    """NamedShardings for every LM parameter on `mesh` (replicated on a mesh without a "model" axis)."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(params, mesh, config),
                        is_leaf=lambda x: isinstance(x, P))


def kv_cache_spec(num_kv_heads: int, mesh: Mesh) -> P:
    """The key/value cache [layers, rows, slots, Hkv, Dh] of ensembled generation: rows over "data", KV heads
    over "model" (replicated there when the heads do not divide)."""
    return fitted_spec(P(None, DATA_AXIS, None, MODEL_AXIS), (1, 0, 1, num_kv_heads, 1), mesh, "kv cache")
