"""What every job sets up, in one place: documents, the datastore, its dense index, retrievers and the LM.

Used by the LM-evaluation, LSR and downstream jobs alike (jobs/lm_eval.py, jobs/lsr.py, jobs/downstream.py);
each takes plain arguments or the job's config.
"""
from __future__ import annotations

import glob
import json
import os

import replug_jax as rj
from replug_jax import console, sharding
from replug_jax.models import precision
from replug_jax.models.tokenizer import TextTokenizer
from replug_jax.retrieval import build
from replug_jax.retrieval import datastore as ds
from replug_jax.retrieval.bm25 import BM25Index
from replug_jax.retrieval.device_index import DeviceIndex
from replug_jax.retrieval.index import DenseIndex
from replug_jax.retrieval.retriever import BM25Retriever, DenseRetriever, RandomRetriever

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


def build_dense_index(encoder, store: ds.Datastore, workdir: str, *, metric: str, factory: str,
                      embedding_dtype: str, name: str = "dense", backend: str = "faiss",
                      device_dtype: str = "float32") -> DenseIndex | DeviceIndex:
    """WORKDIR/index_{name} through `retrieval.build.build_index` (FAISS, or exact search on the devices), with
    one console line saying what it is and whether it was reused."""
    index, reused = build.build_index(encoder, store, workdir, name=name, metric=metric, factory=factory,
                                      embedding_dtype=embedding_dtype, backend=backend, device_dtype=device_dtype)
    if isinstance(index, DeviceIndex):
        console.phase(f"index {name}: {index.count:,} vectors on {index.mesh.devices.size} devices "
                      f"({device_dtype}), {metric}, exact search")
    else:
        console.phase(f"index {name}: {index.count:,} vectors, {metric}, {factory} "
                      f"({'reused' if reused else 'embedded and built'})")
    return index


def make_retrievers(methods, encoder, store: ds.Datastore, index: DenseIndex, seed: int) -> dict:
    retrievers = {"replug": DenseRetriever(encoder, index, store)}
    if "random" in methods:
        retrievers["random"] = RandomRetriever(store, seed=seed)
    if "bm25" in methods:
        retrievers["bm25"] = BM25Retriever(BM25Index.build(store.texts), store)
    return retrievers


def load_job_encoder(config, dtype):
    """The job's retriever encoder (unit embeddings for the cosine metric), in the config's dtypes."""
    return rj.load_encoder(config.encoder, batch_size=config.encoder_batch_size, normalize=config.metric == "cosine",
                           dtype=dtype, param_dtype=precision.weights_option(config.get("param_dtype")))


def load_job_lm(config, dtype):
    """The job's black-box LM: a local model, or a server URL whose tokenizer is `config.lm_tokenizer`
    (then HTTPLM sends token-id prompts, the contract's rule)."""
    remote = config.lm.startswith(("http://", "https://"))
    if remote:
        options = {"tokenizer": config.lm_tokenizer} if config.get("lm_tokenizer") else {}
    else:
        options = {"mesh": sharding.job_lm_mesh(config.get("lm_model_parallel", 1)),
                   "param_dtype": precision.weights_option(config.get("param_dtype"))}
    return rj.load_lm(config.lm, batch_size=config.lm_batch_size, max_length=config.lm_max_length or None,
                      dtype=dtype, **options)


def lm_mesh_record(lm) -> dict | None:
    """results.json's "lm_mesh": {"data": D, "model": M} of a local LM (None for a server)."""
    mesh = getattr(lm, "mesh", None)
    return sharding.mesh_shape(mesh) if mesh is not None else None


def lm_tokenizer(lm, config):
    """The tokenizer that cuts passages and windows: the LM's own, or config.lm_tokenizer for a remote LM."""
    if isinstance(getattr(lm, "tokenizer", None), TextTokenizer):  # (a server's /tokenize cannot cut text)
        return lm.tokenizer
    if config.get("lm_tokenizer"):
        return rj.load_tokenizer(config.lm_tokenizer)
    raise ValueError(f"LM {config.lm!r} has no local tokenizer to cut passages and windows: set --config.lm_tokenizer")
