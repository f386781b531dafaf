"""The public entry points for notebooks and pipelines: names or paths in, ready objects out.

    enc = load_encoder("minilm")    # packaged default, a local HF dir, or a hub id (replug_jax/loading/)
    lm = load_lm("smollm2")         # packaged default, a local HF dir, a .gguf path, or a hub id
    docs = read_documents("corpus.jsonl"); demos = read_questions("demos.jsonl")   # as the jobs read them
"""
from __future__ import annotations

from replug_jax.loading import load_encoder, load_lm, load_tokenizer  # noqa: F401 (the public names)


def read_documents(source: str) -> list:
    """Documents (`Document`: id, title, text) as the jobs read a corpus: a JSONL file of {"text", "title"?, "id"?},
    a .txt file, a folder of .txt files, or "tfds:NAME:SPLIT[:TEXT_KEY[:TITLE_KEY]]". `REPLUG.from_documents` takes
    them as they come."""
    from replug_jax.jobs.prepare import read_documents as read

    return read(source)


def read_questions(source: str, split: str = "validation") -> list:
    """QA rows (`QAExample`: id, question, answers, and the row's other fields) as the QA job reads its questions and
    demos: a JSONL file of {"question", "answers" (or "answer")?, "id"?, ...}, "nq_open", "trivia_qa" or a "tfds:"
    source (`split` for those). `REPLUG.answer(demos=...)` takes them as they come."""
    from replug_jax.data.question_sets import load_qa

    return load_qa(source, split, answers_required=False)
