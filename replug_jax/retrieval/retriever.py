"""One search interface for REPLUG: query texts in, (scores, datastore rows) out.

    retriever = DenseRetriever(encoder, index, datastore)   # or BM25Retriever, RandomRetriever
    scores, rows = retriever.retrieve(["x1", "x2"], k=4, exclude_sources=[["doc7"], []])
    passages = [[datastore.texts[r] for r in row if r >= 0] for row in rows]

`exclude_sources` names, per query, source documents whose chunks must not be retrieved
(a held-out document must not retrieve itself). Scores are the retriever's similarity
s(d, x): cosine or inner product for dense, BM25 for sparse, 0 for random (the paper's
Fig. 4 control). Missing results (only when exclusions exhaust the corpus, or an
approximate index finds too few) are score -inf and row -1.
"""
from __future__ import annotations

import zlib
from typing import Iterable, Sequence

import numpy as np

from replug_jax.retrieval.bm25 import BM25Index
from replug_jax.retrieval.datastore import Datastore
from replug_jax.retrieval.index import DenseIndex, IndexRefused, search_excluding

ExcludeSources = Sequence[Iterable[str] | None] | None


def index_meta(encoder, datastore: Datastore) -> dict:
    """The fields a dense index records at build time and is checked against at load time."""
    return {"encoder": encoder.fingerprint(), "datastore": datastore.fingerprint()}


def excluded_rows(datastore: Datastore, exclude_sources: ExcludeSources, num_queries: int) -> list[np.ndarray] | None:
    """Per query, the rows [R] int64 of the chunks of its excluded source documents (None: no exclusion)."""
    if exclude_sources is None:
        return None
    if isinstance(exclude_sources, str) or len(exclude_sources) != num_queries:
        raise ValueError(f"exclude_sources must be a per-query list of {num_queries} collections of source ids")
    if any(isinstance(s, str) for s in exclude_sources):
        raise TypeError("each entry of exclude_sources is a collection of source ids, not a single string")
    return [datastore.rows_of_sources(s or ()) for s in exclude_sources]


def _check_rows(index, datastore: Datastore) -> None:
    if index.count != len(datastore):
        raise IndexRefused(f"the index holds {index.count} rows but the datastore {len(datastore)} chunks")
    fingerprint = index.meta.get("datastore")
    if fingerprint is not None and fingerprint != datastore.fingerprint():
        raise IndexRefused(f"the index was built over datastore {fingerprint}, not {datastore.fingerprint()}")


def _as_list(query_texts: Sequence[str]) -> list[str]:
    if isinstance(query_texts, str):
        raise TypeError("retrieve takes a list of query texts, not a single string")
    return list(query_texts)


class DenseRetriever:
    """Queries embedded by `encoder.embed`, searched in a DenseIndex over `datastore`'s rows.

    `document_encoder`: the encoder that built the index when it is not the query encoder (a
    query-side-only LSR retriever searches the original index); the index is checked against it."""

    def __init__(self, encoder, index: DenseIndex, datastore: Datastore, document_encoder=None):
        _check_rows(index, datastore)
        builder = document_encoder or encoder
        fingerprint = index.meta.get("encoder")
        if fingerprint is not None and fingerprint != builder.fingerprint():
            raise IndexRefused(f"the index was built with encoder {fingerprint}, not {builder.fingerprint()}")
        if builder.dim != encoder.dim:
            raise IndexRefused(f"query encoder gives {encoder.dim}-d vectors, the index holds {builder.dim}-d")
        self.encoder, self.index, self.datastore = encoder, index, datastore

    def retrieve(self, query_texts, k, exclude_sources=None):
        queries = _as_list(query_texts)
        embedded = self.encoder.embed(queries)  # [Q, D]
        return self.index.search(embedded, k, exclude=excluded_rows(self.datastore, exclude_sources, len(queries)))


class BM25Retriever:
    """BM25 over the datastore's chunk texts (the paper's sparse baseline)."""

    def __init__(self, index: BM25Index, datastore: Datastore):
        _check_rows(index, datastore)
        self.index, self.datastore = index, datastore

    def retrieve(self, query_texts, k, exclude_sources=None):
        queries = _as_list(query_texts)
        return self.index.search_texts(queries, k, exclude=excluded_rows(self.datastore, exclude_sources, len(queries)))


class RandomRetriever:
    """Uniformly random distinct rows with score 0: the random-retrieval control of the paper's Fig. 4.

    The draw of each query depends only on `seed` and the query's text, so a query gets the same rows
    whichever batch or process asks for it (evaluation split over processes equals one process)."""

    def __init__(self, datastore: Datastore, seed: int = 0):
        self.datastore, self.seed = datastore, seed

    def retrieve(self, query_texts, k, exclude_sources=None):
        queries = _as_list(query_texts)
        n = len(self.datastore)

        def search_fn(todo, depth):
            rngs = [np.random.default_rng([self.seed, zlib.crc32(queries[q].encode("utf-8"))]) for q in todo]
            rows = np.stack([rng.choice(n, depth, replace=False) for rng in rngs]).reshape(len(todo), depth)
            return np.zeros(rows.shape, np.float32), rows

        return search_excluding(search_fn, n, len(queries), k, excluded_rows(self.datastore, exclude_sources, len(queries)))
