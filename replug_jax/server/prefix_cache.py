"""The scoring server's key/value caches kept across requests (prefix caching, as vLLM's automatic prefix caching).

REPLUG's mixture over HTTP asks a pass again from its extended prompt whenever the mixture picks another pass's token
(lm/http/generation.py): the prompt is the earlier request's prompt and its first generated tokens, plus one. And every
pass of every question begins with the same few-shot block. Prefilling each such prompt from scratch made the QA job
through the server 1.79× the local job (issue 85). So a finished generation's cache row is kept here, keyed by the
token ids it holds (prompt and generated tokens, the start token included), and a new prompt sharing at least
MIN_SHARED tokens with a kept row starts from that row: its first `shared` tokens are taken as they are and only the
rest is computed (server/decoding_batch.py `_resume`). A kept token's key and value are those the model computed for
the same tokens before them, so a resumed prompt decodes as a prefilled one does (to float rounding: the same sums in
another order).

Kept rows are device arrays of one row each; they are evicted least recently used first once their bytes pass the
budget (`--prefix-cache-mb`, 0: nothing kept). A row whose ids begin another kept row's is redundant and is dropped.
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

MIN_SHARED = 16  # tokens a prompt shares with a kept row for the row to be taken (fewer: prefilled whole)


@dataclasses.dataclass
class KeptRow:
    ids: np.ndarray  # [N] int32: the tokens whose keys and values the row holds, in order
    cache: dict  # a one-row kv_cache (models/kv_cache.py), its N real tokens in slots [0, N)
    nbytes: int


class PrefixCache:
    """Kept cache rows (module docstring); used by the model thread alone."""

    def __init__(self, budget_bytes: int, min_shared: int = MIN_SHARED):
        self.budget_bytes, self.min_shared = int(budget_bytes), int(min_shared)
        self._rows: collections.OrderedDict[int, KeptRow] = collections.OrderedDict()  # least recently used first
        self._keys = iter(range(1 << 62))
        self.nbytes = 0
        self.stats = {"hits": 0, "misses": 0, "reused_tokens": 0, "prefilled_tokens": 0, "kept": 0, "evicted": 0}

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._rows)

    def find(self, ids: list[int]) -> tuple[KeptRow, int] | None:
        """The kept row sharing the longest prefix with `ids` and how many tokens it shares (at most len(ids) - 1: the
        last token is always computed, for the logits after it), if at least min_shared; counted in `stats`."""
        best, shared = None, 0
        if self._rows and len(ids) > self.min_shared:
            query = np.asarray(ids, np.int32)
            for key, row in reversed(self._rows.items()):  # the most recent first among equals
                n = common_prefix(row.ids, query, len(query) - 1)
                if n > shared:
                    best, shared = key, n
        if best is None or shared < self.min_shared:
            self.stats["misses"] += 1
            self.stats["prefilled_tokens"] += len(ids)
            return None
        self._rows.move_to_end(best)
        self.stats["hits"] += 1
        self.stats["reused_tokens"] += shared
        self.stats["prefilled_tokens"] += len(ids) - shared
        return self._rows[best], shared

    def keep(self, ids: list[int], cache: dict) -> None:
        """Keep a row holding `ids` (a one-row cache, made by the caller only where `wants(ids)`)."""
        row = KeptRow(np.asarray(ids, np.int32), cache, int(cache["k"].nbytes + cache["v"].nbytes))
        for key in [key for key, kept in self._rows.items() if common_prefix(kept.ids, row.ids) == len(kept.ids)]:
            self._drop(key)  # redundant: every prompt it would serve, the new row serves as well
        self._rows[next(self._keys)] = row
        self.nbytes += row.nbytes
        self.stats["kept"] += 1
        while self.nbytes > self.budget_bytes and self._rows:
            self._drop(next(iter(self._rows)))
            self.stats["evicted"] += 1

    def wants(self, ids: list[int]) -> bool:
        """Whether a row holding `ids` would be kept: enabled, long enough, and not the beginning of a kept row."""
        if not self.enabled or len(ids) <= self.min_shared:
            return False
        query = np.asarray(ids, np.int32)
        return not any(len(kept.ids) >= len(query) and common_prefix(kept.ids, query) == len(query)
                       for kept in self._rows.values())

    def clear(self) -> None:
        for key in list(self._rows):
            self._drop(key)

    def _drop(self, key: int) -> None:
        self.nbytes -= self._rows.pop(key).nbytes


def common_prefix(a: np.ndarray, b: np.ndarray, limit: int | None = None) -> int:
    """How many leading tokens two id arrays share (at most `limit`)."""
    n = min(len(a), len(b), len(b) if limit is None else limit)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
