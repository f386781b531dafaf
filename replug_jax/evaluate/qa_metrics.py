"""Open-domain QA metrics (REPLUG §6.3): SQuAD-normalised exact match and answer recall.

    normalize_answer("The  U.S.!")            # "us"
    exact_match("beatles", ["The Beatles"])   # True: max over the gold answers
    answer_recall(["art"], ["a party"])       # False: gold answers match at word boundaries only

The normalisation is SQuAD's (lowercase, drop punctuation, drop the articles a/an/the, collapse
whitespace), preceded by Unicode NFKC so that full-width forms and composed/decomposed accents
compare equal, and with punctuation taken as `string.punctuation` plus every Unicode P* character.
A gold answer that normalises to "" (e.g. "A" or "The") never matches anything: DPR's and the
official REPLUG code's EM would score an empty prediction as correct against it.
"""
from __future__ import annotations

import functools
import re
import string
import sys
import unicodedata
from typing import Iterable

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


@functools.lru_cache(maxsize=1)
def _punctuation_table() -> dict[int, None]:
    """str.translate table deleting string.punctuation and all Unicode punctuation (categories P*)."""
    table = {ord(c): None for c in string.punctuation}
    for cp in range(sys.maxunicode + 1):
        if unicodedata.category(chr(cp)).startswith("P"):
            table[cp] = None
    return table


def normalize_answer(text: str) -> str:
    """NFKC, lowercase, punctuation removed, articles a/an/the removed, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.translate(_punctuation_table())
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(answers: str | Iterable[str]) -> list[str]:
    """The non-empty normalised gold answers (a single string counts as one answer)."""
    if isinstance(answers, str):
        answers = [answers]
    return [g for g in (normalize_answer(a) for a in answers) if g]


def exact_match(prediction: str, answers: str | Iterable[str]) -> bool:
    """True when the normalised prediction equals some gold answer that does not normalise to ""."""
    pred = normalize_answer(prediction)
    return bool(pred) and pred in _golds(answers)


def answer_recall(answers: str | Iterable[str], passages: str | Iterable[str]) -> bool:
    """True when some non-empty normalised gold answer occurs, at word boundaries, in some normalised passage."""
    golds = [f" {g} " for g in _golds(answers)]
    if not golds:
        return False
    if isinstance(passages, str):
        passages = [passages]
    for passage in passages:
        padded = f" {normalize_answer(passage)} "
        if any(g in padded for g in golds):
            return True
    return False
