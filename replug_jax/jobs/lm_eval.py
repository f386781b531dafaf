"""The language-modelling evaluation job: config in, results.json / results.md / plot out.

Only this module and main.py read configs; everything they call takes plain arguments.
Re-running with the same workdir reuses the datastore, embeddings and indexes that are
still valid (fingerprints of encoder and datastore are checked on load).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import resource
import time

import jax
import jax.numpy as jnp
from absl import logging

import replug_jax as rj
from replug_jax import console, distributed
from replug_jax.data import wiki
from replug_jax.evaluate import lm as lm_eval
from replug_jax.evaluate import report
from replug_jax.evaluate.windows import document_windows
from replug_jax.lm.cache import CachedLM
from replug_jax.retrieval import datastore as ds
from replug_jax.retrieval.bm25 import BM25Index
from replug_jax.retrieval import build
from replug_jax.retrieval.device_index import DeviceIndex
from replug_jax.retrieval.embeddings import embed_corpus_split
from replug_jax.retrieval.index import DenseIndex
from replug_jax.retrieval.retriever import BM25Retriever, DenseRetriever, RandomRetriever, index_meta

GENSIM_WIKI = "gensim_wiki"


def read_documents(source: str) -> list[ds.Document]:
    """Documents from a JSONL file, a .txt file, a directory of .txt files, or "tfds:NAME:SPLIT[:TEXT_KEY[:TITLE_KEY]]"
    (an array_record TFDS dataset under $TFDS_DATA_DIR, or downloaded by TFDS)."""
    if not source:
        raise ValueError("no document source given (set --config.corpus / --config.eval_data)")
    if source.startswith("tfds:"):  # tfds:NAME:SPLIT[:TEXT_KEY[:TITLE_KEY]], prepared under $TFDS_DATA_DIR
        name, split, *keys = source.split(":")[1:]
        return list(ds.read_tfds(name, split, text_key=keys[0] if keys else "text",
                                 title_key=keys[1] if len(keys) > 1 else None,
                                 data_dir=os.environ.get("TFDS_DATA_DIR") or None))
    if os.path.isdir(source):
        paths = sorted(glob.glob(os.path.join(source, "*.txt")))
        if not paths:
            raise ValueError(f"{source}: directory has no .txt files")
        return list(ds.read_text_files(paths))
    if not os.path.isfile(source):
        raise ValueError(f"{source}: no such file")
    if source.endswith(".txt"):
        return list(ds.read_text_files([source]))
    return list(ds.read_jsonl(source))


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


def build_datastore(corpus_path: str, tokenizer, doc_tokens: int, workdir: str) -> ds.Datastore:
    """Chunk the corpus into `doc_tokens`-token passages; reuse WORKDIR/datastore.jsonl if built from the same input."""
    path = os.path.join(workdir, "datastore.jsonl")
    stamp_path = path + ".source.json"
    stamp = {"corpus": corpus_path, "doc_tokens": doc_tokens, "tokenizer_vocab": tokenizer.vocab_size}
    if os.path.isfile(corpus_path):  # a changed file is re-chunked; a directory or TFDS source is trusted by name
        stamp.update(corpus=os.path.abspath(corpus_path), size=os.path.getsize(corpus_path),
                     mtime_ns=os.stat(corpus_path).st_mtime_ns)
    if os.path.isfile(path) and os.path.isfile(stamp_path):
        with open(stamp_path) as f:
            if json.load(f) == stamp:
                return ds.Datastore.load(path)
    store = ds.chunk_documents(read_documents(corpus_path), tokenizer, chunk_tokens=doc_tokens)
    store.save(path)
    with ds.atomic_open(stamp_path) as f:
        json.dump(stamp, f)
    return store


INDEX_BACKENDS = ("faiss", "device")


def build_dense_index(encoder, store: ds.Datastore, workdir: str, *, metric: str, factory: str,
                      embedding_dtype: str, name: str = "dense", backend: str = "faiss",
                      device_dtype: str = "float32") -> DenseIndex | DeviceIndex:
    """WORKDIR/index_{name}: reused while its fingerprints match, else embedded (resumable) and built.

    backend "device": no FAISS index; the embeddings (WORKDIR/embeddings_{name}.npy, reused while they
    match encoder and datastore) are searched on the devices (`DeviceIndex`, matrix in `device_dtype`)."""
    if backend not in INDEX_BACKENDS:
        raise ValueError(f"index_backend must be one of {INDEX_BACKENDS}, got {backend!r}")
    embeddings_path = os.path.join(workdir, f"embeddings_{name}.npy")
    if backend == "device":
        embeddings = embed_corpus_split(encoder, store.texts, embeddings_path, dtype=embedding_dtype)
        index = DeviceIndex.from_embeddings(embeddings, metric=metric, dtype=device_dtype,
                                            meta=index_meta(encoder, store))
        console.phase(f"index {name}: {index.count:,} vectors on {index.mesh.devices.size} devices "
                      f"({device_dtype}), {metric}, exact search")
        return index
    index, reused = build.build_dense_index(encoder, store, os.path.join(workdir, f"index_{name}"), metric=metric,
                                            factory=factory, embedding_dtype=embedding_dtype,
                                            embeddings_path=embeddings_path)
    console.phase(f"index {name}: {index.count:,} vectors, {metric}, {factory} ({'reused' if reused else 'embedded and built'})")
    return index


def make_retrievers(methods, encoder, store: ds.Datastore, index: DenseIndex, seed: int) -> dict:
    retrievers = {"replug": DenseRetriever(encoder, index, store)}
    if "random" in methods:
        retrievers["random"] = RandomRetriever(store, seed=seed)
    if "bm25" in methods:
        retrievers["bm25"] = BM25Retriever(BM25Index.build(store.texts), store)
    return retrievers


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


def load_job_lm(config, dtype):
    """The job's black-box LM: a local model, or a server URL whose tokenizer is `config.lm_tokenizer`
    (then HTTPLM sends token-id prompts, the contract's rule)."""
    remote = config.lm.startswith(("http://", "https://"))
    options = {"tokenizer": config.lm_tokenizer} if remote and config.get("lm_tokenizer") else {}
    return rj.load_lm(config.lm, batch_size=config.lm_batch_size, max_length=config.lm_max_length or None,
                      dtype=dtype, **options)


def lm_tokenizer(lm, config):
    """The tokenizer that cuts passages and windows: the LM's own, or config.lm_tokenizer for a remote LM."""
    if getattr(lm, "tokenizer", None) is not None:
        return lm.tokenizer
    if config.get("lm_tokenizer"):
        return rj.load_tokenizer(config.lm_tokenizer)
    raise ValueError(f"LM {config.lm!r} has no local tokenizer to cut passages and windows: set --config.lm_tokenizer")


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
    dtype = jnp.dtype(config.dtype)
    paths = distributed.lead_first(lambda: data_paths(config, shared))  # one writer of the data split
    console.phase(f"data: corpus {paths['datastore']}, held-out {paths['eval']}")
    encoder = rj.load_encoder(config.encoder, batch_size=config.encoder_batch_size,
                              normalize=config.metric == "cosine", dtype=dtype)
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
    results.update({"encoder": config.encoder, "lm": config.lm, "datastore_chunks": len(setup.store),
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
