"""Ensembled greedy decoding on the local JAX backend (the contract's `generate`, see lm/blackbox.py).

For B questions with K passes each, the rows are B·K sequences `prefix ∘ context_i`:
  1. the shared prefix (few-shot block) is run ONCE, as one row, into a key/value cache;
  2. its cache is copied to the B·K rows and each pass's own context tokens are appended; with a
     `PrefillPosterior` the same pass scores each pass's query x, and the weights become the posterior's
     (λ ∝ exp(log λ + α · log p(x | prefix, d)), the `keep` best of each question), fixed from then on, and
     only the kept passes' rows go on;
  3. a `lax.while_loop` decodes: mix the K next-token distributions of each question with λ
     (`mixture.mixed_logprobs_jax`), take the argmax, append it to all K passes (one
     token per row per step through the cache), until every question has emitted a stop token
     or `max_new_tokens`.
Shapes are bucketed (prefix, context and new-token lengths; questions per batch), so the jitted
function compiles once per bucket; rows are split over the mesh's "data" axis by question, so a
question's K passes stay on one data shard; the key/value cache's heads are split over "model".
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from replug_jax.lm.blackbox import (
    Generation,
    check_generation_inputs,
    check_mixing,
    generation_prompt_ids,
    query_token_count,
)
from replug_jax.method import logit_average, mixture, posterior as posterior_module
from replug_jax.method.posterior import PrefillPosterior
from replug_jax.models import decoding, kv_cache, partition
from replug_jax.models.detokenize import whole_characters
from replug_jax.models.stop_strings import StopMasks, cut_at_stop, tokens_through_stop
from replug_jax.parallel import sharding

NEW_TOKEN_MULTIPLE = 16  # max_new_tokens is padded to a multiple of this (the loop stops at the real limit)
CONTEXT_MULTIPLE = 16  # each pass's own tokens are padded to a multiple of this (the prefix: LocalLM's multiple)


def steps_bucket(max_new_tokens: int) -> int:
    """Decoding steps of a call's program: max_new_tokens padded (the loop stops at the real limit)."""
    return sharding.round_up(max_new_tokens, NEW_TOKEN_MULTIPLE)


def prefix_bucket(tokens: int, length_multiple: int) -> int:
    """Padded length of the shared prefix's one row."""
    return sharding.round_up(max(tokens, 1), length_multiple)


def context_bucket(longest: int, max_length: int) -> int:
    """Padded length of the passes' own tokens (the longest pass of the call)."""
    return sharding.length_bucket(longest, CONTEXT_MULTIPLE, max_length)


def query_bucket(longest: int) -> int:
    """Query positions scored per pass for the posterior (0: none)."""
    return sharding.round_up(longest, CONTEXT_MULTIPLE) if longest else 0


def mixture_decode(params, config, cache, logits, log_weights, stop_mask, limit, average_logits=False, *,
                   steps: int, dtype):
    """Greedy decoding of the λ-mixture (models/decoding.py), from rows whose next-token `logits` [B·K, V] are given.

    log_weights [B, K] (-inf: no pass); stop_mask [V] bool; limit: tokens to generate (<= steps); average_logits
    (a traced bool): FlashRAG's logit average with weights log w instead (`mixed_next_logprobs`). Returns tokens
    [B, steps] int32, their mixture log-probs [B, steps] float32 and counts [B] (tokens generated, a stop token
    included)."""
    b, k = log_weights.shape
    valid = log_weights > -jnp.inf  # [B, K]
    limits = jnp.full((b,), limit, jnp.int32)
    tokens, lps, counts, _ = decoding.greedy_decode(params, config, cache, logits, stop_mask, limits,
                                                    ~jnp.any(valid, axis=-1), steps=steps, dtype=dtype,
                                                    next_logprobs=functools.partial(
                                                        mixed_next_logprobs, log_weights=log_weights,
                                                        average_logits=average_logits), rows=k)
    return tokens, lps, counts


def mixed_next_logprobs(logits, log_weights, average_logits=False):
    """The λ-mixture of each question's K passes: next-token logits [B·K, V], log λ [B, K] (-inf: no pass) ->
    log-probs [B, V]. average_logits (a bool, traced or not): FlashRAG's average of the logits with weights log w
    instead (method/logit_average.py), for comparison; one program holds both, only the chosen one runs."""
    def probabilities(logits, log_weights):
        b, k = log_weights.shape
        per_pass = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(b, k, -1)
        return mixture.mixed_logprobs_jax(per_pass, log_weights, log_weights > -jnp.inf, 1.0)

    return jax.lax.cond(average_logits, logit_average.logit_average_jax, probabilities, logits, log_weights)


def decode_step(params, cache, logits, log_weights, average_logits=False, *, config, dtype):
    """One step of `mixture_decode`'s loop for every question: the mixture's argmax appended to each of its passes
    -> (next-token logits [B·K, V], the cache). The loop body's work, compiled alone by the TPU plan (XLA's cost
    analysis counts a loop's body once, whatever its trip count: replug_jax/plan/costs.py)."""
    token = jnp.argmax(mixed_next_logprobs(logits, log_weights, average_logits), axis=-1).astype(jnp.int32)  # [B]
    return decoding.append_tokens(params, config, cache, token, jnp.ones_like(token, bool), log_weights.shape[1],
                                  dtype)


def split_rows(cache: dict, config, mesh) -> dict:
    """The cache's keys and values laid out as the rows' batch: rows over "data", heads over "model"."""
    split = NamedSharding(mesh, partition.kv_cache_spec(config.num_kv_heads, mesh))
    return {**cache, **{name: jax.lax.with_sharding_constraint(cache[name], split) for name in ("k", "v")}}


def gather_kept_rows(cache: dict, logits, log_weights, keep: int, config, mesh):
    """Each question's `keep` passes of highest weight, in pass order, as the only rows that go on decoding (the
    others weigh nothing after re-ranking): cache rows and next-token logits [B·K, ...] -> [B·keep, ...], log λ
    [B, K] -> [B, keep]."""
    b, k = log_weights.shape
    top = jnp.sort(jax.lax.top_k(log_weights, keep)[1], axis=1)  # [B, keep]
    rows = (jnp.arange(b)[:, None] * k + top).reshape(-1)  # [B·keep]
    cache = {**cache, "k": cache["k"][:, rows], "v": cache["v"][:, rows], "key_mask": cache["key_mask"][rows],
             "count": cache["count"][rows]}
    return split_rows(cache, config, mesh), logits[rows], jnp.take_along_axis(log_weights, top, axis=1)


def prefill(params, prefix_ids, prefix_mask, ids, mask, log_weights, query_targets, alpha, *, config, dtype, slots,
            mesh, keep):
    """Prefix once, copied to every row; each row's own tokens (scoring the query's, `query_targets` [B·K, T], for
    the posterior weights when T > 0), the `keep` best passes kept -> (cache, next-token logits [B·keep, V],
    log λ [B, K], the decoding's log λ [B, keep], log p(x | prefix, d) [B, K])."""
    prefix = kv_cache.init_cache(config, 1, prefix_ids.shape[1], dtype)
    _, prefix = kv_cache.extend(params, config, prefix, prefix_ids, prefix_mask, dtype)  # [1, P]: the shared prefix
    cache = split_rows(kv_cache.after_prefix(prefix, ids.shape[0], slots), config, mesh)  # rows read it, never copy it
    # [B·K, V] after each pass's tokens; [B·K, T] its query tokens' log-probs
    logits, query_lps, cache = kv_cache.extend_and_score(params, config, cache, ids, mask, query_targets, dtype)
    query_ll = query_lps.sum(axis=1).reshape(log_weights.shape)  # [B, K]
    decode_weights = log_weights
    if query_targets.shape[1]:
        log_weights = decode_weights = posterior_module.prefill_log_weights(log_weights, query_ll, alpha, keep)
        if keep < log_weights.shape[1]:  # re-ranked: only the kept passes decode
            cache, logits, decode_weights = gather_kept_rows(cache, logits, log_weights, keep, config, mesh)
    return cache, logits, log_weights, decode_weights, query_ll


def _run(params, prefix_ids, prefix_mask, ids, mask, log_weights, query_targets, alpha, stop_mask, limit,
         average_logits, *, config, dtype, slots, steps, mesh, keep):
    """`prefill`, then `mixture_decode` -> (tokens, log-probs, counts, log λ [B, K], log p(x | prefix, d) [B, K]);
    average_logits: a bool scalar (FlashRAG's mixing, `mixed_next_logprobs`)."""
    cache, logits, log_weights, decode_weights, query_ll = prefill(
        params, prefix_ids, prefix_mask, ids, mask, log_weights, query_targets, alpha, config=config, dtype=dtype,
        slots=slots, mesh=mesh, keep=keep)
    out = mixture_decode(params, config, cache, logits, decode_weights, stop_mask, limit, average_logits, steps=steps,
                         dtype=dtype)
    return (*out, log_weights, query_ll)


def generation_program(config, dtype, mesh, slots: int, steps: int, keep: int):
    """The jitted `_run` for one bucket (cache slots, decoding steps, passes kept), as `LocalGenerator` runs it: on a
    mesh spanning processes every process decodes the same questions in lockstep and gets every row back (the rows
    are split over "data", which may span the processes), replicated. Also what the TPU plan compiles."""
    out = sharding.replicated(mesh) if sharding.spans_processes(mesh) else None
    return jax.jit(functools.partial(_run, config=config, dtype=dtype, slots=slots, steps=steps, mesh=mesh,
                                     keep=keep), out_shardings=out)


class LocalGenerator:
    """`generate` for a LocalLM: tokenises by the contract's rule, buckets, runs `_run`, decodes to text."""

    def __init__(self, lm, questions_per_batch: int):
        self.lm = lm
        self.questions_per_batch = sharding.round_up(questions_per_batch, sharding.data_size(lm.mesh))
        self._stop_mask = StopMasks(lm.tokenizer, lm.config.vocab_size)
        self._jitted: dict[tuple, object] = {}

    def generate(self, contexts, log_weights, *, max_new_tokens: int, stop=("\n",), shared_prefix: str = "",
                 progress: bool = False, posterior: PrefillPosterior | None = None,
                 on_answer=None, mixing: str = "probabilities") -> list[Generation]:
        weights = check_generation_inputs(contexts, log_weights, max_new_tokens)  # [B, K]
        average_logits = np.bool_(check_mixing(mixing, posterior) == "logits")
        lm = self.lm
        prompt = functools.partial(generation_prompt_ids, lm.tokenizer, shared_prefix, max_length=lm.max_length,
                                   max_new_tokens=max_new_tokens, start_id=lm.start_id)
        passes = [[prompt(c) for c in ctx] for ctx in contexts]  # (prefix ids, context ids) per pass
        prefix = passes[0][0][0]
        rows = [[ids for _, ids in q] for q in passes]
        query_lengths = self._query_lengths(contexts, rows, posterior)  # [B][K] tokens of x per pass (0: none)
        stop_mask = self._stop_mask(tuple(stop))
        steps = steps_bucket(max_new_tokens)
        p_len = prefix_bucket(len(prefix), lm.length_multiple)
        prefix_ids, prefix_mask = sharding.pad_rows([prefix], p_len, lm.pad_id, 1)
        order = np.argsort([max(len(r) for r in q) for q in rows], kind="stable")
        out: list[Generation | None] = [None] * len(rows)
        from replug_jax.base.progress import tqdm

        # questions per call: a power of two (at least the device count, at most questions_per_batch), so a
        # small call does not pay for filler questions and the shapes stay few
        per_call = sharding.power_of_two_rows(len(rows), self.questions_per_batch, lm.mesh)
        keep = min(posterior.keep, weights.shape[1]) if posterior else weights.shape[1]
        alpha = np.float32(posterior.alpha if posterior else 0.0)
        bar = tqdm(total=len(rows), disable=not progress, desc="generate", unit="question")
        for start in range(0, len(rows), per_call):
            idx = order[start : start + per_call]
            tokens, lps, counts, log_w, query_ll = self._batch(
                [rows[i] for i in idx], weights[idx], [query_lengths[i] for i in idx], prefix_ids, prefix_mask,
                stop_mask, max_new_tokens, steps, per_call, alpha, keep, average_logits)
            for j, i in enumerate(idx):
                g = self._to_generation(tokens[j, : counts[j]], lps[j, : counts[j]], stop, max_new_tokens)
                if posterior:
                    n = len(rows[i])
                    g.log_weights, g.query_logliks = log_w[j, :n].tolist(), query_ll[j, :n].tolist()
                out[i] = g
                if on_answer is not None:
                    on_answer(int(i), g)
            bar.update(len(idx))
        bar.close()
        return out  # type: ignore[return-value]

    def _query_lengths(self, contexts, rows, posterior: PrefillPosterior | None) -> list[list[int]]:
        """Per pass, how many of its context tokens (the last ones) are its question's query x; zeros without a
        posterior. A query cut by the window, or with no passage token before it, is refused."""
        if posterior is None:
            return [[0] * len(q) for q in rows]
        posterior_module.check_alpha(posterior.alpha)
        if len(posterior.queries) != len(contexts):
            raise ValueError(f"PrefillPosterior: {len(posterior.queries)} queries for {len(contexts)} questions")
        if posterior.keep < 1:
            raise ValueError(f"PrefillPosterior: keep={posterior.keep} must be at least 1 (passes mixed per question)")
        lengths = [[query_token_count(self.lm.tokenizer, c, x) for c in ctx]
                   for ctx, x in zip(contexts, posterior.queries)]
        for q_rows, q_lengths in zip(rows, lengths):
            if any(n >= len(r) for r, n in zip(q_rows, q_lengths)):
                raise ValueError("a pass keeps no passage token before its query in the LM's window: shorten the "
                                 "shared prefix or the passages")
        return lengths

    def _batch(self, rows, weights, query_lengths, prefix_ids, prefix_mask, stop_mask, limit, steps, n, alpha, keep,
               average_logits):
        lm = self.lm
        b, k = len(rows), weights.shape[1]
        width = context_bucket(max(len(r) for q in rows for r in q), lm.max_length)
        # missing passes and filler questions: one pad token, weight 0 (-inf), never read by the mixture
        flat = [r for q in rows for r in q + [[lm.pad_id]] * (k - len(q))] + [[lm.pad_id]] * ((n - b) * k)
        ids, mask = sharding.pad_rows(flat, width, lm.pad_id, n * k)  # [n·K, width]
        # [n·K, T]: where each pass's query tokens sit (the last of its row; right-padded), zeros past them
        lengths = [x for q, ql in zip(rows, query_lengths) for x in ql + [0] * (k - len(q))]
        t = max(lengths, default=0)
        targets = np.zeros((n * k, query_bucket(t)), np.int32)
        for row, (r, x) in enumerate(zip(flat, lengths)):
            targets[row, :x] = np.arange(len(r) - x, len(r))
        w = np.full((n, k), -np.inf, np.float32)
        w[:b] = weights
        slots = width + steps  # each row's own (the prefix is read from its one row: kv_cache.after_prefix)
        fn = self._function(slots, steps, keep)
        split = sharding.batch_sharding(lm.mesh)
        ids, mask, w, targets = jax.device_put((ids, mask, w, targets), split)
        outs = fn(lm.params, prefix_ids, prefix_mask, ids, mask, w, targets, alpha, stop_mask, np.int32(limit),
                  average_logits)
        return tuple(np.asarray(sharding.local_copy(x))[:b] for x in outs)

    def _function(self, slots: int, steps: int, keep: int):
        key = (slots, steps, keep)
        if key not in self._jitted:
            self._jitted[key] = generation_program(self.lm.config, self.lm.dtype, self.lm.mesh, slots, steps, keep)
        return self._jitted[key]

    def _to_generation(self, tokens, lps, stop, max_new_tokens) -> Generation:
        """Tokens cut through the one completing a stop string on the decoded text (the device loop stops only
        on tokens holding a whole stop string; a stop spanning tokens is found here, as HTTP does)."""
        ids = [int(t) for t in tokens]
        keep = tokens_through_stop(len(ids), lambda n: self.lm.tokenizer.decode(ids[:n]), stop)
        ids, lps = ids[:keep], lps[:keep]
        text, stopped = cut_at_stop(whole_characters(self.lm.tokenizer.decode(ids)), stop)
        eos = bool(ids) and ids[-1] == self.lm.tokenizer.eos_id
        if eos:
            text = cut_at_stop(whole_characters(self.lm.tokenizer.decode(ids[:-1])), stop)[0]
        finished = stopped or eos or len(tokens) < max_new_tokens
        return Generation(text, ids, [float(x) for x in lps], "stop" if finished else "length")
