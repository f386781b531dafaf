"""Whether a passage holds an answer, as DPR decides it (`has_answer`, facebookresearch/DPR `dpr/data/qa_validation.py`
with its `SimpleTokenizer`): the passage and each answer NFD-normalised, split into tokens (runs of letters, digits
and combining marks, or any single other non-space character), lowercased, and an answer's token sequence looked for
among the passage's. This is the `has_answer` of DPR's and FiD's retrieval files and their top-k accuracy; the QA job's
own answer recall (evaluate/qa_metrics.py) normalises as SQuAD does and can differ from it on punctuation, and in
scripts written without spaces, where DPR's tokens are whole clauses ("標高は約2830メートルです" is one) and an answer
inside one is not found: DPR's number, kept as DPR computes it.

    has_answer(["Paris"], "The capital is Paris.")   # True
    has_answer(["U.S."], "the U.S. army")            # True: tokens u . s .

As in DPR, an answer with no tokens at all (only spaces) matches every passage."""
from __future__ import annotations

import unicodedata
from typing import Iterable

import regex

TOKEN = regex.compile(r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])", flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)


def tokens(text: str) -> list[str]:
    """DPR SimpleTokenizer's words of the NFD-normalised text, uncased."""
    return [m.group().lower() for m in TOKEN.finditer(unicodedata.normalize("NFD", text))]


def has_answer(answers: Iterable[str], passage: str) -> bool:
    """True when some answer's token sequence occurs in the passage's (DPR's match_type "string")."""
    words = tokens(passage)
    for answer in answers:
        wanted = tokens(answer)
        n = len(wanted)
        if any(words[i:i + n] == wanted for i in range(len(words) - n + 1)):
            return True
    return False


def top_k_accuracy(flags: list[list[bool]], depths: Iterable[int]) -> dict[int, float]:
    """DPR's top-k retrieval accuracy: {k: % of questions with an answer-holding passage among their first k}."""
    return {k: 100.0 * sum(any(row[:k]) for row in flags) / max(len(flags), 1) for k in depths}
