"""SQuAD answer normalisation (NFKC, lowercase, punctuation and articles dropped), shared by the data
readers (matching questions to titles and answers to passages) and the QA metrics (`evaluate/qa_metrics.py`).

    normalize_answer("The  U.S.!")            # "us"

Punctuation is `string.punctuation` plus every Unicode P* character; NFKC first, so that full-width
forms and composed/decomposed accents compare equal.
"""
from __future__ import annotations

import functools
import re
import string
import sys
import unicodedata

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
