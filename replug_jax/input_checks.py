"""A job's inputs checked in its first second, before any model loads or any corpus is embedded.

`check_job_inputs(config)` raises `InputError` (a ValueError) naming the config key, what is wrong and what
would work: files that do not exist, unknown model names, unknown methods or data sets, a missing trained
retriever. What can only be known later (a hub id without a network, a malformed line deep in a file) is still
reported where it is found. main.py prints an InputError as one line and exits 2.
"""
from __future__ import annotations

import os

from replug_jax.models import registry, split_gguf

DOCUMENT_NAMES = ("gensim_wiki",)  # offline corpora known by name
CORPUS_NAMES = DOCUMENT_NAMES + ("sciq",)
QA_NAMES = ("nq_open", "trivia_qa", "sciq", "demo")
MC_NAMES = ("mmlu", "sciq")


class InputError(ValueError):
    """A user's input the job cannot run with (reported as one line)."""


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


def check_model(key: str, name: str) -> None:
    """A model name the registry knows, an installed reader, a local path, or a hub id ('org/name')."""
    if name.startswith(("http://", "https://")) or os.path.exists(os.path.expanduser(name)):
        return
    if name in split_gguf.READERS:
        try:
            split_gguf.check_available(split_gguf.READERS[name])
        except split_gguf.SplitModelError as e:
            raise InputError(f"--config.{key}={name!r}: {e}") from None
        return
    if name in registry.PACKAGED or name in registry.HUB_ALIASES or "/" in name.strip("/"):
        return
    known = sorted(registry.PACKAGED) + sorted(split_gguf.READERS) + sorted(registry.HUB_ALIASES)
    raise InputError(f"--config.{key}={name!r}: unknown model; use one of {', '.join(known)}, a local path, a "
                     "hub id 'org/name' or a server URL")


def _check_olmes(config) -> None:
    """An OLMES source (olmes:<task>:<form>) whose request file is installed, and a known option metric."""
    from replug_jax.data import olmes
    from replug_jax.evaluate import option_text

    try:
        olmes.task_dir(*olmes.parse_source(config.questions))
        if config.get("option_metric"):
            option_text.check_scoring("options", config.option_metric)
    except (ValueError, FileNotFoundError) as e:
        raise InputError(f"--config.questions={config.questions!r}: {e}") from None


def _check_scoring(config) -> None:
    """scoring "letters" or "options", and with "options" a known option_metric."""
    from replug_jax.evaluate import option_text

    try:
        option_text.check_scoring(config.get("scoring", "letters"), config.get("option_metric") or "acc_per_char")
    except ValueError as e:
        raise InputError(f"--config.scoring / --config.option_metric: {e}") from None


def check_job_inputs(config) -> None:
    """Everything about `config` that can be checked without loading a model (see the module docstring)."""
    from replug_jax.jobs import JOBS

    if config.job not in JOBS:
        raise InputError(f"--config.job={config.job!r}: unknown job; use one of {', '.join(JOBS)}")
    for key in ("cache_dir", "lm_cache"):
        if "://" in str(config.get(key) or ""):
            raise InputError(f"--config.{key}={config[key]!r}: must be a local path (SQLite, memory-mapped files); "
                             "a bucket workdir is staged locally by itself")
    check_model("lm", config.lm)
    check_model("encoder", config.encoder)
    if config.job == "lsr":
        from replug_jax.train.data import QA_SOURCES

        _check_path_or_name("train_data", config.train_data, DOCUMENT_NAMES + QA_SOURCES)
        if _trains_on_questions(config):
            _check_path_or_name("corpus", config.corpus, CORPUS_NAMES)
    if config.job == "lm_eval" or config.job == "lsr" and not _trains_on_questions(config):
        _check_path_or_name("corpus", config.corpus, DOCUMENT_NAMES)
        _check_path_or_name("eval_data", config.eval_data, DOCUMENT_NAMES)
    if config.job in ("qa", "mmlu"):
        _check_path_or_name("corpus", config.corpus, CORPUS_NAMES)
        names = QA_NAMES if config.job == "qa" else MC_NAMES
        if config.job == "mmlu" and config.questions.startswith("olmes:"):
            _check_olmes(config)
        else:
            _check_path_or_name("questions", config.questions, names)
        if config.job == "mmlu" and not config.questions.startswith("olmes:"):
            _check_scoring(config)
        if config.get("demos"):
            _check_path_or_name("demos", config.demos, names)
        if "replug_lsr" in config.methods:
            path = os.path.join(config.get("retriever_workdir") or "", "retriever.safetensors")
            if not os.path.isfile(path):
                raise InputError(f"--config.methods has replug_lsr but {path} does not exist: set "
                                 "--config.retriever_workdir to an LSR job's workdir")


def _trains_on_questions(config) -> bool:
    from replug_jax.train.data import trains_on_questions

    return trains_on_questions(config.train_data)
