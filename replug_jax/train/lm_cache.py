"""LM supervision through the persistent score cache: ℓ(x, d, y) = Σ_t log p(y_t | d ∘ x, y_<t) (`score`), or
the query's own ℓ(x, d) = Σ_t log p(x_t | d, x_<t) (`score_query_and_continuation`, LSR's question target).

No (context, continuation) pair and no (document, query) pair is scored twice, across steps, index refreshes,
restarts and (with a shared cache file) runs: see `replug_jax.lm.cache.CachedLM` (the two kinds have separate keys).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from replug_jax.lm.cache import CachedLM


class LMScoreCache:
    """`score(contexts, continuations) -> (logprob sums [N], token counts [N])` through a `CachedLM`.

    `lm` already a CachedLM (e.g. a job's LM with a shared cache file): it is used as it is and
    `path` is ignored; otherwise it is wrapped with a cache at `path`. The key is the LM's and the pair's text:
    the document template is in the context it formats, so training and evaluation share entries."""

    def __init__(self, path: str, lm):
        self._owned = not isinstance(lm, CachedLM)
        self.lm = CachedLM(lm, path) if self._owned else lm

    def score(self, contexts: Sequence[str], continuations: Sequence[str], progress: bool = False):
        lps = self.lm.score(contexts, continuations, progress=progress)
        sums = np.array([np.sum(x, dtype=np.float64) for x in lps], np.float32)
        counts = np.array([len(x) for x in lps], np.int32)
        return sums, counts

    def score_query_and_continuation(self, contexts: Sequence[str], queries: Sequence[str],
                                     continuations: Sequence[str], progress: bool = False):
        """From one `score_with_query` pass `context ∘ query ∘ continuation` per triple: ((query logprob sums [N],
        token counts [N]), (continuation logprob sums [N], token counts [N]))."""
        pairs = self.lm.score_with_query(contexts, queries, continuations, progress=progress)
        totals = []
        for part in (0, 1):
            sums = np.array([np.sum(p[part], dtype=np.float64) for p in pairs], np.float32)
            totals.append((sums, np.array([len(p[part]) for p in pairs], np.int32)))
        return tuple(totals)

    @property
    def hits(self) -> int:
        return self.lm.hits

    @property
    def misses(self) -> int:
        return self.lm.misses

    def stats(self) -> dict:
        return self.lm.cache_stats()

    def close(self) -> None:
        if self._owned:
            self.lm.close()
