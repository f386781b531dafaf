"""Exact search on CPU: FAISS's flat index against one blocked GEMM + partial top-k over the same rows, in one run.

    python benchmarks/bench_search.py --rows 10000,156520,1000000 --queries 1,16,512 --k 10

Rows and queries are random unit vectors (384 wide, MiniLM's); both paths read the FAISS index's own rows. Prints
each one's best time of 3 interleaved rounds, the ratio (FAISS time / GEMM time: above 1, the GEMM is faster) and
whether the rankings are identical; `DenseIndex.search` takes the GEMM where this says so (exact_search.py).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="10000,156520,1000000")
    p.add_argument("--queries", default="1,16,512")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--k", type=int, default=10)
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
            fns = {"faiss_flat": lambda: index.search(queries, args.k),
                   "gemm_top_k": lambda: exact_search.top_k(matrix, queries, args.k)}
            for fn in fns.values():
                fn()  # warm-up
            best = common.interleaved_best(fns, rounds=3)
            (fs, fr), (gs, gr) = fns["faiss_flat"](), fns["gemm_top_k"]()
            rows.append({"benchmark": "exact_search", "rows": n, "queries": q, "k": args.k, "dim": args.dim,
                         "faiss_ms": best["faiss_flat"] * 1e3, "gemm_ms": best["gemm_top_k"] * 1e3,
                         "gemm_speedup": best["faiss_flat"] / best["gemm_top_k"],
                         "identical_rows": float(np.mean(fr == gr)), "max_score_diff": float(np.abs(fs - gs).max()),
                         "cpu": cpu, "command": command})
            print(rows[-1])
    common.print_table(rows, ["rows", "queries", "faiss_ms", "gemm_ms", "gemm_speedup", "identical_rows"])
    common.write_rows(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
