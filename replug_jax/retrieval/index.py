"""Host-side dense index: a FAISS wrapper with numpy in and out, saved with metadata.

    index = DenseIndex.build(E, metric="cosine", factory="IVF256,PQ16", meta=index_meta(enc, ds))
    scores, rows = index.search(Q, k=4, exclude=[{12, 13}, None])   # [Q, k] float32, [Q, k] int64
    index.save("work/index"); index = DenseIndex.load("work/index", expected=index_meta(enc, ds))

Missing results are score -inf and row -1. `exclude` keeps rows out of a query's results: a flat index masks them
in its exact search (`exact_search.py`); other indexes, the BM25 index and the random retriever search each query
to k plus its own list's length, then deeper (doubling) until k allowed rows are found (`search_excluding`).
Saving writes a temp folder and renames it into place (`base.atomic_files.atomic_directory`), so a crash never
leaves a half-written index.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Sequence

import faiss
import numpy as np

from replug_jax.base.atomic_files import atomic_directory, atomic_open
from replug_jax.retrieval import exact_search

METRICS = ("cosine", "ip")
META_FILE = "meta.json"
INDEX_FILE = "index.faiss"

# exclude: per query, None or an iterable of rows; or a callable (query number, rows [m] int64) -> bool [m].
Exclude = Sequence | Callable[[int, np.ndarray], np.ndarray] | None
# search_fn(query numbers [q] int64, depth) -> (scores [q, depth], rows [q, depth]), best first, -1 = none.
SearchFn = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


class IndexRefused(ValueError):
    """A saved index does not match what the caller expects (encoder, datastore, dimension, ...)."""


def check_k(k: int, count: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > count:
        raise ValueError(f"k={k} is larger than the corpus ({count} rows)")


def search_excluding(search_fn: SearchFn, count: int, num_queries: int, k: int,
                     exclude: Exclude = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (scores [Q, k] float32, rows [Q, k] int64) of `search_fn` without excluded rows: each query is searched
    first to k plus its own list's length (rounded up to a power of two, so that few depths are asked), and deeper
    (doubling) until k allowed rows are found or the index is exhausted."""
    check_k(k, count)
    if exclude is None:
        scores, rows = search_fn(np.arange(num_queries), k)
        rows = np.asarray(rows, np.int64)
        return np.where(rows >= 0, scores, -np.inf).astype(np.float32), rows
    is_excluded, depths = exclusion_rule(exclude, num_queries, k, count)  # depths: [Q]
    out_scores = np.full((num_queries, k), -np.inf, np.float32)
    out_rows = np.full((num_queries, k), -1, np.int64)
    pending = np.arange(num_queries)
    while pending.size:
        unfinished = []
        for depth in np.unique(depths[pending]).tolist():
            todo = pending[depths[pending] == depth]
            scores, rows = search_fn(todo, depth)  # [q, depth]
            rows = np.asarray(rows, np.int64)
            for j, q in enumerate(todo.tolist()):
                found = rows[j] >= 0
                keep = np.flatnonzero(found & ~is_excluded(q, rows[j]))[:k]
                exhausted = depth >= count or found.sum() < depth
                if keep.size == k or exhausted:
                    out_scores[q, : keep.size], out_rows[q, : keep.size] = scores[j, keep], rows[j, keep]
                else:
                    unfinished.append(q)
                    depths[q] = min(count, depth * 2)
        pending = np.asarray(unfinished, np.int64)
    return out_scores, out_rows


def exclusion_rule(exclude: Exclude, num_queries: int, k: int, count: int):
    """(is_excluded(q, rows [m]) -> bool [m], each query's first search depth [Q] int64: k plus its list's length
    (2k for a callable), rounded up to a power of two, at most `count`)."""
    if callable(exclude):
        is_excluded, depths = exclude, np.full(num_queries, 2 * k, np.int64)
    else:
        per_query = exclusion_lists(exclude, num_queries)
        is_excluded = lambda q, rows: np.isin(rows, per_query[q])  # noqa: E731
        depths = k + np.array([len(e) for e in per_query], np.int64)
    return is_excluded, np.minimum(count, 1 << np.ceil(np.log2(np.maximum(depths, 1))).astype(np.int64))


def exclusion_lists(exclude: Sequence, num_queries: int) -> list[np.ndarray]:
    """Per query, the excluded rows [R] int64 of a per-query list of row collections (None: none)."""
    if isinstance(exclude, (set, frozenset)) or len(exclude) != num_queries:
        raise ValueError(f"exclude must be a callable or a per-query list of {num_queries} row collections")
    return [np.zeros(0, np.int64) if e is None else np.fromiter(e, np.int64) for e in exclude]


def write_meta(folder: str, meta: dict) -> None:
    with atomic_open(os.path.join(folder, META_FILE)) as f:
        json.dump(meta, f, indent=1, sort_keys=True)


def read_meta(folder: str, expected: dict | None = None) -> dict:
    """The metadata of a saved index; IndexRefused naming the first field that differs from `expected`."""
    path = os.path.join(folder, META_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no index at {folder} (missing {META_FILE})")
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)
    for key, value in (expected or {}).items():
        if meta.get(key) != value:
            raise IndexRefused(f"index at {folder}: {key} is {meta.get(key)!r}, expected {value!r}")
    return meta


def prepare_rows(x: np.ndarray, metric: str) -> np.ndarray:
    """float32 C-contiguous copy [n, D] of rows, unit-normalised for the cosine metric (zero rows stay zero)."""
    x = np.array(x, dtype=np.float32, order="C", copy=True)
    if metric == "cosine":
        faiss.normalize_L2(x)
    return x


class DenseIndex:
    """A FAISS index over embedding rows; `meta` holds dimension, metric, count, factory and caller fields."""

    def __init__(self, index: faiss.Index, meta: dict):
        if index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise IndexRefused(f"the FAISS index ranks by metric {index.metric_type} (1 is L2); DenseIndex ranks by "
                               "inner product (metric 0): rebuild it with DenseIndex.build or "
                               "faiss.METRIC_INNER_PRODUCT")
        self.index, self.meta = index, meta
        self._row_norm = None  # the largest stored row norm ("ip" metric), found at the first exact search

    @property
    def count(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def __len__(self) -> int:
        return self.count

    @classmethod
    def build(cls, embeddings: np.ndarray, metric: str = "cosine", factory: str = "Flat", train_size: int = 100_000,
              meta: dict | None = None, block_size: int = 65_536, seed: int = 0) -> "DenseIndex":
        """Index embeddings [N, D] (an array or a memmap, read `block_size` rows at a time).

        metric "cosine" normalises rows and queries and uses inner product; "ip" uses raw
        inner products. `factory` is any faiss.index_factory string ("Flat", "IVF256,PQ16",
        "HNSW32"); indexes that need training are trained on up to `train_size` random rows.
        """
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        if embeddings.ndim != 2 or embeddings.shape[0] == 0:
            raise ValueError(f"empty embeddings: need a non-empty [N, D] array, got shape {embeddings.shape}")
        n, d = embeddings.shape
        index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
        self = cls(index, {**(meta or {}), "dimension": d, "metric": metric, "count": n, "factory": factory})
        self.train(embeddings, train_size, seed)
        self.add(embeddings, block_size)
        return self

    def train(self, embeddings: np.ndarray, train_size: int = 100_000, seed: int = 0) -> None:
        """Train an index that needs it (IVF, PQ, ...) on up to `train_size` random rows (a no-op otherwise)."""
        if not self.index.is_trained:
            n = embeddings.shape[0]
            sample = np.sort(np.random.default_rng(seed).choice(n, min(n, train_size), replace=False))
            self.index.train(self._prepare(embeddings[sample]))

    def add(self, embeddings: np.ndarray, block_size: int = 65_536) -> None:
        """Add rows [N, D], `block_size` at a time (a memmap is never read whole)."""
        for start in range(0, embeddings.shape[0], block_size):
            self.index.add(self._prepare(embeddings[start : start + block_size]))
        self._row_norm = None

    def _prepare(self, x: np.ndarray) -> np.ndarray:
        return prepare_rows(x, self.meta["metric"])

    def set_search_params(self, **params) -> None:
        """FAISS search parameters, e.g. nprobe=32 (IVF) or efSearch=128 (HNSW); kept in `meta` and saved."""
        space = faiss.ParameterSpace()
        for name, value in params.items():
            space.set_index_parameter(self.index, name, value)
        self.meta["search_params"] = {**self.meta.get("search_params", {}), **params}

    def search(self, queries: np.ndarray, k: int, exclude: Exclude = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores [Q, k] float32, rows [Q, k] int64) for queries [Q, D]; see `search_excluding`."""
        queries = np.asarray(queries)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must be [Q, {self.dim}] (the index dimension), got shape {queries.shape}")
        prepared = self._prepare(queries)  # [Q, D]
        matrix = exact_search.flat_rows(self.index)  # a flat index: exact search by blocked GEMMs
        if matrix is None:
            return search_excluding(lambda todo, depth: self.index.search(prepared[todo], depth), self.count,
                                    len(prepared), k, exclude)
        if not callable(exclude):  # excluded rows masked in the GEMM
            check_k(k, self.count)
            lists = None if exclude is None else exclusion_lists(exclude, len(prepared))
            return exact_search.search(matrix, prepared, k, lists, self.row_norm(matrix), index=self.index)
        return search_excluding(lambda todo, depth: exact_search.search(matrix, prepared[todo], depth,
                                                                        row_norm=self.row_norm(matrix)),
                                self.count, len(prepared), k, exclude)

    def row_norm(self, matrix: np.ndarray) -> float:
        """The largest stored row norm: 1 for unit rows (cosine), else measured once (a pass over the rows)."""
        if self.meta["metric"] == "cosine":
            return 1.0
        if self._row_norm is None:
            self._row_norm = max(float(np.sqrt(np.einsum("nd,nd->n", part, part).max()))
                                 for part in (matrix[s : s + 65_536] for s in range(0, len(matrix), 65_536)))
        return self._row_norm

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of `rows` [N] -> [N, D] float32: what searches score against (normalised for
        cosine; for a compressed index, its decoded approximation). IVF indexes get a direct map first."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.count):
            raise IndexError(f"rows must lie in [0, {self.count}), got {rows.min()}..{rows.max()}")
        ivf = faiss.try_extract_index_ivf(self.index)
        if ivf is not None and ivf.direct_map.type == faiss.DirectMap.NoMap:
            ivf.make_direct_map()
        return self.index.reconstruct_batch(rows) if rows.size else np.zeros((0, self.dim), np.float32)

    def save(self, path: str) -> None:
        """index.faiss + meta.json in the folder `path`, replaced atomically."""
        with atomic_directory(path) as tmp:
            faiss.write_index(self.index, os.path.join(tmp, INDEX_FILE))
            write_meta(tmp, self.meta)

    @classmethod
    def load(cls, path: str, expected: dict | None = None, mmap: bool = False) -> "DenseIndex":
        """A saved index; IndexRefused if a field of `expected` differs or the file disagrees with its metadata."""
        meta = read_meta(path, expected)
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
        index = faiss.read_index(os.path.join(path, INDEX_FILE), flags)
        if (index.ntotal, index.d) != (meta.get("count"), meta.get("dimension")):
            raise IndexRefused(f"index at {path}: file holds {index.ntotal} x {index.d}, metadata says "
                               f"{meta.get('count')} x {meta.get('dimension')}")
        self = cls(index, meta)
        if meta.get("search_params"):
            self.set_search_params(**meta["search_params"])
        return self
