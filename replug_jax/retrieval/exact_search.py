"""Exact inner-product search over the rows a FAISS flat index holds, read in place (no copy, a memory-mapped index
included): blocked float32 GEMMs find the candidates, float64 sums rank them.

    matrix = flat_rows(index.index)                             # [N, D] float32 view, or None for another index
    scores, rows = search(matrix, queries, k, exclude=[[3, 9], []], row_norm=1.0)   # [Q, k] float32, int64

Rankings: score descending, ties to the lower row, whatever else is searched at once (a query alone, in a batch, in
another order) and however large a tie group is:
- the float32 GEMM rounds a query's scores by the shape it sits in (a GEMV for one query alone), so every row whose
  float32 score lies within the GEMM's error bound (`slack`) of the query's k-th best is a candidate, a whole tie
  group included, and the candidates are ranked by float64 sums;
- excluded rows are masked in the GEMM's score blocks before anything is kept: a query's exclusion list costs its
  own length, never a deeper search (an LM window excludes its own document's chunks, an LSR example its source).
With the FAISS index at hand (`index=`), a search of FAISS_MIN_QUERIES queries or more may take its candidates from
FAISS's own flat search instead (the same window, the same float64 ranking, so the same answer): which of the two is
faster depends on the host, the corpus size and the query count (benchmarks/README.md, "Exact search"), so the first
such search of each size class times both and the faster one serves that class from then on (`chosen_paths()`),
remembered per machine (CPU model, cores, numpy and FAISS versions) in ~/.cache/replug_jax/exact_search_paths.json
($REPLUG_JAX_SEARCH_CHOICES), so later processes on the machine time nothing. Below FAISS_MIN_QUERIES, and for
queries with exclusions, the GEMM path always runs. FAISS stays the only path for compressed and approximate indexes
(SQ, PQ, IVF, HNSW).
"""
from __future__ import annotations

import functools
import json
import os
import platform
import time

import faiss
import numpy as np

BLOCK_SCORES = 1 << 22  # float32 scores of one GEMM block [Q, b] (16 MiB): the largest allocation but the output
RESCORE_PAIRS = 8_192  # (query, row) pairs rescored at a time: [8192, D] float64
FAISS_MIN_QUERIES = 128  # below, FAISS's flat search measured 3-8x slower than the GEMM path (Intel and AMD hosts)
FAISS_WIDTH = 16  # FAISS is asked for k + this many rows, so that the window past the k-th score is usually seen
_CHOSEN: dict[tuple[int, int], str] = {}  # (log2 queries, log2 rows) -> "gemm" | "faiss", timed on this machine
_STORED = {"loaded": False}  # whether this machine's stored choices were read into _CHOSEN
ENV_CHOICES = "REPLUG_JAX_SEARCH_CHOICES"  # the file of the timed choices, per machine
# a float32 dot product of length D carries at most D * 2**-24 * |q| |x| of rounding error (Cauchy-Schwarz on the
# classic bound); two scores compared: twice that
ERROR_PER_DIM = 2.0**-23


def flat_rows(index) -> np.ndarray | None:
    """The stored vectors [N, D] float32 of a flat inner-product FAISS index, viewed without a copy; None for any
    other index (compressed, approximate, or ranked by L2: `DenseIndex` refuses an L2 index)."""
    if (not isinstance(index, faiss.IndexFlat) or index.metric_type != faiss.METRIC_INNER_PRODUCT
            or index.ntotal == 0):
        return None
    return faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d)


def slack(queries: np.ndarray, row_norm: float) -> np.ndarray:
    """Per query [Q] float32, the float32 GEMM's error bound on a score difference: D * 2**-23 * |q| * the largest
    row norm (1 for unit rows)."""
    return (queries.shape[1] * ERROR_PER_DIM * row_norm * np.linalg.norm(queries, axis=1)).astype(np.float32)


def search(matrix: np.ndarray, queries: np.ndarray, k: int, exclude: list | None = None, row_norm: float = 1.0,
           index=None, block_scores: int = BLOCK_SCORES) -> tuple[np.ndarray, np.ndarray]:
    """The k largest inner products of each query [Q, D] with the rows of `matrix` [N, D], excluded rows left out:
    (scores [Q, k] float32, rows [Q, k] int64), best first, ties to the lower row; a query with fewer than k rows
    allowed gets -inf / -1 after them. `exclude`: per query, None or the rows [R] it must not get; `row_norm`: the
    largest row norm (or a bound on it); `index`: the FAISS flat index holding `matrix`, for many queries at once.
    Peak memory: one score block, the candidates, and the exclusion lists."""
    n, q = matrix.shape[0], queries.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be between 1 and the {n} rows")
    queries = np.ascontiguousarray(queries, np.float32)
    if q == 0:  # no query (a process's empty share, a prompt without demos)
        return np.empty((0, k), np.float32), np.empty((0, k), np.int64)
    margin = slack(queries, row_norm)
    free = np.arange(q) if exclude is None else np.flatnonzero([e is None or len(e) == 0 for e in exclude])
    if index is None or len(free) < FAISS_MIN_QUERIES:
        return ranked(matrix, queries, *candidates(matrix, queries, k, margin, exclude, block_scores), k)
    size = (int(np.log2(len(free))), int(np.log2(n)))
    chosen = _chosen(size)
    if chosen is None:  # the first search of this size class on this machine: both paths, timed; the same answer
        started = time.perf_counter()
        gemm = candidates(matrix, queries[free], k, margin[free], block_scores=block_scores)
        middle = time.perf_counter()
        faiss_candidates(index, matrix, queries[free], k, margin[free], block_scores)
        _remember(size, "gemm" if middle - started <= time.perf_counter() - middle else "faiss")
    else:
        find = candidates if chosen == "gemm" else functools.partial(faiss_candidates, index)
        gemm = find(matrix, queries[free], k, margin[free], block_scores=block_scores)
    cand_q, cand_r = free[gemm[0]], gemm[1]
    rest = np.setdiff1d(np.arange(q), free)  # queries with exclusions: masked in the GEMM
    if rest.size:
        more_q, more_r = candidates(matrix, queries[rest], k, margin[rest], [exclude[i] for i in rest], block_scores)
        cand_q, cand_r = np.concatenate([cand_q, rest[more_q]]), np.concatenate([cand_r, more_r])
    return ranked(matrix, queries, cand_q, cand_r, k)


def chosen_paths() -> dict[str, str]:
    """The choices known so far: "<queries>x<rows>" (powers of two, the lower end) -> "gemm" | "faiss"."""
    return {f"{1 << a}x{1 << b}": path for (a, b), path in sorted(_CHOSEN.items())}


def _choices_file() -> str:
    return os.environ.get(ENV_CHOICES) or os.path.join(os.path.expanduser("~"), ".cache", "replug_jax",
                                                       "exact_search_paths.json")


def machine() -> str:
    """What a timed choice holds for: this host's CPU model and cores, numpy's and FAISS's versions."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} cores, numpy {np.__version__}, faiss {faiss.__version__}"


def _stored() -> dict:
    try:
        with open(_choices_file(), encoding="utf-8") as f:
            stored = json.load(f)
        return stored if isinstance(stored, dict) else {}
    except (OSError, ValueError):
        return {}


def _chosen(size: tuple[int, int]) -> str | None:
    """The path chosen for a size class: this process's, else this machine's stored one, else None (time it)."""
    if not _STORED["loaded"]:
        _STORED["loaded"] = True
        for key, path in (_stored().get(machine()) or {}).items():
            a, b = key.split("x")
            _CHOSEN.setdefault((int(a), int(b)), path)
    return _CHOSEN.get(size)


def _remember(size: tuple[int, int], path: str) -> None:
    """Keep a timed choice for this process and store it for this machine (a read-only home: this process only)."""
    from replug_jax.base.atomic_files import atomic_open

    _CHOSEN[size] = path
    stored = _stored()
    stored.setdefault(machine(), {})[f"{size[0]}x{size[1]}"] = path
    try:
        with atomic_open(_choices_file()) as f:
            json.dump(stored, f, indent=1, sort_keys=True)
    except OSError:
        pass


def faiss_candidates(index, matrix: np.ndarray, queries: np.ndarray, k: int, slack: np.ndarray,
                     block_scores: int = BLOCK_SCORES) -> tuple[np.ndarray, np.ndarray]:
    """`candidates` from FAISS's flat search to depth k + FAISS_WIDTH: the rows within `slack` of each query's k-th
    score; a query whose window reaches past what FAISS returned (a large tie group) is searched by the GEMM path."""
    depth = min(index.ntotal, k + FAISS_WIDTH)
    scores, rows = index.search(queries, depth)  # [Q, depth] float32, int64 (-1: none)
    floor = scores[:, k - 1] - slack
    closed = (scores[:, -1] < floor) | (depth == index.ntotal)
    keep = (scores >= floor[:, None]) & (rows >= 0) & closed[:, None]
    cand_q, cand_c = np.nonzero(keep)
    cand_r = rows[cand_q, cand_c]
    open_ = np.flatnonzero(~closed)
    if open_.size:
        more_q, more_r = candidates(matrix, queries[open_], k, slack[open_], block_scores=block_scores)
        cand_q, cand_r = np.concatenate([cand_q, open_[more_q]]), np.concatenate([cand_r, more_r])
    return cand_q, cand_r


def candidates(matrix: np.ndarray, queries: np.ndarray, k: int, slack: np.ndarray, exclude: list | None = None,
               block_scores: int = BLOCK_SCORES) -> tuple[np.ndarray, np.ndarray]:
    """Every (query, row) pair whose float32 score is within `slack` [Q] of the query's k-th best allowed score:
    (queries [m] int64, rows [m] int64). Blocks of rows are scored in turn; a block keeps only the scores at or
    above each query's floor (its k-th best so far minus its slack), so after the first blocks few are kept."""
    n, q = matrix.shape[0], queries.shape[0]
    block_rows = max(1, block_scores // q)
    excluded_q, excluded_r = exclusion_pairs(exclude, q)  # [E], [E] sorted by row
    kth = np.full(q, -np.inf, np.float32)  # each query's k-th best float32 score so far
    cand_q, cand_s, cand_r = np.empty(0, np.int64), np.empty(0, np.float32), np.empty(0, np.int64)
    for start in range(0, n, block_rows):
        block = queries @ matrix[start : start + block_rows].T  # [Q, b]
        lo, hi = np.searchsorted(excluded_r, [start, start + block.shape[1]])
        block[excluded_q[lo:hi], excluded_r[lo:hi] - start] = -np.inf
        floor = kth - slack
        short = np.flatnonzero(np.isneginf(kth))  # queries with fewer than k candidates: the block's k-th best
        if short.size and block.shape[1] >= k:
            floor[short] = np.partition(block[short], block.shape[1] - k, axis=1)[:, block.shape[1] - k] - slack[short]
        lowest = np.finfo(np.float32).min  # an excluded (-inf) score is never taken
        take_q, take_c = np.nonzero(block >= np.maximum(floor, lowest)[:, None])
        if not take_q.size:
            continue
        cand_q = np.concatenate([cand_q, take_q])
        cand_s = np.concatenate([cand_s, block[take_q, take_c]])
        cand_r = np.concatenate([cand_r, take_c + start])
        kth = kth_largest(cand_q, cand_s, q, k)
        keep = cand_s >= (kth - slack)[cand_q]
        cand_q, cand_s, cand_r = cand_q[keep], cand_s[keep], cand_r[keep]
    return cand_q, cand_r


def kth_largest(groups: np.ndarray, values: np.ndarray, count: int, k: int) -> np.ndarray:
    """Per group 0..count-1, the k-th largest of its `values` [m] (-inf for a group with fewer than k): [count]."""
    order = np.lexsort((-values, groups))
    sizes = np.bincount(groups, minlength=count)
    starts = np.cumsum(sizes) - sizes
    out = np.full(count, -np.inf, values.dtype)
    full = sizes >= k
    out[full] = values[order[starts[full] + k - 1]]
    return out


def exclusion_pairs(exclude: list | None, num_queries: int) -> tuple[np.ndarray, np.ndarray]:
    """(query [E], row [E]) int64 of every excluded pair, sorted by row (`exclude`: per query None or rows)."""
    if exclude is None:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    if len(exclude) != num_queries:
        raise ValueError(f"exclude must hold one row collection per query ({num_queries}), got {len(exclude)}")
    rows = [np.unique(np.fromiter(e, np.int64)) if e is not None else np.empty(0, np.int64) for e in exclude]
    query = np.repeat(np.arange(num_queries), [len(r) for r in rows])
    rows = np.concatenate(rows) if rows else np.empty(0, np.int64)
    order = np.argsort(rows, kind="stable")
    return query[order], rows[order]


def ranked(matrix: np.ndarray, queries: np.ndarray, cand_q: np.ndarray, cand_r: np.ndarray,
           k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best k of each query's candidates, rescored with float64 sums and ranked by them (ties to the lower row),
    so that a query's ranking and scores are the same whatever else was searched with it: (scores [Q, k] float32,
    rows [Q, k] int64; -inf / -1 where a query has fewer)."""
    exact = np.empty(len(cand_q), np.float64)
    for start in range(0, len(cand_q), RESCORE_PAIRS):
        part = slice(start, start + RESCORE_PAIRS)
        exact[part] = float64_scores(matrix[cand_r[part]], queries[cand_q[part]])
    return best_by_exact_score(cand_q, cand_r, exact, len(queries), k)


def float64_scores(vectors: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """[m] float64 inner products of vectors [m, D] with queries [m, D] (any float dtypes, bfloat16 too), pair by
    pair: one pair's sum never depends on the others."""
    return np.einsum("md,md->m", vectors.astype(np.float64), queries.astype(np.float64))


def best_by_exact_score(cand_q: np.ndarray, cand_r: np.ndarray, exact: np.ndarray, num_queries: int,
                        k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query, its best k candidates (queries [m], rows [m], float64 scores [m]) ranked by score, ties to the lower
    row: (scores [Q, k] float32, rows [Q, k] int64; -inf / -1 where a query has fewer)."""
    order = np.lexsort((cand_r, -exact, cand_q))  # per query: score descending, then the lower row
    sizes = np.bincount(cand_q, minlength=num_queries)
    place = np.arange(len(order)) - (np.cumsum(sizes) - sizes)[cand_q[order]]  # rank within its query
    first = order[place < k]
    scores, rows = np.full((num_queries, k), -np.inf, np.float32), np.full((num_queries, k), -1, np.int64)
    scores[cand_q[first], place[place < k]] = exact[first]
    rows[cand_q[first], place[place < k]] = cand_r[first]
    return scores, rows
