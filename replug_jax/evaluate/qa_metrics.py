"""Open-domain QA metrics (REPLUG §6.3): SQuAD-normalised exact match and answer recall.

    normalize_answer("The  U.S.!")            # "us"
    exact_match("beatles", ["The Beatles"])   # True: max over the gold answers
    answer_recall(["art"], ["a party"])       # False: gold answers match at word boundaries only
    answer_recall(["2830メートル"], ["標高は約2830メートルです"])  # True: each character of a script written without
                                                            # spaces (CJK, Thai, ...) is a word of its own

The normalisation is SQuAD's (`replug_jax/data/answers.py`, shared with the data readers). A gold answer that normalises to "" (e.g. "A" or "The") never matches anything: DPR's and the
official REPLUG code's EM would score an empty prediction as correct against it.
"""
from __future__ import annotations

from typing import Iterable

import regex

from replug_jax.data.answers import normalize_answer  # re-exported: the metrics' normalisation

__all__ = ["normalize_answer", "exact_match", "answer_recall"]

# Scripts written without spaces between words: each of their characters counts as a word for answer recall (MLQA's
# "mixed segmentation" of Chinese), else an answer inside a Japanese sentence would never be at a word boundary.
UNSPACED = regex.compile(r"([\p{scx=Han}\p{scx=Hiragana}\p{scx=Katakana}\p{scx=Thai}\p{scx=Lao}\p{scx=Khmer}"
                         r"\p{scx=Myanmar}])")


def _words(normalised: str) -> str:
    """A normalised text as words joined by single spaces, each character of an unspaced script a word of its own."""
    return " ".join(UNSPACED.sub(r" \1 ", normalised).split())


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
    """True when some non-empty normalised gold answer occurs, at word boundaries, in some normalised passage (in
    scripts written without spaces, at character boundaries)."""
    golds = [f" {_words(g)} " for g in _golds(answers)]
    if not golds:
        return False
    if isinstance(passages, str):
        passages = [passages]
    for passage in passages:
        padded = f" {_words(normalize_answer(passage))} "
        if any(g in padded for g in golds):
            return True
    return False
