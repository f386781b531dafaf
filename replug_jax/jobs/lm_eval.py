"""The language-modelling evaluation job: config in, results.json / results.md / plot out.

Only this module and main.py read configs; everything they call takes plain arguments.
Re-running with the same workdir reuses the datastore, embeddings and indexes that are
still valid (fingerprints of encoder and datastore are checked on load).
"""
from __future__ import annotations

import dataclasses
import os
import resource
import time

import jax
from absl import logging

from replug_jax import console, distributed
from replug_jax.models import precision
from replug_jax.data import wiki
from replug_jax.evaluate import lm as lm_eval
from replug_jax.evaluate import report
from replug_jax.evaluate.windows import document_windows
from replug_jax.lm.cache import CachedLM
from replug_jax.jobs.setup import (GENSIM_WIKI, build_datastore, build_dense_index, load_job_encoder, load_job_lm,
                                   lm_mesh_record, lm_tokenizer, make_retrievers, read_documents)
from replug_jax.retrieval import datastore as ds
from replug_jax.retrieval.index import DenseIndex


WIKI_SPLITS = ("by_article", "related")


def demo_split(workdir: str, eval_fraction: float, train_fraction: float, seed: int, how: str = "by_article",
               held_out_fraction: float = 0.5) -> dict[str, str]:
    """Split gensim's Wikipedia articles into WORKDIR/data/{datastore,eval,train}.jsonl.

    how "by_article": whole articles go to one part (`wiki.split_articles`); "related": the datastore also
    holds the opening part of each eval and train article (`wiki.split_related`)."""
    articles = wiki.load_wiki_articles()
    if how == "by_article":
        parts = wiki.split_articles(articles, eval_fraction=eval_fraction, train_fraction=train_fraction, seed=seed)
    elif how == "related":
        parts = wiki.split_related(articles, eval_fraction=eval_fraction, train_fraction=train_fraction,
                                   held_out_fraction=held_out_fraction, seed=seed)
    else:
        raise ValueError(f"wiki_split must be one of {WIKI_SPLITS}, got {how!r}")
    paths = {}
    for name, docs in parts.items():
        paths[name] = os.path.join(workdir, "data", f"{name}.jsonl")
        wiki.write_jsonl(docs, paths[name])
    return paths


def data_paths(config, workdir: str) -> dict[str, str]:
    """{"datastore": ..., "eval": ..., "train": ...} paths, materialising the demo split if asked for."""
    if GENSIM_WIKI in (config.corpus, config.eval_data):
        split = demo_split(workdir, config.get("eval_fraction", 0.1), config.get("train_fraction", 0.1), config.seed,
                           config.get("wiki_split", "by_article"), config.get("held_out_fraction", 0.5))
    else:
        split = {}
    resolve = lambda value, part: split[part] if value == GENSIM_WIKI else value
    paths = {"datastore": resolve(config.corpus, "datastore"), "eval": resolve(config.eval_data, "eval")}
    if config.get("train_data"):
        paths["train"] = resolve(config.train_data, "train")
    return paths


def make_windows(eval_path: str, tokenizer, config) -> list:
    docs = read_documents(eval_path)[: config.max_eval_docs]
    windows = []
    for doc in docs:
        windows += document_windows(doc.id, doc.text, tokenizer, stride_tokens=config.stride_tokens,
                                    query_tokens=config.query_tokens, context_tokens=config.context_tokens,
                                    max_windows=config.max_windows_per_doc or None)
    if not windows:
        raise ValueError(f"{eval_path}: no evaluation windows (empty held-out documents?)")
    return windows


@dataclasses.dataclass
class Setup:
    """What every job builds first: data paths, models, the datastore and its dense index."""

    paths: dict
    encoder: object
    lm: object
    tokenizer: object
    store: ds.Datastore
    index: DenseIndex
    started: float


def prepare(config, workdir: str) -> Setup:
    """Load the models and build (or reuse) the datastore, embeddings and index in `workdir`."""
    started = time.time()
    os.makedirs(workdir, exist_ok=True)
    shared = config.get("cache_dir") or workdir  # data split, datastore, embeddings and index: shareable by runs
    dtype = precision.resolve(config.dtype)
    paths = distributed.lead_first(lambda: data_paths(config, shared))  # one writer of the data split
    console.phase(f"data: corpus {paths['datastore']}, held-out {paths['eval']}")
    encoder = load_job_encoder(config, dtype)
    lm = load_job_lm(config, dtype)
    tokenizer = lm_tokenizer(lm, config)
    kind = type(lm).__name__
    if config.get("lm_cache"):
        path = distributed.per_process_path(config.lm_cache)  # one file per process (shared file systems)
        lm = CachedLM(lm, path)
        kind += f", scores cached in {path}"
    console.phase(f"models: encoder {config.encoder}, LM {config.lm} ({kind})")
    store = distributed.lead_first(lambda: build_datastore(paths["datastore"], tokenizer, config.doc_tokens, shared))
    console.phase(f"datastore: {len(store):,} passages of up to {config.doc_tokens} LM tokens")
    index = build_dense_index(encoder, store, shared, metric=config.metric, factory=config.index_factory,
                              embedding_dtype=config.embedding_dtype, backend=config.get("index_backend", "faiss"),
                              device_dtype=config.get("device_index_dtype", "float32"))
    return Setup(paths, encoder, lm, tokenizer, store, index, started)


def evaluate_and_report(config, workdir: str, setup: Setup, retrievers: dict, extra: dict | None = None,
                        temperatures: dict | None = None, temperature_sweep=()) -> dict:
    """Score every method on the held-out windows; write results.json, results.md and the plot.

    temperatures: per-retriever τ overriding config.temperature (bm25: config.bm25_temperature);
    temperature_sweep: τ values reported besides config.temperature_sweep."""
    windows = make_windows(setup.paths["eval"], setup.tokenizer, config)
    logging.info("datastore %d chunks; %d evaluation windows", len(setup.store), len(windows))
    results = lm_eval.evaluate_lm(
        setup.lm, windows, setup.store, retrievers, k=config.get("eval_k") or config.k, k_sweep=tuple(config.k_sweep),
        sweep_retrievers=("replug", "replug_lsr", "random"),
        concat_retriever="replug" if "concat" in config.methods else None, temperature=config.temperature,
        temperatures={"bm25": config.bm25_temperature, **(temperatures or {})},
        temperature_sweep=tuple(sorted({*config.get("temperature_sweep", ()), *temperature_sweep})))
    results.update({"encoder": config.encoder, "lm": config.lm, "lm_mesh": lm_mesh_record(setup.lm),
                    "datastore_chunks": len(setup.store),
                    "doc_tokens": config.doc_tokens, "query_tokens": config.query_tokens,
                    "context_tokens": config.context_tokens, "stride_tokens": config.stride_tokens,
                    "metric": config.metric, "seconds": time.time() - setup.started, "processes": jax.process_count(),
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **(extra or {})})
    if hasattr(setup.lm, "stats"):  # several processes: one entry per process, each for its own share
        stats = distributed.allgather_json(setup.lm.stats())
        results["lm_requests"] = stats[0] if len(stats) == 1 else stats
    if distributed.is_lead():  # several processes: one writer
        print(report.write_results(results, workdir))
        print(f"results in {os.path.join(workdir, 'results.json')}")
    return results


def run_lm_eval(config, workdir: str) -> dict:
    """Build or reuse the retrieval side, score every method, write and print the results."""
    setup = prepare(config, workdir)
    retrievers = make_retrievers(config.methods, setup.encoder, setup.store, setup.index, config.seed)
    return evaluate_and_report(config, workdir, setup, retrievers)
