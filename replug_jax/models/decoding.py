"""Greedy decoding through a key/value cache, on the device: one loop for the local backend's ensembles
(lm/local_generate.py: a question's K passes mixed each step) and the scoring server's requests
(server/engine.py: one row each).

The rows' cache already holds their prompts and `logits` are the next-token logits after them (kv_cache.extend).
Each step: `next_logprobs(logits)` gives each sequence's log-probs [B, V] (one row's log-softmax, or the mixture of
a question's passes), the argmax is taken, recorded with its log-prob (and, with `top`, the step's best `top`
tokens), and appended to the sequence's `rows` rows through the cache. A sequence is done at a stop token
(`stop_mask`) or after its `limits` tokens; the loop ends when every sequence is done, with no extend after the
last token.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from replug_jax.models import kv_cache


def row_logprobs(logits):
    """[B, V] logits -> [B, V] float32 log-probs: one row per sequence."""
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def greedy_decode(params, config, cache, logits, stop_mask, limits, done, *, steps: int, dtype,
                  next_logprobs=row_logprobs, rows: int = 1, top: int = 0):
    """Decode B sequences of `rows` cache rows each (module docstring).

    logits [B·rows, V]; stop_mask [V] or [B, V] bool; limits [B] int32 (<= steps); done [B] bool (sequences that
    generate nothing). Returns tokens [B, steps] int32, their log-probs [B, steps] float32, counts [B] (tokens
    generated, a stop token included) and, with top > 0, each step's best `top` (log-probs [B, steps, top] float32,
    ids [B, steps, top] int32; else None, None)."""
    tokens, lps, counts, tops, _, _ = _decode_loop(params, config, cache, logits, stop_mask, limits, done, steps=steps,
                                                   dtype=dtype, next_logprobs=next_logprobs, rows=rows, top=top,
                                                   extend_last=False)
    return tokens, lps, counts, tops


def decode_steps(params, config, cache, logits, stop_mask, limits, done, *, steps: int, dtype, top: int = 0):
    """`greedy_decode` of one row per sequence for `steps` steps at most, each chosen token appended to its row's
    cache (the last one too; a finished row's tokens are not): -> tokens, log-probs, counts, tops as greedy_decode's,
    the cache and the next-token logits [B, V] after each row's last token, to continue from."""
    return _decode_loop(params, config, cache, logits, stop_mask, limits, done, steps=steps, dtype=dtype,
                        next_logprobs=row_logprobs, rows=1, top=top, extend_last=True)


def append_tokens(params, config, cache, token, live, rows: int, dtype):
    """Each sequence's chosen token [B] appended to its `rows` rows of the cache ([B·rows, 1]; a sequence not `live`
    [B] appends nothing: mask 0) -> (next-token logits [B·rows, V], the cache): a decoding step's forward pass."""
    ids = jnp.repeat(token, rows)[:, None]
    return kv_cache.extend(params, config, cache, ids, jnp.repeat(live, rows)[:, None].astype(jnp.int32), dtype)


def _decode_loop(params, config, cache, logits, stop_mask, limits, done, *, steps, dtype, next_logprobs, rows, top,
                 extend_last):
    b = limits.shape[0]
    stops = jnp.broadcast_to(stop_mask, (b, stop_mask.shape[-1]))  # [B, V]
    width = max(top, 1)

    def choose(carry):
        step, cache, logits, tokens, lps, top_lps, top_ids, counts, done = carry
        logp = next_logprobs(logits)  # [B, V]
        token = jnp.argmax(logp, axis=-1).astype(jnp.int32)  # [B]
        lp = jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
        tokens = tokens.at[:, step].set(jnp.where(done, 0, token))
        lps = lps.at[:, step].set(jnp.where(done, 0.0, lp))
        if top:
            best_lps, best_ids = jax.lax.top_k(logp, top)  # [B, top]
            top_lps, top_ids = top_lps.at[:, step].set(best_lps), top_ids.at[:, step].set(best_ids.astype(jnp.int32))
        counts = counts + (~done).astype(jnp.int32)
        done = done | jnp.take_along_axis(stops, token[:, None], axis=-1)[:, 0] | (counts >= limits)

        def extend(cache):
            return append_tokens(params, config, cache, token, ~done, rows, dtype)

        last = jnp.all(done) if extend_last else jnp.all(done) | (step + 1 >= steps)
        logits, cache = jax.lax.cond(last, lambda c: (logits, c), extend, cache)
        return step + 1, cache, logits, tokens, lps, top_lps, top_ids, counts, done

    def cond(carry):
        step, *_, done = carry
        return (step < steps) & ~jnp.all(done)

    start = (jnp.zeros((), jnp.int32), cache, logits, jnp.zeros((b, steps), jnp.int32),
             jnp.zeros((b, steps), jnp.float32), jnp.zeros((b, steps, width), jnp.float32),
             jnp.zeros((b, steps, width), jnp.int32), jnp.zeros((b,), jnp.int32), done | (limits <= 0))
    _, cache, logits, tokens, lps, top_lps, top_ids, counts, _ = jax.lax.while_loop(cond, choose, start)
    return tokens, lps, counts, (top_lps, top_ids) if top else (None, None), cache, logits
