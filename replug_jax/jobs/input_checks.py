"""A job's inputs checked in its first second, before any model loads or any corpus is embedded.

`check_job_inputs(config)` raises `InputError` (a ValueError) naming the config key, what is wrong and what
would work: first each key's type and range as base/settings.py declares them (k below 1, a temperature that is
not positive, a negative count, an unknown choice, a key no job reads), then what ties keys and files together: files
that do not exist, unknown model names, unknown methods or data sets, a missing trained retriever, k beyond a
datastore whose size is known, a re-ranking depth below k. Every job
reads `--config.methods` through `read_methods` (a comma-separated string or a tuple). What can only be known
later (a hub id without a network, a malformed line deep in a file, k beyond a large corpus's passages) is
still reported where it is found. main.py prints an InputError as one line and exits 2 (replug_jax/base/errors.py).
"""
from __future__ import annotations

import glob
import math
import os

from replug_jax.base import settings
from replug_jax.base.errors import InputError
from replug_jax.models import registry, split_gguf

DOCUMENT_NAMES = ("gensim_wiki",)  # offline corpora known by name
CORPUS_NAMES = DOCUMENT_NAMES + ("sciq",)
QA_NAMES = ("nq_open", "trivia_qa", "sciq", "demo")
MC_NAMES = ("mmlu", "sciq")
COUNTED_CORPUS_BYTES = 16 << 20  # a corpus file up to this size is read in the first second to bound its passages


def _check_path_or_name(key: str, value: str, names: tuple[str, ...]) -> None:
    if not value:
        raise InputError(f"--config.{key} is empty: give a file or one of {', '.join(names)}")
    if value in names or value.startswith("tfds:") or value.endswith(".tsv") and os.path.isfile(value):
        return
    if "://" in value:
        raise InputError(f"--config.{key}={value!r}: inputs are read from local or shared file systems (or "
                         "tfds:NAME:SPLIT with $TFDS_DATA_DIR on a bucket); copy it to a local path")
    if not os.path.exists(os.path.expanduser(value)):
        raise InputError(f"--config.{key}={value!r}: no such file or directory (or give one of {', '.join(names)})")
    folder = os.path.expanduser(value)
    if os.path.isfile(folder):
        _check_format(key, folder)
    if key in ("corpus", "eval_data", "train_data") and os.path.isdir(folder) and not glob.glob(
            os.path.join(folder, "*.txt")):
        raise InputError(f"--config.{key}={value!r}: a folder without .txt files (a folder's documents are its .txt "
                         "files; or give a JSONL file)")


# file kinds no job reads, by extension: named in the refusal, with what the key takes
NOT_READ = {".csv": "a CSV", ".xlsx": "an Excel", ".xls": "an Excel", ".parquet": "a Parquet", ".arrow": "an Arrow",
            ".pdf": "a PDF", ".docx": "a Word", ".html": "an HTML", ".htm": "an HTML", ".xml": "an XML",
            ".gz": "a gzip-compressed", ".bz2": "a bzip2-compressed", ".xz": "an xz-compressed", ".zip": "a zip",
            ".tar": "a tar", ".pkl": "a pickle", ".npy": "a NumPy"}
DOCUMENT_FORMATS = ('JSON Lines (one {"text": ..., "title"?: ..., "id"?: ...} object per line), a UTF-8 .txt file '
                    "or a folder of .txt files")
QUESTION_FORMATS = ('JSON Lines (one {"question": ..., "answers": [...]} object per line), or a DPR/FiD retrieval file '
                    '(rows with "ctxs")')
TAKES = {"corpus": DOCUMENT_FORMATS + ", or DPR's psgs_w100.tsv", "eval_data": DOCUMENT_FORMATS,
         "train_data": DOCUMENT_FORMATS + ', or JSON Lines of {"question": ..., "answers": [...]}',
         "questions": QUESTION_FORMATS, "demos": QUESTION_FORMATS}


def _check_format(key: str, path: str) -> None:
    """A file of a kind the key does not take (CSV, Excel, a JSON array, ...), named for what it is."""
    if key not in TAKES:
        return
    extension = os.path.splitext(path)[1].lower()
    kind = NOT_READ.get(extension)
    if kind is None and extension == ".json":
        with open(path, "rb") as f:
            start = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
        kind = "a JSON array" if start.startswith(b"[") else None
        if kind and key in ("questions", "demos") and _holds_ctxs(path):
            return  # DPR's / FiD's retrieval file: its rows' questions and answers are read (question_sets.load_qa)
    if kind is not None:
        raise InputError(f"--config.{key}={path!r} is {kind} file, which the job does not read: give {TAKES[key]}")


def _holds_ctxs(path: str) -> bool:
    """Whether a JSON array file's first row has "ctxs" (a DPR/FiD retrieval file), read from its first MiB: a row's
    question and answers come before its passages there."""
    with open(path, "rb") as f:
        return b'"ctxs"' in f.read(1 << 20)


ROLES = {"lm": "an LM", "encoder": "an encoder"}


def check_model(key: str, name: str) -> None:
    """A model name the registry knows, an installed reader, a local path, or a hub id ('org/name')."""
    if name.startswith(("http://", "https://")) or os.path.exists(os.path.expanduser(name)):
        return
    role, other = ("encoder", "lm") if key == "encoder" else ("lm", "encoder")
    if name in registry.names(other):
        raise InputError(f"--config.{key}={name!r} is {ROLES[other]}, not {ROLES[role]}; {registry.known_names(role)}")
    if name in split_gguf.READERS:
        try:
            split_gguf.check_available(split_gguf.READERS[name])
        except split_gguf.SplitModelError as e:
            raise InputError(f"--config.{key}={name!r}: {e}") from None
        return
    if name in registry.PACKAGED or name in registry.HUB_ALIASES or "/" in name.strip("/"):
        return
    raise InputError(f"--config.{key}={name!r}: unknown {ROLES[role].split()[1]}; {registry.known_names(role)}")


def _check_olmes(config) -> None:
    """An OLMES source (olmes:<task>:<form>) whose request file is installed."""
    from replug_jax.data import olmes

    try:
        olmes.task_dir(*olmes.parse_source(config.questions))
    except (ValueError, FileNotFoundError) as e:
        raise InputError(f"--config.questions={config.questions!r}: {e}") from None


def check_job_inputs(config) -> None:
    """Everything about `config` that can be checked without loading a model (see the module docstring)."""
    settings.check_settings(config)  # each key's type and range (base/settings.py); below: what ties keys together
    for key in ("cache_dir", "lm_cache"):
        if "://" in str(config.get(key) or ""):
            raise InputError(f"--config.{key}={config[key]!r}: must be a local path (SQLite, memory-mapped files); "
                             "a bucket workdir is staged locally by itself")
    check_model("lm", config.lm)
    _check_lm_tokenizer(config)
    _check_http_client_keys(config)
    _check_served_methods(config)
    _check_lm_model_parallel(config)
    check_model("encoder", config.encoder)
    _check_fractions(config)
    if config.job == "lsr":
        from replug_jax.train.queries import QA_SOURCES, first_training_row

        _check_path_or_name("train_data", config.train_data, DOCUMENT_NAMES + QA_SOURCES)
        _check_lsr_target(config)
        _check_lsr_settings(config)
        if _trains_on_questions(config):
            _check_path_or_name("corpus", config.corpus, CORPUS_NAMES)
            try:
                first_training_row(config.train_data, config.get("train_offset"))
            except ValueError as e:
                raise InputError(f"--config.train_offset: {e}") from None
    if config.job == "lm_eval" or config.job == "lsr" and not _trains_on_questions(config):
        _check_path_or_name("corpus", config.corpus, DOCUMENT_NAMES)
        _check_path_or_name("eval_data", config.eval_data, DOCUMENT_NAMES)
        _check_small_documents("eval_data", config.eval_data)
    if config.job in ("qa", "mmlu"):
        if given_retrieval_files(config):
            _check_retrieval_files(config)
        else:
            _check_path_or_name("corpus", config.corpus, CORPUS_NAMES)
        names = QA_NAMES if config.job == "qa" else MC_NAMES
        if config.job == "mmlu" and config.questions.startswith("olmes:"):
            _check_olmes(config)
        elif config.questions or not (config.job == "qa" and given_retrieval_files(config)):  # "": the file's own
            _check_path_or_name("questions", config.questions, names)
        if config.get("demos"):
            _check_path_or_name("demos", config.demos, names)
        if "replug_lsr" in job_methods(config):
            from replug_jax.jobs import bucket_workdirs

            given = config.get("retriever_workdir") or ""
            try:  # a bucket folder (gs://): its trained retriever staged locally, as the job reads it
                folder = bucket_workdirs.local_folder(given, ("retriever.safetensors", "train_questions.json"))
            except ValueError as e:
                raise InputError(f"--config.retriever_workdir={e}") from None
            path = os.path.join(folder, "retriever.safetensors")
            if not os.path.isfile(path):
                where = f"{given.rstrip('/')}/retriever.safetensors" if bucket_workdirs.is_remote(given) else path
                raise InputError(f"--config.methods has replug_lsr but {where} does not exist: set "
                                 "--config.retriever_workdir to an LSR job's workdir")
    if not given_retrieval_files(config):  # a given retrieval reads no corpus (its own checks: `given_retrieval`)
        _check_empty_documents(config)
        check_corpus_size(config)  # k beyond the corpus first: a depth below k is the lesser fault when neither fits
    evaluated = config.job in ("qa", "mmlu", "lm_eval") or config.job == "lsr" and not _trains_on_questions(config)
    if evaluated and "replug_posterior" in job_methods(config):
        check_posterior_settings(config)


def given_retrieval_files(config) -> list[str]:
    """The retrieval files a QA or multiple-choice job reads its passages from (--config.retrieval_file, comma-separated;
    [] for a corpus and an index)."""
    if config.job not in ("qa", "mmlu"):
        return []
    return [p for p in str(config.get("retrieval_file") or "").split(",") if p]


def _check_retrieval_files(config) -> None:
    """Each retrieval file exists, and no method needs a retriever of our own."""
    for path in given_retrieval_files(config):
        if "://" in path:
            raise InputError(f"--config.retrieval_file: {path!r}: copy it to a local path")
        if not os.path.isfile(os.path.expanduser(path)):
            raise InputError(f"--config.retrieval_file: {path!r}: no such file")
    if "replug_lsr" in job_methods(config):
        raise InputError("--config.methods has replug_lsr, which retrieves with an LSR-trained encoder, but "
                         "--config.retrieval_file gives the passages: drop replug_lsr, or unset retrieval_file")
    if config.job == "mmlu" and not config.questions:
        raise InputError("--config.questions is empty: multiple-choice questions (their options) come from "
                         "--config.questions; the retrieval file gives their passages")


def given_retrieval_notes(config) -> list[str]:
    """Warnings for the corpus settings a given retrieval leaves unread."""
    if not given_retrieval_files(config) or not config.get("corpus"):
        return []
    return [f"--config.corpus={config.corpus!r} is not read: the passages come from --config.retrieval_file"]


def _check_lm_tokenizer(config) -> None:
    """lm_tokenizer: "" (the LM's own; a server's /tokenize), or for a server URL a model name whose tokenizer
    is loaded locally; a local LM cuts with its own tokenizer, so another name there would be ignored."""
    name = config.get("lm_tokenizer") or ""
    if not name:
        return
    if not config.lm.startswith(("http://", "https://")):
        if name != config.lm:
            raise InputError(f"--config.lm_tokenizer={name!r} is for an LM behind a server URL; --config.lm="
                             f"{config.lm!r} cuts text with its own tokenizer: leave lm_tokenizer empty")
        return
    if name.startswith(("http://", "https://")):
        raise InputError(f"--config.lm_tokenizer={name!r}: a model name or path whose tokenizer is loaded locally "
                         "(\"\": the server's own /tokenize), not a URL")
    check_model("lm_tokenizer", name)


HTTP_CLIENT_DEFAULTS = dict(zip(settings.HTTP_CLIENT, (600.0, 5, 8)))  # the configs' values


def _check_served_methods(config) -> None:
    """FlashRAG's logit average needs every pass's whole next-token distribution: a served LM gives its top few."""
    from replug_jax.method import logit_average

    if (config.job == "qa" and config.lm.startswith(("http://", "https://"))
            and logit_average.NAME in job_methods(config)):
        raise InputError(f"--config.methods has {logit_average.NAME} (FlashRAG's average of the passes' logits), "
                         f"which needs each pass's whole next-token distribution; --config.lm={config.lm!r} is a "
                         f"server, which returns its top log-probs only: run it with a local LM, or drop "
                         f"{logit_average.NAME}")


def _check_http_client_keys(config) -> None:
    """lm_timeout, lm_retries and lm_concurrency set the HTTP client: another value with a local LM would be
    ignored, so it is refused."""
    if config.lm.startswith(("http://", "https://")):
        return
    for key, default in HTTP_CLIENT_DEFAULTS.items():
        if config.get(key, default) != default:
            raise InputError(f"--config.{key}={config[key]!r} sets the client of an LM behind a server URL; "
                             f"--config.lm={config.lm!r} runs here: leave {key} at {default}")


# (default, what it does): the defaults of LocalLM (GENERATION_QUESTIONS), not imported here (it loads JAX)
LOCAL_LM_KEYS = {"lm_model_parallel": (1, "splits a local LM over devices"),
                 "lm_generation_questions": (8, "sets how many questions a local LM decodes at once")}


def _check_lm_model_parallel(config) -> None:
    """lm_model_parallel and lm_generation_questions set a local LM: with a server URL as the LM they would be
    ignored, so they are refused."""
    for key, (default, what) in LOCAL_LM_KEYS.items():
        value = config.get(key, default)
        if value != default and config.lm.startswith(("http://", "https://")):
            raise InputError(f"--config.{key}={value!r} {what}; --config.lm={config.lm!r} is a server, which runs "
                             f"on the devices it was started with: leave {key} at {default}")


def _check_lsr_target(config) -> None:
    """lsr_target "answer" refuses a question file whose first row has no answers, and text
    windows without a continuation (train_continuation_tokens 0, which the question target takes)."""
    target = config.get("lsr_target", "answer")
    windows = not _trains_on_questions(config)
    if windows and config.get("train_continuation_tokens", 1) < (1 if target == "answer" else 0):
        raise InputError(f"--config.train_continuation_tokens={config.train_continuation_tokens}: the answer target "
                         "scores the window's continuation, so it needs at least 1 token (the question target takes 0: "
                         "the query window alone)")
    if target == "answer" and config.train_data.endswith(".jsonl") and not windows:
        import json

        with open(config.train_data, encoding="utf-8") as f:
            first = json.loads(next(line for line in f if line.strip()))
        if first.get("answers", first.get("answer")) is None:
            raise InputError(f"--config.train_data={config.train_data!r} has questions without \"answers\" and "
                             "--config.lsr_target='answer' scores the gold answer: give answers, or set "
                             "--config.lsr_target=question")


def _check_lsr_settings(config) -> None:
    """The LSR loop's own checks before any model loads: what ties its settings together (swap_after below
    refresh_every); each value's range was checked by the schema already."""
    from replug_jax.train.loop import LSRSettings

    try:
        LSRSettings.from_mapping(config)
    except (TypeError, ValueError) as e:
        raise InputError(f"--config: {e}") from None


def _trains_on_questions(config) -> bool:
    from replug_jax.train.queries import trains_on_questions

    return trains_on_questions(config.train_data)


def known_methods(job: str) -> tuple[str, ...]:
    """What `--config.methods` may name for `job`: the METHODS tuple of its evaluation (where a method is added)."""
    from replug_jax.evaluate import mmlu, perplexity, qa

    return {"lm_eval": perplexity.METHODS, "lsr": perplexity.METHODS + ("replug_lsr",), "qa": qa.METHODS, "mmlu": mmlu.METHODS}[job]


def job_methods(config) -> tuple[str, ...]:
    """`config.methods` as known names of `config.job`, in order, each once: a comma-separated string ("none,replug",
    as `--config.methods=none,replug` arrives) or a tuple / list (whose items may hold commas), spaces ignored."""
    items, names = _method_names(config)
    known = known_methods(config.job)
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        problem = f"unknown method {', '.join(map(repr, unknown))}" if unknown else "names no method"
        raise InputError(f"--config.methods={','.join(map(str, items))!r}: {problem}; the {config.job} job knows "
                         f"{', '.join(known)} (comma-separated)")
    return tuple(dict.fromkeys(names))


def _method_names(config) -> tuple[list, list[str]]:
    """(the items `config.methods` holds, the method names they spell), not yet checked against the job's."""
    methods = config.get("methods", ())
    items = [methods] if isinstance(methods, str) else list(methods)
    return items, [name.strip() for item in items for name in str(item).split(",") if name.strip()]


def read_methods(config) -> tuple[str, ...]:
    """`job_methods(config)`, also written back to `config.methods`, so every later read sees the parsed tuple
    (each job calls this first)."""
    methods = job_methods(config)
    with config.ignore_type():  # a config may hold the string form
        config.methods = methods
    return methods


def _depths(config) -> list[tuple[str, int]]:
    """(key, passages retrieved per input) of k, eval_k (0: k), each k_sweep value the config has, and
    rerank_depth where replug_posterior runs."""
    found = [("k", config.k)] + [("k_sweep", k) for k in config.get("k_sweep", ())]
    if config.get("rerank_depth") and "replug_posterior" in _method_names(config)[1]:
        found.append(("rerank_depth", config.rerank_depth))
    return found + ([("eval_k", config.eval_k)] if config.get("eval_k") else [])


def _check_fractions(config) -> None:
    """gensim_wiki's split: the evaluation and training shares leave a datastore."""
    shares = config.get("eval_fraction", 0.0) + config.get("train_fraction", 0.0)
    if shares >= 1:
        raise InputError(f"--config.eval_fraction={config.get('eval_fraction', 0.0)!r} and --config.train_fraction="
                         f"{config.get('train_fraction', 0.0)!r} add up to {shares:g}: together below 1, the rest is "
                         "the datastore")


def check_depth_fits(config, passages: int, at_most: bool = False) -> None:
    """Refuse a k (eval_k, k_sweep value) beyond the datastore's `passages` (`at_most`: a bound known before the
    corpus is cut into passages). A re-ranking depth beyond it re-ranks the whole datastore (results.json records
    the depth used)."""
    key, k = max([(key, k) for key, k in _depths(config) if key != "rerank_depth"], key=lambda kv: kv[1])
    if passages == 0:
        raise InputError(f"--config.corpus={config.corpus!r} is empty: no document with any text (JSONL lines "
                         "{\"text\": ..., \"title\"?: ...} or UTF-8 .txt files)")
    if k > passages:
        given = f"--config.k_sweep holds {k}," if key == "k_sweep" else f"--config.{key}={k} is"
        size = f"{passages:,} passage{'s' if passages != 1 else ''}{' at most' if at_most else ''}"
        raise InputError(f"{given} larger than the datastore ({size} from --config.corpus={config.corpus!r}): "
                         f"lower --config.{key} or add documents")


def _small_documents(key: str, path: str) -> list | None:
    """The documents of a small JSONL / .txt file, read in the first second (None for any other source): every line
    parses, the text is UTF-8 and no two documents share an id (their passages' ids would collide)."""
    if not (path.endswith((".jsonl", ".txt")) and os.path.isfile(path) and os.path.getsize(path) <= COUNTED_CORPUS_BYTES):
        return None
    from replug_jax.retrieval import datastore as ds

    documents = list(ds.read_document_file(path))
    seen: set[str] = set()
    shared = next((d.id for d in documents if d.id in seen or seen.add(d.id)), None)
    if shared is not None:
        raise InputError(f"--config.{key}={path!r}: two documents share the id {shared!r} (give each its own, or "
                         "leave ids out: a line's number is its id)")
    return documents


def _check_small_documents(key: str, path: str) -> None:
    """A small JSONL / .txt file of documents (`_small_documents`) has some document with text."""
    documents = _small_documents(key, path)
    if documents is not None and not any(d.text.strip() for d in documents):
        raise InputError(f"--config.{key}={path!r} is empty: no document with any text")


def empty_documents(config) -> dict[str, list[str]]:
    """Per document key (corpus, eval_data) of a small file, the ids of its documents without text (only
    whitespace, or none), which no passage or window would hold."""
    found = {}
    for key in ("corpus", "eval_data"):
        path = config.get(key) or ""
        documents = _small_documents(key, path) if key in TAKES else None
        empty = [d.id for d in documents or () if not d.text.strip()]
        if empty and any(d.text.strip() for d in documents):  # an all-empty file: `_check_small_documents`
            found[key] = empty
    return found


def _named(ids: list[str]) -> str:
    from replug_jax.retrieval.datastore import without_text

    return without_text(ids)


def _check_empty_documents(config) -> None:
    """Documents without text are refused, naming them, unless --config.drop_empty_documents leaves them out."""
    if config.get("drop_empty_documents", False):
        return
    for key, ids in empty_documents(config).items():
        them = "it" if len(ids) == 1 else "them"
        raise InputError(f"--config.{key}={config[key]!r} has {_named(ids)}: give {them} text, or set "
                         f"--config.drop_empty_documents=True to leave {them} out (named in a warning)")


def dropped_documents(config) -> list[str]:
    """Warnings naming the documents without text that --config.drop_empty_documents leaves out."""
    if not config.get("drop_empty_documents", False):
        return []
    return [f"--config.{key}: left out {_named(ids)} (--config.drop_empty_documents)"
            for key, ids in empty_documents(config).items()]


def check_corpus_size(config) -> None:
    """Refuse a k beyond a corpus's passages where that is known before any model loads: by the bytes' bound, and
    where that leaves it open, by cutting a small corpus with the LM's tokenizer alone."""
    bound = passages_at_most(config)
    if bound is not None:
        check_depth_fits(config, bound, at_most=True)
        exact = passages_exactly(config)
        if exact is not None:
            check_depth_fits(config, exact)


def passages_at_most(config) -> int | None:
    """An upper bound of the datastore's passages known in the first second, or None: DPR's passages (.tsv) cut at
    max_passages, or a small JSONL / .txt corpus: a document of b UTF-8 bytes has at most b + 2 tokens (each token
    covers a byte or more, plus a prefix piece), so at most ceil((b + 2) / doc_tokens) passages."""
    corpus = config.corpus
    if corpus.endswith(".tsv"):
        return config.get("max_passages") or None
    documents = _small_documents("corpus", corpus)
    if documents is None or config.get("doc_tokens", 0) < 1:
        return None
    sizes = [len(d.text.encode("utf-8")) for d in documents]
    return sum(math.ceil((b + 2) / config.doc_tokens) for b in sizes if b)


def passages_exactly(config) -> int | None:
    """The datastore's passage count, cut by the LM's tokenizer before any model loads, where a small JSONL / .txt
    corpus has fewer documents with text than the k asked (each gives a passage or more, so more documents settle
    it without cutting) and the tokenizer is named and local (not a server's /tokenize); else None."""
    documents = _small_documents("corpus", config.corpus)
    if documents is None or config.get("doc_tokens", 0) < 1:
        return None
    needed = max(k for key, k in _depths(config) if key != "rerank_depth")
    if sum(bool(d.text.strip()) for d in documents) >= needed:
        return None
    name = config.get("lm_tokenizer") or config.lm
    if not name or name.startswith(("http://", "https://")):  # no name: an LM passed as an object
        return None
    from replug_jax.loading import load_tokenizer
    from replug_jax.retrieval.datastore import chunk_rows

    return sum(1 for _ in chunk_rows(documents, load_tokenizer(name), config.doc_tokens,
                                     drop_empty=config.get("drop_empty_documents", False)))


# replug_posterior's settings (the method itself: method/posterior.py)


def check_posterior_settings(config) -> None:
    """replug_posterior (its settings' ranges: base/settings.py): rerank_depth 0 or at least k, and (mmlu) the options
    scored by their text, since the letter prompt lists the options between the question and the answer."""
    depth, k = config.get("rerank_depth", 0), config.get("eval_k") or config.k  # the k the job evaluates with
    key = "eval_k" if config.get("eval_k") else "k"
    if 0 < depth < k:  # most often k raised past the default depth
        raise InputError(f"--config.{key}={k} is above --config.rerank_depth={depth} (replug_posterior scores the top "
                         f"rerank_depth passages and keeps the {key} best): raise rerank_depth to at least {k}, or set "
                         f"it to 0 (the top {key} alone)")
    olmes = str(config.get("questions")).startswith("olmes:")
    olmes_mc = olmes and "mc" in config.questions.split(":")[-1].split("_")  # (val_)mc_*: the block lists the options
    if config.job == "mmlu" and (olmes_mc or not olmes and config.get("scoring") != "options"):
        fix = (f"{config.questions} lists the options in the question block, use an rc form" if olmes_mc else
               "set --config.scoring=options (the letter prompt puts the options after the question)")
        raise InputError(f"--config.methods has replug_posterior, which weighs each passage by log p(question | "
                         f"passage): {fix}")


def retrieval_depth(config, method: str) -> int:
    """Passages a downstream job retrieves per question for `method`: k, or for "replug_posterior" its re-ranking
    depth (at least k)."""
    return max(config.k, config.get("rerank_depth", 0) or 0) if method == "replug_posterior" else config.k


# settings a run was given but none of its methods reads: said as warnings, never dropped in silence (a config
# file may set them for its default methods); the jobs print them first and keep them in results.json's warnings

POSTERIOR_KEYS = {"posterior_alpha": (1.0, settings.QA_DEFAULTS["posterior_alpha"]),
                  "rerank_depth": (0, settings.QA_DEFAULTS["rerank_depth"]), "posterior_evidence": ("question",)}
# key: the values the configs ship (lm_eval.py's, and the QA configs' QA_DEFAULTS): nobody gave those; replug_posterior
# alone reads them


def unused_settings(config) -> list[str]:
    """Warnings (not errors: a config file may set them for its default methods) for settings no chosen method
    reads: posterior_alpha / rerank_depth away from the values the configs ship while --config.methods has no
    replug_posterior, a run that would look re-ranked but is plain REPLUG (qa.py's own 0.5 and 16 are not a user's
    setting, issue 85)."""
    methods = job_methods(config)
    given = [f"--config.{key}={config.get(key)!r}" for key, shipped in POSTERIOR_KEYS.items()
             if "replug_posterior" not in methods and config.get(key, shipped[0]) not in shipped]
    if not given:
        return []
    return [f"{' and '.join(given)} unused: only replug_posterior reads {'them' if len(given) > 1 else 'it'}, and "
            f"--config.methods={','.join(methods)} does not run it"]


SHORT_PASSAGE_TOKENS = 16  # passages shorter than this hold a few words each


def short_passages(config) -> list[str]:
    """A warning where --config.doc_tokens cuts passages of a few words."""
    tokens = config.get("doc_tokens", SHORT_PASSAGE_TOKENS)
    if tokens >= SHORT_PASSAGE_TOKENS:
        return []
    return [f"--config.doc_tokens={tokens}: passages of {tokens} tokens hold a few words each (\"Paris is the\"), "
            f"too little for the retriever to match or the LM to read; below {SHORT_PASSAGE_TOKENS} is rarely meant "
            "(the paper: 128)"]


PRECISION_KEYS = ("dtype", "param_dtype")  # the encoder's and a local LM's; a server computes in its own


def precision_a_server_ignores(config) -> list[str]:
    """A warning where --config.dtype / param_dtype is set and the LM is a server URL: they set the encoder alone
    (the server computes in the precision it was started with), where a reader would take the LM's numbers to be
    in that dtype too."""
    given = [f"--config.{key}={config.get(key)!r}" for key in PRECISION_KEYS
             if config.get(key) not in (None, "", "auto")]
    if not given or not config.lm.startswith(("http://", "https://")):
        return []
    return [f"{' and '.join(given)} set{'s' if len(given) == 1 else ''} the encoder's precision only: the LM at "
            f"{config.lm} computes in its server's own (`python -m replug_jax.serve --dtype`); results.json's "
            "compute_dtypes has the LM's as null"]


def input_warnings(config) -> list[str]:
    """What a job says of its inputs before its models load (and keeps in results.json): settings no method reads,
    precision a server ignores, documents left out, passages of a few words."""
    if given_retrieval_files(config):  # no corpus is cut: its settings are said unread
        return unused_settings(config) + precision_a_server_ignores(config) + given_retrieval_notes(config)
    return (unused_settings(config) + precision_a_server_ignores(config) + dropped_documents(config)
            + short_passages(config))

