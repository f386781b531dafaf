"""Exact inner-product search as one blocked GEMM and a partial top-k (numpy: BLAS on every core), over the rows a
FAISS flat index holds, read in place (no copy, a memory-mapped index included).

    matrix = flat_rows(index.index)                     # [N, D] float32 view, or None for a compressed index
    scores, rows = top_k(matrix, queries, k)            # [Q, k] float32, [Q, k] int64, best first

Rankings: score descending, ties to the lower row. FAISS stays for compressed and approximate indexes (SQ, PQ, IVF,
HNSW), and for a flat index searched with MAX_QUERIES queries or more at once, where FAISS measured faster
(benchmarks/bench_search.py). Either way a flat index's candidates are rescored (`rescored`): BLAS rounds a query's
scores differently beside other queries (a GEMM of another shape, or a GEMV for one query alone), which swapped
tied passages between a job's batch and the REPLUG object's single question.
"""
from __future__ import annotations

import faiss
import numpy as np

BLOCK_ROWS = 32_768  # matrix rows per GEMM: a [Q, BLOCK_ROWS] float32 score block is the largest allocation
RESCORE_MARGIN = 8  # candidates searched past the depth asked, so that rescoring decides the order at its edge
MAX_QUERIES = 512  # from here on FAISS's own blocked BLAS path is faster; below it, its scan is 2.5-11x slower
# (benchmarks/README.md "Exact search": Intel Xeon, 2 cores, 10k-1M rows)


def flat_rows(index) -> np.ndarray | None:
    """The stored vectors [N, D] float32 of a flat (uncompressed) FAISS index, viewed without a copy; None for any
    other index."""
    if not isinstance(index, faiss.IndexFlat) or index.ntotal == 0:
        return None
    return faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d)


def top_k(matrix: np.ndarray, queries: np.ndarray, k: int,
          block_rows: int = BLOCK_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """The k largest inner products of each query [Q, D] with the rows of `matrix` [N, D]: (scores [Q, k] float32,
    rows [Q, k] int64), best first, ties to the lower row; k <= N. After the first k rows only the scores above
    each query's current k-th best are gathered and merged (few, once the first blocks are read)."""
    n, q = matrix.shape[0], queries.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be between 1 and the {n} rows")
    queries = np.ascontiguousarray(queries, np.float32)
    if q == 0:  # no query (a process's empty share, a prompt without demos)
        return np.empty((0, k), np.float32), np.empty((0, k), np.int64)
    scores, rows = np.empty((q, 0), np.float32), np.empty((q, 0), np.int64)
    for start in range(0, n, block_rows):
        block = queries @ matrix[start : start + block_rows].T  # [Q, b]
        if scores.shape[1] < k:  # the first rows: each query's k best of the block are the candidates
            cand_c = _largest_columns(block, min(k, block.shape[1]))  # [Q, k']
            cand_q = np.repeat(np.arange(q), cand_c.shape[1])
            cand_c = cand_c.ravel()
        else:  # only the scores above each query's k-th best (a later row never wins a tie)
            cand_q, cand_c = np.nonzero(block > scores[:, -1:])
            if not cand_q.size:
                continue
        all_q = np.concatenate([np.repeat(np.arange(q), scores.shape[1]), cand_q])
        all_s = np.concatenate([scores.ravel(), block[cand_q, cand_c]])
        all_r = np.concatenate([rows.ravel(), cand_c + start])
        order = np.lexsort((all_r, -all_s, all_q))  # per query: score descending, then the lower row
        first = np.searchsorted(all_q[order], np.arange(q))  # where each query's entries begin
        keep = order[np.arange(order.size) - first[all_q[order]] < k]  # each query's best k (or all it has)
        width = keep.size // q
        scores, rows = all_s[keep].reshape(q, width), all_r[keep].reshape(q, width)
    return scores, rows


def _largest_columns(block: np.ndarray, k: int) -> np.ndarray:
    """The columns [Q, k] int64 of the k largest entries of each row of `block` [Q, b], unordered."""
    if k == block.shape[1]:
        return np.broadcast_to(np.arange(k, dtype=np.int64), block.shape)
    return np.argpartition(block, block.shape[1] - k, axis=1)[:, -k:].astype(np.int64)


def rescored(matrix: np.ndarray, queries: np.ndarray, rows: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The best `depth` of each query's candidate rows [Q, m] (-1: none) rescored against `matrix` [N, D] with
    float64 sums, ranked by them (ties to the lower row), so that a query's ranking and scores are the same whatever
    else was searched with it: (scores [Q, depth] float32, rows [Q, depth] int64)."""
    rows = np.asarray(rows, np.int64)
    exact = np.full(rows.shape, -np.inf)
    for start in range(0, len(rows), 256):  # [256, m, D] float64 at a time
        part = rows[start : start + 256]
        vectors = matrix[np.maximum(part, 0)].astype(np.float64)
        exact[start : start + 256] = np.where(part >= 0, np.einsum("qmd,qd->qm", vectors,
                                                                   queries[start : start + 256].astype(np.float64)),
                                              -np.inf)
    order = np.lexsort((np.where(rows >= 0, rows, np.iinfo(np.int64).max), -exact), axis=1)[:, :depth]
    return np.take_along_axis(exact, order, 1).astype(np.float32), np.take_along_axis(rows, order, 1)
