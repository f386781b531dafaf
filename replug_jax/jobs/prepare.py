"""A job's workspace: what every job prepares before its own work, in one module that is not a job.

The documents and the data split, the datastore, its dense index, the encoder, the black-box LM, the
retrievers and an LSR-trained retriever, each built in (or reused from) the workdir. The LM-evaluation,
LSR and downstream jobs (`replug_jax/jobs/`), the experiments and the benchmarks all build them here, so no
job imports another. As the Flax examples' input pipeline serves their `train.py`, the functions at the top
take plain arguments and the few at the bottom (`prepare`, `load_job_encoder`, ...) take the job's config.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import time

from replug_jax.loading import load_encoder, load_lm
from replug_jax.base import console, settings
from replug_jax.base.errors import InputError
from replug_jax.data import question_sets, wiki
from replug_jax.evaluate.windows import document_windows
from replug_jax.jobs.input_checks import check_depth_fits
from replug_jax.jobs.trained_retriever import (  # noqa: F401
    TRAIN_QUESTIONS,
    TRAINED_RETRIEVER,
    load_trained_encoder,
    retriever_folder,  # (re-exported: the jobs' one module of what they prepare)
)
from replug_jax.lm.cache import CachedLM
from replug_jax.models import precision
from replug_jax.models.tokenizer import tokenizer_fingerprint
from replug_jax.parallel import distributed, sharding
from replug_jax.retrieval import build, chunk_shares, datastore as ds
from replug_jax.retrieval.bm25 import BM25Index
from replug_jax.retrieval.device_index import DeviceIndex
from replug_jax.retrieval.index import DenseIndex
from replug_jax.retrieval.retriever import BM25Retriever, DenseRetriever, RandomRetriever

GENSIM_WIKI = "gensim_wiki"  # the offline demo corpus: gensim's Wikipedia articles
SCIQ_CORPUS = "sciq"  # SciQ's support paragraphs plus gensim's Wikipedia articles as distractor text
WIKI_SPLITS = ("by_article", "related")


def read_documents(source: str) -> list[ds.Document]:
    """Documents from a JSONL file, a .txt file, a directory of .txt files, or "tfds:NAME:SPLIT[:TEXT_KEY[:TITLE_KEY]]"
    (an array_record TFDS dataset under $TFDS_DATA_DIR, or downloaded by TFDS)."""
    if not source:
        raise InputError("no document source given (set --config.corpus / --config.eval_data)")
    if source.startswith("tfds:"):  # tfds:NAME:SPLIT[:TEXT_KEY[:TITLE_KEY]], prepared under $TFDS_DATA_DIR
        name, split, *keys = source.split(":")[1:]
        return list(ds.read_tfds(name, split, text_key=keys[0] if keys else "text",
                                 title_key=keys[1] if len(keys) > 1 else None,
                                 data_dir=os.environ.get("TFDS_DATA_DIR") or None))
    if os.path.isdir(source):
        paths = sorted(glob.glob(os.path.join(source, "*.txt")))
        if not paths:
            raise InputError(f"{source}: directory has no .txt files")
        return list(ds.read_text_files(paths))
    if not os.path.isfile(source):
        raise InputError(f"{source}: no such file")
    return list(ds.read_document_file(source))


def build_datastore(corpus_path: str, tokenizer, doc_tokens: int, workdir: str,
                    drop_empty: bool = False) -> ds.Datastore:
    """Chunk the corpus into `doc_tokens`-token passages; reuse WORKDIR/datastore.jsonl if built from the same input.
    With several processes a collective call: each chunks a share of the documents (`chunk_shares`)."""
    stamp = {"corpus": corpus_path, "doc_tokens": doc_tokens, "tokenizer": tokenizer_fingerprint(tokenizer),
             "format": ds.FILE_FORMAT}
    if os.path.isfile(corpus_path):  # a changed file is re-chunked; a directory or TFDS source is trusted by name
        stamp.update(corpus=os.path.abspath(corpus_path), size=os.path.getsize(corpus_path),
                     mtime_ns=os.stat(corpus_path).st_mtime_ns)
    return chunk_shares.chunked_datastore(lambda: read_documents(corpus_path), tokenizer, doc_tokens,
                                          os.path.join(workdir, "datastore.jsonl"), stamp, drop_empty)


def job_index(encoder, store: ds.Datastore, workdir: str, *, metric: str, factory: str,
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
    """{"replug": dense retriever, and "random" / "bm25" when `methods` names them}."""
    retrievers = {"replug": DenseRetriever(encoder, index, store)}
    if "random" in methods:
        retrievers["random"] = RandomRetriever(store, seed=seed)
    if "bm25" in methods:
        retrievers["bm25"] = BM25Retriever(BM25Index.build(store.texts), store)
    return retrievers


def load_job_encoder(config, dtype):
    """The job's retriever encoder (unit embeddings for the cosine metric), in the config's dtypes."""
    return load_encoder(config.encoder, batch_size=config.encoder_batch_size, normalize=config.metric == "cosine",
                        dtype=dtype, param_dtype=precision.weights_option(config.get("param_dtype")))


HTTP_CLIENT_KEYS = dict(zip(settings.HTTP_CLIENT, ("timeout", "max_retries", "concurrency")))  # key: HTTPLM's argument


def load_job_lm(config, dtype):
    """The job's black-box LM: a local model, or a server URL whose tokenizer is `config.lm_tokenizer` (a model
    name, loaded locally) or, when that is "", the server's own /tokenize (either way HTTPLM sends token-id
    prompts, the contract's rule)."""
    remote = config.lm.startswith(("http://", "https://"))
    if remote:
        options = {"tokenizer": config.lm_tokenizer} if config.get("lm_tokenizer") else {}
        if config.get("lm_prompts_per_request"):  # 0 or unset: the probe decides
            options["prompts_per_request"] = config.lm_prompts_per_request
        options.update({name: config[key] for key, name in HTTP_CLIENT_KEYS.items() if key in config})
        return load_lm(config.lm, batch_size=config.lm_batch_size, max_length=config.lm_max_length or None,
                       **options)  # the server's own precision: `input_checks.precision_a_server_ignores` says so
    options = {"mesh": sharding.job_lm_mesh(config.get("lm_model_parallel", 1)),
               "param_dtype": precision.weights_option(config.get("param_dtype"))}
    if config.get("lm_generation_questions"):
        options["generation_questions"] = config.lm_generation_questions
    return load_lm(config.lm, batch_size=config.lm_batch_size, max_length=config.lm_max_length or None,
                   dtype=dtype, **options)


def lm_mesh_record(lm) -> dict | None:
    """results.json's "lm_mesh": {"data": D, "model": M} of a local LM (None for a server)."""
    mesh = getattr(lm, "mesh", None)
    return sharding.mesh_shape(mesh) if mesh is not None else None


def lm_tokenizer(lm, config):
    """The tokenizer that cuts passages and windows: the LM's own; for a server, config.lm_tokenizer (which
    `load_job_lm` gave it) or its /tokenize (without character offsets: `models.tokenizer.piece_token_starts`)."""
    if getattr(lm, "tokenizer", None) is not None:
        return lm.tokenizer
    raise InputError(f"--config.lm={config.lm!r}: the server has no /tokenize to cut passages and windows with: set "
                     "--config.lm_tokenizer to its model's tokenizer (a model name, as --config.lm takes)")


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
        raise InputError(f"wiki_split must be one of {WIKI_SPLITS}, got {how!r}")
    paths = {}
    for name, docs in parts.items():
        paths[name] = os.path.join(workdir, "data", f"{name}.jsonl")
        wiki.write_jsonl(docs, paths[name])
    return paths


def corpus_documents_file(corpus: str, workdir: str, split: str = "validation") -> str:
    """The file of documents that `corpus` names: a path as given, or the offline corpora written to
    WORKDIR/data/corpus.jsonl ("gensim_wiki": gensim's articles; "sciq": SciQ's support paragraphs of `split`
    followed by gensim's articles)."""
    if corpus not in (GENSIM_WIKI, SCIQ_CORPUS):
        return corpus
    documents = wiki.load_wiki_articles()
    if corpus == SCIQ_CORPUS:
        documents = question_sets.sciq_support_documents(split) + documents
    path = os.path.join(workdir, "data", "corpus.jsonl")
    wiki.write_jsonl(documents, path)
    return path


def build_corpus(corpus: str, tokenizer, doc_tokens: int, workdir: str, *, split: str = "validation",
                 max_passages: int | None = None, drop_empty: bool = False) -> ds.Datastore:
    """The downstream jobs' datastore: the offline corpora (`corpus_documents_file`) or documents chunked into
    `doc_tokens`-token passages, or DPR's passages (a .tsv, kept whole); a document or passage without text refused
    naming it, or left out with `drop_empty` (`datastore.with_text`)."""
    if corpus.endswith(".tsv"):
        passages = question_sets.read_dpr_passages(corpus, limit=max_passages)
        return question_sets.passages_datastore(ds.with_text(passages, drop_empty))
    path = distributed.lead_first(lambda: corpus_documents_file(corpus, workdir, split))  # one writer of the file
    return build_datastore(path, tokenizer, doc_tokens, workdir, drop_empty)


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
    """The held-out evaluation windows of the documents in `eval_path` (config: their sizes and counts)."""
    docs = list(ds.with_text(read_documents(eval_path), config.get("drop_empty_documents", False)))  # the one rule
    docs = docs[: config.max_eval_docs]
    windows = []
    for doc in docs:
        windows += document_windows(doc.id, doc.text, tokenizer, stride_tokens=config.stride_tokens,
                                    query_tokens=config.query_tokens, context_tokens=config.context_tokens,
                                    max_windows=config.max_windows_per_doc or None)
    if not windows:
        raise InputError(f"{eval_path}: no evaluation windows (empty held-out documents?)")
    return windows


@dataclasses.dataclass
class Workspace:
    """What every job builds first: data paths, models, the datastore and its dense index."""

    paths: dict
    encoder: object
    lm: object
    tokenizer: object
    store: ds.Datastore
    index: DenseIndex
    started: float


LM_CACHE_IN_WORKDIR = "workdir"  # config.lm_cache's default: WORKDIR/lm_cache.sqlite
LM_CACHE_FILE = "lm_cache.sqlite"


def lm_cache_path(config, workdir: str | None) -> str:
    """The LM cache file config.lm_cache names ("workdir": WORKDIR/lm_cache.sqlite; "": none)."""
    value = config.get("lm_cache") or ""
    if value != LM_CACHE_IN_WORKDIR:
        return value
    if workdir is None:
        raise ValueError(f"lm_cache={LM_CACHE_IN_WORKDIR!r} needs the job's workdir")
    return os.path.join(workdir, LM_CACHE_FILE)


def cached_lm(lm, config, workdir: str | None = None):
    """`lm` behind the persistent score cache config.lm_cache names (`lm_cache_path`; one file per process), or
    `lm` itself. The default caches in the workdir, so the same command rerun after a failure resumes where it
    stopped: every score and generated answer it had is read back, not asked again."""
    path = lm_cache_path(config, workdir)
    if not path:
        return lm
    return CachedLM(lm, distributed.per_process_path(path))  # one file per process (shared file systems)


def prepare(config, workdir: str) -> Workspace:
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
    lm = cached_lm(lm, config, workdir)
    if isinstance(lm, CachedLM):
        kind += f", scores cached in {lm.path}"
    console.phase(f"models: encoder {config.encoder}, LM {config.lm} ({kind})")
    store = build_datastore(paths["datastore"], tokenizer, config.doc_tokens, shared,
                            config.get("drop_empty_documents", False))
    console.phase(f"datastore: {len(store):,} passages of up to {config.doc_tokens} LM tokens")
    check_depth_fits(config, len(store))  # before any embedding
    index = job_index(encoder, store, shared, metric=config.metric, factory=config.index_factory,
                      embedding_dtype=config.embedding_dtype, backend=config.get("index_backend", "faiss"),
                      device_dtype=config.get("device_index_dtype", "float32"))
    return Workspace(paths, encoder, lm, tokenizer, store, index, started)


def prepare_downstream(config, workdir: str, lm=None, given=None) -> Workspace:
    """A downstream job's models, datastore and dense index (QA, MMLU, LSR on QA pairs): `lm` (loaded when None)
    behind `config.lm_cache`, the corpus cut with its tokenizer and embedded under cache_dir (else the workdir).
    `given` (a retrieval/given.py GivenRetrieval): its passages are the datastore, and no encoder or index is made."""
    started = time.time()
    shared = config.get("cache_dir") or workdir  # datastore, embeddings and index: shareable by runs
    os.makedirs(shared, exist_ok=True)
    dtype = precision.resolve(config.dtype)
    encoder = load_job_encoder(config, dtype) if given is None else None
    lm = lm if lm is not None else load_job_lm(config, dtype)
    tokenizer = lm_tokenizer(lm, config)
    lm = cached_lm(lm, config, workdir)
    cached = f", scores and answers cached in {lm.path}" if isinstance(lm, CachedLM) else ""
    retriever = f"encoder {config.encoder}" if given is None else "retrieval given"
    console.phase(f"models: {retriever}, LM {config.lm} ({type(lm).__name__}{cached})")
    if given is not None:
        return Workspace({"shared": shared}, None, lm, tokenizer, given.store, None, started)
    store = build_corpus(
        config.corpus, tokenizer, config.doc_tokens, shared, split=config.get("split", "validation"),
        max_passages=config.get("max_passages") or None, drop_empty=config.get("drop_empty_documents", False))
    check_depth_fits(config, len(store))  # before any embedding
    console.phase(f"datastore: {len(store):,} passages")
    index = job_index(encoder, store, shared, metric=config.metric, factory=config.index_factory,
                      embedding_dtype=config.embedding_dtype)
    return Workspace({"shared": shared}, encoder, lm, tokenizer, store, index, started)


def trained_retriever(encoder, trained, train_documents: bool, store, index, workdir: str, *, metric: str,
                      factory: str, embedding_dtype: str) -> DenseRetriever:
    """The REPLUG LSR retriever: the trained encoder on both sides (an index re-embedded with it in
    WORKDIR/index_lsr), or, query-side only, the trained query encoder over the original `index`."""
    if not train_documents:
        return DenseRetriever(trained, index, store, document_encoder=encoder)
    index_lsr = job_index(trained, store, workdir, metric=metric, factory=factory,
                          embedding_dtype=embedding_dtype, name="lsr")
    return DenseRetriever(trained, index_lsr, store)


def cut_warnings(prepared) -> list[str]:
    """What the run says of its text cuts: token starts estimated by a server's ids-only /tokenize (none otherwise)."""
    note = getattr(prepared.tokenizer, "offsets_note", None)
    return [note] if note else []
