"""Sparse baseline: a BM25 index (the `bm25s` package) with the dense index's conventions.

    bm25 = BM25Index.build(datastore.texts, meta={"datastore": datastore.fingerprint()})
    scores, rows = bm25.search_texts(["capital of France"], k=4, exclude=[{3}])  # [Q, k], [Q, k]

Same output as `DenseIndex.search`: float32 scores (-inf where missing), int64 rows (-1
where missing), exclusions through the shared `search_excluding`. Documents that share no
term with the query score 0 and still fill the top-k when fewer than k documents match.
Texts are lower-cased, split on word characters and stripped of English stop words.
"""
from __future__ import annotations

import os
from typing import Sequence

import bm25s
import numpy as np

from replug_jax.base.atomic_files import atomic_directory
from replug_jax.retrieval.index import Exclude, read_meta, search_excluding, write_meta

BM25_DIR = "bm25"


class BM25Index:
    """Okapi BM25 (Lucene variant, k1=1.5, b=0.75 by default) over a list of texts; row i is texts[i]."""

    def __init__(self, model: bm25s.BM25, meta: dict):
        self.model, self.meta = model, meta

    @property
    def count(self) -> int:
        return int(self.model.scores["num_docs"])

    def __len__(self) -> int:
        return self.count

    @classmethod
    def build(cls, texts: Sequence[str], k1: float = 1.5, b: float = 0.75, method: str = "lucene",
              stopwords: str | None = "en", meta: dict | None = None) -> "BM25Index":
        if len(texts) == 0:
            raise ValueError("empty corpus: no texts to index")
        model = bm25s.BM25(k1=k1, b=b, method=method)
        model.index(bm25s.tokenize(list(texts), stopwords=stopwords, show_progress=False), show_progress=False)
        return cls(model, {**(meta or {}), "kind": "bm25", "count": len(texts), "stopwords": stopwords,
                           "k1": k1, "b": b, "method": method})

    def search_texts(self, queries: Sequence[str], k: int, exclude: Exclude = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores [Q, k] float32, rows [Q, k] int64) for query texts; see `index.search_excluding`."""
        if isinstance(queries, str):
            raise TypeError("search_texts takes a list of query texts, not a single string")
        tokens = bm25s.tokenize(list(queries), stopwords=self.meta["stopwords"], return_ids=False, show_progress=False)

        def search_fn(todo, depth):
            rows, scores = self.model.retrieve([tokens[q] for q in todo.tolist()], k=depth, show_progress=False,
                                               backend_selection="numpy", n_threads=0)
            return scores, rows  # [q, depth] each

        return search_excluding(search_fn, self.count, len(tokens), k, exclude)

    def save(self, path: str) -> None:
        """The bm25s arrays and meta.json in the folder `path`, replaced atomically."""
        with atomic_directory(path) as tmp:
            self.model.save(os.path.join(tmp, BM25_DIR), show_progress=False)
            write_meta(tmp, self.meta)

    @classmethod
    def load(cls, path: str, expected: dict | None = None, mmap: bool = False) -> "BM25Index":
        meta = read_meta(path, {"kind": "bm25", **(expected or {})})
        model = bm25s.BM25.load(os.path.join(path, BM25_DIR), mmap=mmap, show_progress=False)
        return cls(model, meta)
