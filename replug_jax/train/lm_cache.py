"""A persistent cache of LM supervision ℓ(x, d, y) = Σ_t log p(y_t | d ∘ x, y_<t).

With an API LM every call costs money: no (context, continuation) pair is scored twice,
across steps, index refreshes and restarts. SQLite (stdlib) keeps it on disk, safe
against a crash mid-write.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from typing import Sequence

import numpy as np


class LMScoreCache:
    """`score(contexts, continuations) -> (logprob sums [N], token counts [N])` through the cache."""

    def __init__(self, path: str, lm, key_fields: dict | None = None):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.lm = lm
        # everything that changes a score: the LM (name, and a fingerprint of its weights, dtype and
        # window, or of its server and prompt format) and the caller's fields (e.g. the document template)
        self.namespace = json.dumps({"lm": lm.name, "lm_fingerprint": lm.fingerprint(), **(key_fields or {})},
                                    sort_keys=True, default=str)
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute("CREATE TABLE IF NOT EXISTS scores (key TEXT PRIMARY KEY, logprob REAL, tokens INTEGER)")
        self.db.commit()
        self.hits = self.misses = 0

    def _key(self, context: str, continuation: str) -> str:
        return hashlib.sha256("\0".join((self.namespace, context, continuation)).encode()).hexdigest()

    def score(self, contexts: Sequence[str], continuations: Sequence[str], progress: bool = False):
        keys = [self._key(c, y) for c, y in zip(contexts, continuations)]
        found = {}
        for start in range(0, len(keys), 500):  # SQLite limits the number of bound parameters
            chunk = keys[start : start + 500]
            rows = self.db.execute(f"SELECT key, logprob, tokens FROM scores WHERE key IN ({','.join('?' * len(chunk))})", chunk)
            found.update({k: (lp, n) for k, lp, n in rows})
        first: dict[str, int] = {}  # one LM call per distinct uncached pair
        for i, k in enumerate(keys):
            if k not in found:
                first.setdefault(k, i)
        missing = list(first.values())
        if missing:
            lps = self.lm.score([contexts[i] for i in missing], [continuations[i] for i in missing], progress=progress)
            new = [(keys[i], float(np.sum(x, dtype=np.float64)), int(len(x))) for i, x in zip(missing, lps)]
            self.db.executemany("INSERT OR REPLACE INTO scores VALUES (?, ?, ?)", new)
            self.db.commit()
            found.update({k: (lp, n) for k, lp, n in new})
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        sums = np.array([found[k][0] for k in keys], np.float32)
        counts = np.array([found[k][1] for k in keys], np.int32)
        return sums, counts

    def stats(self) -> dict:
        total = self.hits + self.misses
        return {"cache_hits": self.hits, "cache_misses": self.misses, "cache_hit_rate": self.hits / total if total else 0.0}

    def close(self) -> None:
        self.db.close()
