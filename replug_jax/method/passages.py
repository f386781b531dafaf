"""REPLUG's document passes (§3.1): each retrieved document is prepended to the input separately.

Shared by the evaluation (scoring with documents) and LSR training (LM supervision), so both
build exactly the same LM inputs:

    contexts, continuations, where = document_passes(datastore, rows, prefixes, continuations)
    # where[n] = (query number, rank): pass n is document rows[query, rank] ∘ prefix[query]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

DOC_TEMPLATE = "{title}\n{text}\n\n"  # text windows: the document, then the window's query tokens
QA_DOC_TEMPLATE = "Knowledge: {passage}\n"  # QA (the paper's Table 5): `question_block` with a passage


def passage_text(title: str, text: str) -> str:
    """A passage on one line, title first (as DPR embeds it and the paper's prompts show it)."""
    return " ".join(f"{title} {text}".split()) if title else " ".join(text.split())


def passages_of(store, rows) -> list[list[str]]:
    """Per query, the text of its retrieved rows [Q, k] of `store` (rows < 0: none), best first."""
    return [[passage_text(store.titles[r], store.texts[r]) for r in row if r >= 0] for row in rows]


def passage_ids(store, rows, kept=None) -> list[list[str]]:
    """Per query, the datastore ids of its retrieved rows [Q, D] (rows < 0: none), best first; with `kept` (per
    query, positions among the rows found, best first: the posterior's kept passages) those alone."""
    found = [np.asarray(row)[np.asarray(row) >= 0] for row in rows]
    return [[store.ids[r] for r in (f if kept is None else f[np.asarray(kept[i], int)])] for i, f in enumerate(found)]


def knowledge(passage: str | None) -> str:
    """A block's passage line, QA_DOC_TEMPLATE's "Knowledge: <passage>\n" ("" without a passage): the QA (Table 5)
    and MMLU (Table 4) blocks alike."""
    return QA_DOC_TEMPLATE.format(passage=passage) if passage is not None else ""


def question_block(question: str, passage: str | None, answer: str | None = None) -> str:
    """One Table 5 block; without `answer` it ends at "Answer:" (the test question). With a passage it is
    QA_DOC_TEMPLATE's document followed by the closed-book block."""
    end = f" {answer}\n\n" if answer is not None else ""
    return f"{knowledge(passage)}Question: {question}\nAnswer:{end}"


def knowledge_line(passages: Sequence[str]) -> str:
    """"concat"'s one Knowledge line: the passages (best first) joined best last, next to the question (QA, MMLU)
    or to the request (OLMES)."""
    return " ".join(reversed(passages))


def format_docs(datastore, rows: Sequence[int], template: str = DOC_TEMPLATE) -> list[str]:
    """The datastore rows as LM text, one string per row, in the given order. The template may name {title},
    {text} and {passage} (`passage_text` of the two)."""
    return [template.format(title=datastore.titles[r], text=datastore.texts[r],
                            passage=passage_text(datastore.titles[r], datastore.texts[r])) for r in rows]


def document_passes(datastore, rows: np.ndarray, prefixes: Sequence[str], continuations: Sequence[str],
                    template: str = DOC_TEMPLATE, before: Sequence[str] | None = None):
    """REPLUG's passes: one (document ∘ prefix, continuation) pair per retrieved row; `before` (per query, e.g. a
    few-shot block): the text each of its passes opens with, before the document.

    rows: [Q, K] (-1 = none). Returns (contexts, continuations, where) with where[n] = (query, rank).
    """
    contexts, conts, where = [], [], []
    for q, (row, prefix, continuation) in enumerate(zip(rows, prefixes, continuations)):
        ranks = np.flatnonzero(row >= 0)
        for rank, doc in zip(ranks, format_docs(datastore, row[ranks], template)):
            contexts.append((before[q] if before is not None else "") + doc + prefix)
            conts.append(continuation)
            where.append((q, int(rank)))
    return contexts, conts, where
