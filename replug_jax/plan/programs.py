"""The device programs the jobs run, as the jobs jit them, over abstract arguments on a TPU mesh: nothing is
allocated, nothing runs, and each is lowered for the TPU compiler (`Program.lower`).

Each builder calls the function the job itself jits (`local.scoring_function` through `sharding.batch_program`,
`local_generate.generation_program`, `shared_prefix.prefix_programs`, `dense.embedding_function`,
`train.step.make_train_step`, `device_index.search_program`) with `jax.ShapeDtypeStruct`s placed as the job
places its arrays: the LM's weights by models/partition.py, batches over the mesh's "data" axis. A Program also
carries its model FLOPs (our count: the matmuls of the model at the program's shapes, padding included) and the
units it processes per call (tokens, passages, steps), for MFU and throughput.

An LM program lowers at its full depth (the job's own program: its memory) or at a given depth with the blocks
unrolled (its costs: costs.py says why).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from replug_jax.lm import local, local_generate, shared_prefix
from replug_jax.models import architectures, causal_lm, kv_cache, partition
from replug_jax.models import encoder as encoder_model
from replug_jax.parallel import sharding
from replug_jax.retrieval import dense, device_index


@dataclasses.dataclass
class Program:
    """One device program at one shape. `build(config)` -> (jitted, abstract args) for the LM `config` (the LM's own,
    or one of its depth for costs); `layers`: the LM's depth where the program holds its block stack, else None
    (costs read from the program itself). `role`: "job" (a program the job runs: its memory is what the chips hold)
    or "part" (the body of a job program's loop, or its prefill: compiled for its costs)."""

    name: str
    kind: str
    build: Callable
    config: object  # the LM's CausalLMConfig (None: no LM in the program)
    chips: int
    units: float  # per call, the whole mesh
    unit: str
    model_flops: float  # per call, the whole mesh
    role: str = "job"
    participants: int = 1  # chips of the mesh axis its collectives run over (the model axis; data for the step)

    @property
    def layers(self) -> int | None:
        return None if self.config is None else self.config.num_layers

    def lower(self, depth: int | None = None):
        """The program lowered for the compiler: the job's own (depth None), or with `depth` unrolled blocks."""
        config = self.config if depth is None else dataclasses.replace(self.config, num_layers=depth)
        jitted, args = self.build(config)
        with causal_lm.layers_unrolled() if depth is not None else contextlib.nullcontext():
            return jitted.lower(*args)


def abstract(shape, dtype, placed) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=placed)


def lm_params(config, dtype, mesh):
    """The LM's weights as abstract arrays in `dtype`, placed by models/partition.py's rules."""
    shapes = architectures.param_shapes(config, jnp.dtype(dtype))
    return jax.tree.map(lambda s, placed: abstract(s.shape, s.dtype, placed), shapes,
                        partition.param_shardings(shapes, mesh, config))


def encoder_params(config, dtype, mesh):
    """The encoder's weights as abstract arrays in `dtype`, replicated (the retriever's mesh is data only)."""
    ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda i: encoder_model.BertEncoder(config).init(jax.random.PRNGKey(0), i,
                                                                             jnp.ones_like(i)), ids)["params"]
    return jax.tree.map(lambda s: abstract(s.shape, dtype, sharding.replicated(mesh)), shapes)


def lm_flops(config, tokens: float, attended: float, predicted: float) -> float:
    """Model FLOPs of a causal LM forward: `tokens` tokens through every block, each attending to `attended` keys
    (on average), the LM head at `predicted` positions."""
    c, dh = config, config.dims_per_head
    projections = 2 * (2 * c.hidden_size * c.num_heads * dh + 2 * c.hidden_size * c.num_kv_heads * dh)  # q, o; k, v
    mlp = 2 * c.hidden_size * c.intermediate_size * (2 if c.arch == "gpt2" else 3)
    attention = 4 * c.num_heads * dh * attended  # q·k and p·v
    return tokens * c.num_layers * (projections + mlp + attention) + predicted * 2 * c.hidden_size * c.vocab_size


def encoder_flops(config, tokens: float, length: float) -> float:
    """Model FLOPs of a BERT forward over `tokens` tokens in rows of `length`."""
    c = config
    per_token = 2 * 4 * c.hidden_size ** 2 + 2 * 2 * c.hidden_size * c.intermediate_size + 4 * c.hidden_size * length
    return tokens * c.num_layers * per_token


def _batch(mesh):
    return sharding.batch_sharding(mesh)


def _cache_args(config, dtype, mesh, rows: int, slots: int, prefix: int):
    """The rows' key/value cache after a shared prefix of `prefix` slots (`kv_cache.after_prefix`): `rows` rows over
    "data", heads over "model" (`local_generate.split_rows`'s layout), the prefix's one row beside them."""
    shapes = jax.eval_shape(lambda: kv_cache.init_cache(config, rows, slots, dtype))
    heads = NamedSharding(mesh, partition.kv_cache_spec(config.num_kv_heads, mesh))
    placed = {"k": heads, "v": heads, "key_mask": _batch(mesh), "count": _batch(mesh),
              "length": sharding.replicated(mesh)}
    shared = _prefix_cache_args(config, dtype, mesh, prefix)
    return {**{name: abstract(s.shape, s.dtype, placed[name]) for name, s in shapes.items()},
            "prefix": {name: shared[name] for name in ("k", "v", "key_mask")}}


def _prefix_cache_args(config, dtype, mesh, prefix: int):
    """The one-row cache of a shared prefix: replicated rows, heads over "model"."""
    shapes = jax.eval_shape(lambda: kv_cache.init_cache(config, 1, prefix, dtype))
    spec = partition.kv_cache_spec(config.num_kv_heads, mesh)
    heads = NamedSharding(mesh, P(None, None, *tuple(spec)[2:]))
    placed = {"k": heads, "v": heads}
    return {name: abstract(s.shape, s.dtype, placed.get(name, sharding.replicated(mesh))) for name, s in shapes.items()}


def model_axis(mesh) -> int:
    return mesh.shape.get(sharding.MODEL_AXIS, 1)


def scoring(config, dtype, mesh, rows: int, length: int, targets: int, name: str = "LM scoring") -> Program:
    """LocalLM.score's program for one bucket: rows [rows, length], `targets` scored positions per row."""
    def build(cfg):
        params = lm_params(cfg, dtype, mesh)
        jitted = sharding.batch_program(local.scoring_function(cfg, dtype), mesh,
                                        jax.tree.map(lambda a: a.sharding, params), local.SCORING_INPUTS)
        ids = abstract((rows, length), jnp.int32, _batch(mesh))
        at = abstract((rows, targets), jnp.int32, _batch(mesh))
        return jitted, (params, ids, ids, at, at)

    flops = lm_flops(config, rows * length, length / 2, rows * targets)
    return Program(f"{name} [{rows} x {length}, {targets} scored]", "scoring", build, config, mesh.devices.size,
                   rows * length, "tokens", flops, participants=model_axis(mesh))


def prefix_cache(config, dtype, mesh, prefix: int) -> Program:
    """PrefixScorer's first program: a shared prefix [1, prefix] into its key/value cache."""
    def build(cfg):
        jitted, _ = shared_prefix.prefix_programs(cfg, dtype, mesh)
        ids = abstract((1, prefix), jnp.int32, sharding.replicated(mesh))
        return jitted, (lm_params(cfg, dtype, mesh), ids, ids)

    return Program(f"shared prefix cache [1 x {prefix}]", "prefix", build, config, mesh.devices.size, prefix,
                   "tokens", lm_flops(config, prefix, prefix / 2, 1), participants=model_axis(mesh))


def after_prefix(config, dtype, mesh, prefix: int, rows: int, width: int, targets: int) -> Program:
    """PrefixScorer's second program: rows [rows, width] scored after the prefix's cache."""
    def build(cfg):
        _, jitted = shared_prefix.prefix_programs(cfg, dtype, mesh)
        ids = abstract((rows, width), jnp.int32, _batch(mesh))
        at = abstract((rows, targets), jnp.int32, _batch(mesh))
        return jitted, (lm_params(cfg, dtype, mesh), _prefix_cache_args(cfg, dtype, mesh, prefix), ids, ids, at, at)

    flops = lm_flops(config, rows * width, prefix + width / 2, rows * targets)
    return Program(f"scoring after the prefix [{rows} x {width} after {prefix}, {targets} scored]", "scoring",
                   build, config, mesh.devices.size, rows * width, "tokens", flops, participants=model_axis(mesh))


@dataclasses.dataclass(frozen=True)
class GenerationShape:
    """One generation call's buckets (local_generate's): `questions` questions of `passes` passes each, a shared
    prefix of `prefix` tokens, passes padded to `width`, `query` posterior query positions (0: none), `steps`
    decoding steps, `keep` passes decoded."""

    questions: int
    passes: int
    prefix: int
    width: int
    query: int
    steps: int
    keep: int

    @property
    def slots(self) -> int:
        """Each row's own cache slots (the prefix is read from its one row: kv_cache.after_prefix)."""
        return self.width + self.steps


def _generation_inputs(config, dtype, mesh, g: GenerationShape):
    rep, rows = sharding.replicated(mesh), g.questions * g.passes
    prefix = abstract((1, g.prefix), jnp.int32, rep)
    ids = abstract((rows, g.width), jnp.int32, _batch(mesh))
    weights = abstract((g.questions, g.passes), jnp.float32, _batch(mesh))
    targets = abstract((rows, g.query), jnp.int32, _batch(mesh))
    return (lm_params(config, dtype, mesh), prefix, prefix, ids, ids, weights, targets,
            abstract((), jnp.float32, rep))


def generation(config, dtype, mesh, g: GenerationShape) -> Program:
    """LocalGenerator's program: prefill and the whole decoding loop (its memory is what the chips hold)."""
    def build(cfg):
        jitted = local_generate.generation_program(cfg, dtype, mesh, g.slots, g.steps, g.keep)
        rep = sharding.replicated(mesh)
        return jitted, _generation_inputs(cfg, dtype, mesh, g) + (abstract((cfg.vocab_size,), jnp.bool_, rep),
                                                                   abstract((), jnp.int32, rep),
                                                                   abstract((), jnp.bool_, rep))  # average_logits

    return Program(f"generation [{g.questions} questions x {g.passes} passes of {g.slots} slots after {g.prefix}, "
                   f"{g.steps} steps]",
                   "generation", build, config, mesh.devices.size, g.questions, "questions", 0.0,
                   participants=model_axis(mesh))


def prefill(config, dtype, mesh, g: GenerationShape) -> Program:
    """The prefill part of the generation program (`local_generate.prefill`), for its costs."""
    def build(cfg):
        jitted = jax.jit(functools.partial(local_generate.prefill, config=cfg, dtype=dtype, slots=g.slots, mesh=mesh,
                                           keep=g.keep))
        return jitted, _generation_inputs(cfg, dtype, mesh, g)

    rows = g.questions * g.passes
    flops = (lm_flops(config, g.prefix, g.prefix / 2, 1)
             + lm_flops(config, rows * g.width, g.prefix + g.width / 2, rows * (g.query + 1)))
    return Program(f"generation prefill [1 x {g.prefix} prefix, {rows} x {g.width} passes]", "prefill", build,
                   config, mesh.devices.size, g.prefix + rows * g.width, "tokens", flops, role="part",
                   participants=model_axis(mesh))


def decode_step(config, dtype, mesh, g: GenerationShape) -> Program:
    """One step of the generation program's decoding loop (`local_generate.decode_step`), for its costs."""
    rows = g.questions * g.keep

    def build(cfg):
        jitted = jax.jit(functools.partial(local_generate.decode_step, config=cfg, dtype=dtype))
        logits = abstract((rows, cfg.vocab_size), jnp.float32, _batch(mesh))
        weights = abstract((g.questions, g.keep), jnp.float32, _batch(mesh))
        return jitted, (lm_params(cfg, dtype, mesh), _cache_args(cfg, dtype, mesh, rows, g.slots, g.prefix), logits,
                        weights, abstract((), jnp.bool_, sharding.replicated(mesh)))  # average_logits (FlashRAG's)

    flops = lm_flops(config, rows, g.prefix + g.width + g.steps / 2, rows)
    return Program(f"decode step [{g.questions} questions x {g.keep} passes of {g.slots} slots after {g.prefix}]",
                   "decode", build,
                   config, mesh.devices.size, g.questions, "question-tokens", flops, role="part",
                   participants=model_axis(mesh))


def embedding(config, dtype, mesh, rows: int, length: int, normalize: bool = True, name: str = "embedding") -> Program:
    """DenseEncoder.embed's program for one bucket: [rows, length] -> [rows, D]."""
    def build(_):
        params = encoder_params(config, dtype, mesh)
        jitted = sharding.batch_program(dense.embedding_function(config, normalize, dtype), mesh,
                                        sharding.replicated(mesh), 2)
        ids = abstract((rows, length), jnp.int32, _batch(mesh))
        return jitted, (params, ids, ids)

    return Program(f"{name} [{rows} x {length}]", "embedding", build, None, mesh.devices.size, rows, "passages",
                   encoder_flops(config, rows * length, length))


def train_step(config, dtype, mesh, *, batch: int, k: int, query_tokens: int, doc_tokens: int, query_side: bool,
               learning_rate: float = 2e-5, steps: int = 1000, gamma: float = 0.1, beta: float = 0.1,
               direction: str = "pr_q", normalize: bool = True, recompute: bool = False) -> Program:
    """The LSR train step (`train.step.make_train_step`): the retriever's forward and backward over a batch's queries
    and (both sides trained) documents, and the optax update of float32 weights, replicated; the batch over "data".
    `recompute`: the backward pass recomputes the layers' activations (recompute_activations)."""
    from replug_jax.train import step as train_step_lib

    def build(_):
        optimizer = train_step_lib.make_optimizer(learning_rate, steps)
        weights = jax.tree.map(lambda a: abstract(a.shape, jnp.float32, a.sharding), encoder_params(config, jnp.float32,
                                                                                                     mesh))
        opt_state = jax.eval_shape(optimizer.init, weights)
        rep = sharding.replicated(mesh)
        state = {"params": weights, "opt_state": jax.tree.map(lambda a: abstract(a.shape, a.dtype, rep), opt_state),
                 "step": abstract((), jnp.int32, rep)}
        placed = _batch(mesh)
        arrays = {"query_ids": abstract((batch, query_tokens), jnp.int32, placed),
                  "query_mask": abstract((batch, query_tokens), jnp.int32, placed),
                  "doc_valid": abstract((batch, k), jnp.bool_, placed),
                  "lm_scores": abstract((batch, k), jnp.float32, placed)}
        if query_side:
            arrays["doc_embeddings"] = abstract((batch, k, config.hidden_size), jnp.float32, placed)
        else:
            arrays.update(doc_ids=abstract((batch, k, doc_tokens), jnp.int32, placed),
                          doc_mask_tokens=abstract((batch, k, doc_tokens), jnp.int32, placed))
        jitted = train_step_lib.make_train_step(config, optimizer, mesh, gamma=gamma, beta=beta, direction=direction,
                                                normalize=normalize, dtype=dtype, recompute=recompute).jitted
        return jitted, (state, arrays)

    forward = encoder_flops(config, batch * query_tokens, query_tokens) + (
        0 if query_side else encoder_flops(config, batch * k * doc_tokens, doc_tokens))
    side = ("query side" if query_side else "both sides") + (", recomputed" if recompute else "")
    return Program(f"LSR train step [batch {batch}, k {k}, {side}]", "train", build, None, mesh.devices.size, 1,
                   "steps", 3 * forward, participants=mesh.devices.size)


def search(mesh, queries: int, count: int, dim: int, depth: int, dtype) -> Program:
    """DeviceIndex's exact search: queries [Q, D] against the [N, D] matrix split over every device."""
    devices = mesh.devices.size
    padded = sharding.round_up(count, devices)

    def build(_):
        jitted = device_index.search_program(depth, count, padded // devices, mesh)
        q = abstract((queries, dim), dtype, _batch(mesh))
        matrix = abstract((padded, dim), dtype, NamedSharding(mesh, P(sharding.DATA_AXIS, None)))
        return jitted, (q, matrix)

    return Program(f"device exact search [{queries} queries, {count:,} rows, top {depth}]", "search", build, None,
                   devices, queries, "queries", 2.0 * queries * padded * dim, participants=devices)
