"""Search throughput: the FAISS index wrapper against on-device exact search (DeviceIndex) and numpy, in one run.

    python benchmarks/bench_index.py --corpus 100000 --dim 768 --queries 1000 --k 20

Vectors are random unit rows (throughput does not depend on their content; recall of
approximate indexes must be checked on real embeddings, see tests/test_retrieval.py).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--factories", default="Flat,HNSW32")
    p.add_argument("--device-dtypes", default="float32,bfloat16", help="DeviceIndex matrix dtypes")
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args()

    import jax

    from replug_jax.retrieval.device_index import DeviceIndex
    from replug_jax.retrieval.index import DenseIndex

    rng = np.random.default_rng(0)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
    corpus = unit(rng.standard_normal((args.corpus, args.dim), dtype=np.float32))
    queries = unit(rng.standard_normal((args.queries, args.dim), dtype=np.float32))
    command = "python " + " ".join(sys.argv)
    rows = []

    def record(name, seconds):
        rows.append({"benchmark": "index_search", "impl": name, "queries_per_s": args.queries / seconds,
                     "corpus": args.corpus, "dim": args.dim, "k": args.k, "devices": jax.device_count(),
                     "device": jax.devices()[0].device_kind, "command": command})

    def numpy_brute():
        scores = queries @ corpus.T
        top = np.argpartition(-scores, args.k, axis=1)[:, : args.k]
        np.take_along_axis(scores, top, 1)

    fns = {"numpy_brute_force": numpy_brute}
    for dtype in args.device_dtypes.split(","):
        device = DeviceIndex.from_embeddings(corpus, metric="cosine", dtype=dtype)
        device.search(queries, args.k)  # compile
        fns[f"device_index_{dtype}"] = lambda device=device: device.search(queries, args.k)
    for factory in args.factories.split(","):
        index = DenseIndex.build(corpus, metric="cosine", factory=factory)
        fns[f"faiss_{factory}"] = lambda index=index: index.search(queries, args.k)
    for name, seconds in common.interleaved_best(fns, 3).items():
        record(name, seconds)
    flat = next((r["queries_per_s"] for r in rows if r["impl"] == "faiss_Flat"), None)
    for r in rows:
        r["vs_numpy"] = r["queries_per_s"] / rows[0]["queries_per_s"]
        r["vs_faiss_flat"] = r["queries_per_s"] / flat if flat else None
    common.print_table(rows, ["impl", "queries_per_s", "vs_numpy", "vs_faiss_flat"])
    common.write_rows(rows, args.out)


if __name__ == "__main__":
    main()
