"""Scoring rows that share a long token prefix (a few-shot block) with that prefix computed once.

Multiple-choice prompts repeat the same few-shot block before every pass: MMLU's 5 shots with their passages
are ~1,000 tokens before each ~200-token pass. `prefix_groups` finds, among the rows of one `score` call, the
runs of rows that share a prefix of at least `min_length` tokens (on the token ids themselves, so the text's
tokenisation is untouched); `PrefixScorer` runs each group's prefix once into a key/value cache
(`kv_cache.extend`) and scores every row's remaining tokens against it (`causal_lm.logprobs_at` with the
cache), in batches. The values are the full rows' (tests/test_shared_prefix.py: to float rounding).
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import numpy as np

from replug_jax.lm.local_generate import split_rows
from replug_jax.models import causal_lm, kv_cache
from replug_jax.parallel import sharding, xla_cpu

MIN_SHARED_PREFIX = 128  # tokens: rows sharing at least this long a prefix read it from one cache


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def prefix_groups(rows: Sequence[Sequence[int]], first_predicted: Sequence[int], min_length: int,
                  min_rows: int = 2, min_saved: int | None = None) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """([(prefix length C, row indices)], indices of the rows left alone).

    A group's rows share their first C >= `min_length` tokens, and C <= every member's `first_predicted`
    (the first position whose next-token distribution is read: it must lie after the cached prefix).
    Rows are taken in lexicographic order, so rows with a common prefix are neighbours; a group has at
    least `min_rows` rows and saves at least `min_saved` tokens ((rows - 1) · C; default 4 · `min_length`),
    so that two passes that merely share a passage stay in the ordinary batches. `min_length` 0 turns
    grouping off."""
    min_saved = 4 * min_length if min_saved is None else min_saved
    if min_length <= 0 or len(rows) < min_rows:
        return [], list(range(len(rows)))
    order = sorted(range(len(rows)), key=lambda i: tuple(rows[i]))
    groups, alone = [], []
    members, common = [order[0]], min(len(rows[order[0]]), first_predicted[order[0]])

    def close():
        if len(members) >= min_rows and common >= min_length and (len(members) - 1) * common >= min_saved:
            groups.append((common, list(members)))
        else:
            alone.extend(members)

    for prev, i in zip(order, order[1:]):
        joined = min(common, common_prefix_length(rows[prev], rows[i]), first_predicted[i])
        if joined >= min_length:
            members.append(i)
            common = joined
        else:
            close()
            members, common = [i], min(len(rows[i]), first_predicted[i])
    close()
    return groups, sorted(alone)


def _prefix_cache(params, ids, mask, *, config, dtype):
    """[1, P] prefix ids -> its key/value cache (P slots)."""
    cache = kv_cache.init_cache(config, 1, ids.shape[1], dtype)
    return kv_cache.extend(params, config, cache, ids, mask, dtype)[1]


def _score_after(params, prefix, ids, mask, targets, predict, *, config, dtype, mesh, top):
    """Rows [b, W] continuing the one-row `prefix` cache: log-probs [b, T] at `targets` (positions in the rows);
    [b, T, 1 + 2·top] with the top tokens beside (`causal_lm.logprobs_at`)."""
    cache = split_rows(kv_cache.after_prefix(prefix, ids.shape[0], ids.shape[1]), config, mesh)
    return causal_lm.logprobs_at(params, config, ids, mask, targets, predict, dtype=dtype, cache=cache, top=top)


def prefix_programs(config, dtype, mesh, top: int = 0):
    """(prefix cache program, after-prefix scoring program), jitted as `PrefixScorer` runs them (the TPU plan
    compiles the same): the prefix [1, P] -> its cache; (cache, ids, mask, targets, predict_from) [b, ...] ->
    log-probs [b, T], split over "data" (replicated back on a mesh spanning processes)."""
    out = sharding.replicated(mesh) if sharding.spans_processes(mesh) else sharding.batch_sharding(mesh)
    options = xla_cpu.options(xla_cpu.LM_SCORING, mesh)
    prefix = jax.jit(functools.partial(_prefix_cache, config=config, dtype=dtype), compiler_options=options)
    score = jax.jit(functools.partial(_score_after, config=config, dtype=dtype, mesh=mesh, top=top), out_shardings=out,
                    compiler_options=options)
    return prefix, score


class PrefixScorer:
    """Scores rows after a shared prefix for a `LocalLM` (its params, mesh, batch size and buckets)."""

    def __init__(self, lm, top: int = 0):
        self.lm = lm
        self._prefix, self._score = prefix_programs(lm.config, lm.dtype, lm.mesh, top)

    def score(self, prefix: list[int], suffixes: list, per_octave: int, progress: bool = False):
        """Yield (suffix indices, log-probs [b, T]) for `suffixes` = [(ids, targets, predict_from)] whose
        positions count within each suffix (the cached prefix comes first). Lengths are bucketed as LocalLM's
        (`per_octave` buckets per doubling); a group smaller than the batch is padded to a power of two."""
        lm = self.lm
        width = sharding.length_bucket(len(prefix), lm.length_multiple, lm.max_length, per_octave)
        prefix_ids, prefix_mask = sharding.pad_rows([prefix], width, lm.pad_id, 1)
        cache = self._prefix(lm.params, prefix_ids, prefix_mask)
        size = sharding.power_of_two_rows(len(suffixes), lm.batch_size, lm.mesh)
        batches = sharding.bucketed_batches([s[0] for s in suffixes], size, lm.length_multiple, lm.max_length,
                                            lm.pad_id, progress, desc="score after prefix", per_octave=per_octave)
        split = sharding.batch_sharding(lm.mesh)
        for idx, ids, mask in batches:
            targets, predict = lm.target_arrays([suffixes[i][1] for i in idx], [suffixes[i][2] for i in idx],
                                                ids.shape[1])
            rows = len(idx)
            arrays = tuple(np.pad(a, ((0, size - rows), (0, 0))) for a in (ids, mask, targets, predict))
            lps = self._score(lm.params, cache, *jax.device_put(arrays, split))
            yield idx, np.asarray(sharding.local_copy(lps))[:rows]
