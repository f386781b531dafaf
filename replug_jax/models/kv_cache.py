"""Key/value caches of `causal_lm.CausalLM` for generation and shared prefixes: an empty cache (`init_cache`), rows that
continue a one-row cache which they all read and none copies (`after_prefix`: REPLUG's passes after their few-shot
block), tokens appended with the next-token logits after them (`extend`), and scores of
some appended tokens read in the same pass (`extend_and_score`). For a batch whose rows are refilled as they finish
(server/decoding_batch.py): rows replaced by those of another cache (`insert_rows`), rows taken in a new order
(`take_rows`) and each row's tokens moved to the front of its slots (`compact`); for rows kept across requests
(server/prefix_cache.py): a row's later tokens forgotten (`truncate`) and its first slots alone (`first_slots`). A
cached token's key holds its position (rotary) and attention reads the slots through `key_mask` alone, so moving a
row's slots keeps its numbers.
"""
from __future__ import annotations

import jax.numpy as jnp

from replug_jax.models import layers, precision
from replug_jax.models.causal_lm import CausalLM, CausalLMConfig


def init_cache(config: CausalLMConfig, batch: int, slots: int, dtype=jnp.float32) -> dict:
    """An empty key/value cache of `slots` positions for `batch` rows:
    {"k", "v": [layers, B, S, Hkv, Dh], "key_mask": [B, S] (1 = a real token), "count": [B] real tokens (a shared
    prefix's included), "length": [] slots written}; a cache made by `after_prefix` also holds "prefix"."""
    return _empty((config.num_layers, batch, slots, config.num_kv_heads, config.dims_per_head), dtype)


def after_prefix(prefix: dict, rows: int, slots: int) -> dict:
    """A cache of `rows` rows and `slots` empty slots of their own that continue the one-row cache `prefix` (a shared
    prefix): each row attends to the prefix's keys and values, kept once as the cache's "prefix" (never copied to
    the rows: a 2,624-token few-shot block read by 10 passes was 95% of their caches), then to its own; positions go
    on from the prefix's tokens. k, v [layers, rows, slots, Hkv, Dh]; prefix k, v [layers, 1, P, Hkv, Dh]."""
    k = prefix["k"]
    own = _empty((k.shape[0], rows, slots) + k.shape[3:], k.dtype)
    return {**own, "count": jnp.broadcast_to(prefix["count"], (rows,)),
            "prefix": {name: prefix[name] for name in ("k", "v", "key_mask")}}


def _empty(shape: tuple[int, ...], dtype) -> dict:
    rows, slots = shape[1], shape[2]
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype), "key_mask": jnp.zeros((rows, slots), jnp.int32),
            "count": jnp.zeros((rows,), jnp.int32), "length": jnp.zeros((), jnp.int32)}


def extend(params, config: CausalLMConfig, cache: dict, input_ids, attention_mask, dtype=jnp.float32):
    """Append L tokens per row to the cache: -> (next-token logits after each row's last real token among
    them [B, V] float32, the new cache). Pads (mask 0) may sit anywhere (left, right, between tokens); they are
    never attended to."""
    no_targets = jnp.zeros((input_ids.shape[0], 0), jnp.int32)
    logits_, _, cache = extend_and_score(params, config, cache, input_ids, attention_mask, no_targets, dtype)
    return logits_, cache


def extend_and_score(params, config: CausalLMConfig, cache: dict, input_ids, attention_mask, target_positions,
                     dtype=jnp.float32):
    """`extend`, which also scores some of the appended tokens in the same pass: -> (next-token logits after each
    row's last real token [B, V], log p(token at p | tokens before p) at target_positions [B, T] (0 marks an empty
    slot: position 0 follows the cache and cannot be a target), the new cache). The LM head runs at T + 1
    positions per row."""
    width = attention_mask.shape[1]
    last = (width - 1 - jnp.argmax(attention_mask[:, ::-1] > 0, axis=-1)).astype(jnp.int32)[:, None]  # [B, 1]
    predict = jnp.concatenate([jnp.maximum(target_positions - 1, 0), last], axis=1)  # [B, T + 1]
    with precision.matmuls(dtype):
        out, cache = CausalLM(config, dtype).apply({"params": params}, input_ids, attention_mask, predict, cache)
    targets = jnp.take_along_axis(input_ids, target_positions, axis=1)  # [B, T]
    scores = jnp.where(target_positions > 0, layers.gather_logprobs(out[:, :-1], targets), 0.0)
    return out[:, -1], scores, cache


def insert_rows(cache: dict, new: dict, rows, end) -> dict:
    """`cache` with rows `rows` [n] replaced by the n rows of `new` (a cache of W slots): their earlier tokens
    masked out, `new`'s written at slots [end - W, end), so that they end where the written slots end and no other
    row's slots move on; `length` becomes the larger of its own and `end` (the caller leaves room: rows past the
    cache's are dropped, as a filler row of `new` is given one). k, v [layers, B, S, Hkv, Dh]; new's [layers, n, W,
    Hkv, Dh]."""
    slots = end - new["k"].shape[2] + jnp.arange(new["k"].shape[2])  # [W]
    at = (rows[:, None], slots[None, :])  # [n, W] each
    key_mask = cache["key_mask"].at[rows].set(0, mode="drop").at[at].set(new["key_mask"], mode="drop")
    return {"k": cache["k"].at[(slice(None),) + at].set(new["k"].astype(cache["k"].dtype), mode="drop"),
            "v": cache["v"].at[(slice(None),) + at].set(new["v"].astype(cache["v"].dtype), mode="drop"),
            "key_mask": key_mask, "count": cache["count"].at[rows].set(new["count"], mode="drop"),
            "length": jnp.maximum(cache["length"], end)}


def take_rows(cache: dict, rows) -> dict:
    """The cache's rows `rows` [B'] in that order; an index past the cache's rows gives an empty row."""
    take = lambda x, axis: jnp.take(x, rows, axis=axis, mode="fill", fill_value=0)  # noqa: E731
    return {"k": take(cache["k"], 1), "v": take(cache["v"], 1), "key_mask": take(cache["key_mask"], 0),
            "count": take(cache["count"], 0), "length": cache["length"]}


def truncate(cache: dict, count) -> dict:
    """Each row's first `count` real tokens ([B] or one for all) kept, the later ones masked out (never attended to,
    overwritten by nothing: `compact` drops them). For caches without a shared prefix (`after_prefix`)."""
    rank = jnp.cumsum(cache["key_mask"] > 0, axis=1)  # [B, S]: real tokens up to each slot
    keep = rank <= jnp.reshape(jnp.asarray(count, jnp.int32), (-1, 1))
    return {**cache, "key_mask": jnp.where(keep, cache["key_mask"], 0), "count": jnp.minimum(cache["count"], count)}


def first_slots(cache: dict, slots: int) -> dict:
    """The cache's first `slots` slots alone (where a compacted row's real tokens lie); `length` at most `slots`."""
    return {**{name: cache[name][:, :, :slots] for name in ("k", "v")}, "key_mask": cache["key_mask"][:, :slots],
            "count": cache["count"], "length": jnp.minimum(cache["length"], slots)}


def compact(cache: dict, slots: int) -> dict:
    """Each row's real tokens moved to the front of its slots, in their order, in a cache of `slots` slots (at least
    the most real tokens of any row); `length` becomes that most."""
    order = jnp.argsort(cache["key_mask"] == 0, axis=1, stable=True)[:, :slots]  # [B, slots] real slots first
    take = lambda x: jnp.take_along_axis(x, order[None, :, :, None, None], axis=2, mode="fill", fill_value=0)  # noqa: E731
    key_mask = jnp.take_along_axis(cache["key_mask"], order, axis=1)
    if slots > order.shape[1]:  # grown: empty slots appended
        grow = lambda x, axis: jnp.pad(x, [(0, slots - x.shape[axis]) if a == axis else (0, 0)  # noqa: E731
                                           for a in range(x.ndim)])
        k, v, key_mask = grow(take(cache["k"]), 2), grow(take(cache["v"]), 2), grow(key_mask, 1)
    else:
        k, v = take(cache["k"]), take(cache["v"])
    return {"k": k, "v": v, "key_mask": key_mask, "count": cache["count"],
            "length": key_mask.sum(axis=1).max().astype(jnp.int32)}
