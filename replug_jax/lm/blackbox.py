"""The black-box LM contract: the only thing REPLUG may ask of a language model.

    score(contexts, continuations) -> [np.ndarray of log p(token) per continuation token]

Every backend (the local JAX model, an HTTP server) implements `BlackBoxLM`. The
continuation's tokens are the backend tokenizer's tokens of the continuation text alone:
context and continuation are tokenised separately and concatenated, so a continuation is
split the same way whatever precedes it. Write continuations with their leading space
(" Paris", not "Paris"), as in the text they continue.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class BlackBoxLM(Protocol):
    name: str

    def score(self, contexts: Sequence[str], continuations: Sequence[str]) -> list[np.ndarray]:
        """log p(y_t | context, y_<t) for each token of each continuation: a list of float32 [T_i]."""
        ...

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` is for this LM (for chunking and budgets)."""
        ...


def check_pairs(contexts: Sequence[str], continuations: Sequence[str]) -> None:
    """Reject calls that cannot be scored, with a message that names the problem."""
    if isinstance(contexts, str) or isinstance(continuations, str):
        raise TypeError("score takes lists of contexts and continuations, not single strings")
    if len(contexts) != len(continuations):
        raise ValueError(f"{len(contexts)} contexts but {len(continuations)} continuations")
    empty = [i for i, c in enumerate(continuations) if not c]
    if empty:
        raise ValueError(f"continuations {empty[:5]} are empty: there is nothing to score")
