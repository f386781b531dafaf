"""Exact search on CPU: `exact_search.search` against a numpy GEMM + argpartition and FAISS's flat index, over the
same rows, in one run; and a query's exclusion list against FAISS's own search to that depth.

    python benchmarks/bench_search.py --rows 100000,1000000 --queries 1,8,64,512,4096 --k 10
    python benchmarks/bench_search.py --exclusion --rows 20000 --dim 768 --queries 256 --excluded 1500 --k 8

Rows and queries are random unit vectors (384 wide, MiniLM's, unless --dim); every path reads the FAISS index's own
rows. Prints each one's best time of interleaved rounds and the ratio against the numpy reference (its time / ours:
at or above 1, ours is as fast), and whether the rankings are identical. Ours twice: the GEMM path alone, and as
`DenseIndex.search` runs it (`index=`: from 128 queries the faster of the GEMM and FAISS paths, timed at the warm-up
call; the `path` column). FAISS alone is timed after the interleaved rounds: its OpenMP threads spin on after a call
and slowed whichever ran next. The reference scores queries in chunks of
at most 2**27 scores (512 MiB) with one GEMM each, then `argpartition` and a sort of the k kept: what a user writes.
`--exclusion`: one query excludes `--excluded` rows (the rows it would rank first); ours masks them, FAISS alone is
searched to k + that depth; the peak memory each adds (tracemalloc: numpy's allocations) is reported.
"""
from __future__ import annotations

import argparse
import os
import sys
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def numpy_reference(matrix: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A plain GEMM + argpartition top-k (scores and rows [Q, k], best first), in query chunks of <= 2**27 scores."""
    chunk = max(1, (1 << 27) // len(matrix))
    scores, rows = [], []
    for start in range(0, len(queries), chunk):
        block = queries[start : start + chunk] @ matrix.T  # [q, N]
        top = np.argpartition(block, -k, axis=1)[:, -k:]
        part = np.take_along_axis(block, top, 1)
        order = np.argsort(-part, axis=1)
        scores.append(np.take_along_axis(part, order, 1))
        rows.append(np.take_along_axis(top, order, 1))
    return np.concatenate(scores), np.concatenate(rows)


def peak_bytes(fn) -> tuple[int, object]:
    tracemalloc.start()
    out = fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="100000,1000000")
    p.add_argument("--queries", default="1,8,64,512,4096")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--exclusion", action="store_true")
    p.add_argument("--excluded", type=int, default=1500)
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args(argv)

    import faiss

    from replug_jax.retrieval import exact_search

    rng = np.random.default_rng(0)
    command = "python benchmarks/bench_search.py " + " ".join(sys.argv[1:] if argv is None else argv)
    cpu = common.cpu_model()
    rows = []
    for n in (int(x) for x in args.rows.split(",")):
        corpus = rng.standard_normal((n, args.dim), dtype=np.float32)
        faiss.normalize_L2(corpus)
        index = faiss.IndexFlatIP(args.dim)
        index.add(corpus)
        del corpus
        matrix = exact_search.flat_rows(index)
        for q in (int(x) for x in args.queries.split(",")):
            queries = rng.standard_normal((q, args.dim), dtype=np.float32)
            faiss.normalize_L2(queries)
            if args.exclusion:
                rows.append(exclusion_row(args, index, matrix, queries, exact_search, cpu, command))
                continue
            fns = {"gemm": lambda: exact_search.search(matrix, queries, args.k),
                   "ours": lambda: exact_search.search(matrix, queries, args.k, index=index),
                   "numpy": lambda: numpy_reference(matrix, queries, args.k)}
            for fn in fns.values():
                fn()  # warm-up (and the size class's timed choice)
            best = common.interleaved_best(fns, rounds=args.rounds)
            faiss_s = common.best_time(lambda: index.search(queries, args.k), args.rounds)
            (_, gr), (_, or_), (_, nr) = fns["gemm"](), fns["ours"](), fns["numpy"]()
            fr = index.search(queries, args.k)[1]
            path = exact_search.chosen_paths().get(f"{1 << int(np.log2(q))}x{1 << int(np.log2(n))}", "gemm")
            rows.append({"benchmark": "exact_search", "rows": n, "queries": q, "k": args.k, "dim": args.dim,
                         "path": path, "ours_ms": best["ours"] * 1e3, "gemm_ms": best["gemm"] * 1e3,
                         "numpy_ms": best["numpy"] * 1e3, "faiss_ms": faiss_s * 1e3,
                         "vs_numpy": best["numpy"] / best["ours"], "gemm_vs_numpy": best["numpy"] / best["gemm"],
                         "faiss_vs_numpy": best["numpy"] / faiss_s, "rows_as_numpy": float(np.mean(or_ == nr)),
                         "gemm_as_ours": float(np.mean(gr == or_)), "rows_as_faiss": float(np.mean(or_ == fr)),
                         "cpu": cpu, "command": command})
            print(rows[-1], flush=True)
    columns = (["rows", "queries", "excluded", "ours_ms", "faiss_ms", "vs_faiss", "ours_peak_mib", "faiss_peak_mib"]
               if args.exclusion else ["rows", "queries", "path", "ours_ms", "gemm_ms", "numpy_ms", "faiss_ms",
                                       "vs_numpy", "gemm_vs_numpy", "faiss_vs_numpy", "rows_as_numpy"])
    common.print_table(rows, columns)
    common.write_rows(rows, args.out)
    return rows


def exclusion_row(args, index, matrix, queries, exact_search, cpu, command) -> dict:
    """One query excluding its own best `--excluded` rows: ours (masked) against FAISS searched to k + that depth."""
    depth = args.k + args.excluded
    _, first = index.search(queries[:1], args.excluded)
    exclude = [first[0].tolist()] + [None] * (len(queries) - 1)
    fns = {"ours": lambda: exact_search.search(matrix, queries, args.k, exclude, index=index),
           "faiss": lambda: index.search(queries, depth)}
    for fn in fns.values():
        fn()
    best = {"ours": common.best_time(fns["ours"], args.rounds), "faiss": common.best_time(fns["faiss"], args.rounds)}
    ours_peak, (_, got) = peak_bytes(fns["ours"])
    faiss_peak, _ = peak_bytes(fns["faiss"])
    assert not set(got[0].tolist()) & set(exclude[0]), "an excluded row was returned"
    return {"benchmark": "exact_search_exclusion", "rows": len(matrix), "queries": len(queries), "k": args.k,
            "dim": args.dim, "excluded": args.excluded, "ours_ms": best["ours"] * 1e3, "faiss_ms": best["faiss"] * 1e3,
            "vs_faiss": best["faiss"] / best["ours"], "ours_peak_mib": ours_peak / 2**20,
            "faiss_peak_mib": faiss_peak / 2**20, "cpu": cpu, "command": command}


if __name__ == "__main__":
    main()
