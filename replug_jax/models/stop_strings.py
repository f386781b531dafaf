"""Where greedy decoding stops: stop strings on the decoded text, and the tokens that can end a decode on the device.

Used alike by the local backend's decoding (lm/local_generate.py) and the scoring server's (server/engine.py), so a
stop string ends an answer at the same token on both. Numpy only: the HTTP client imports it without JAX.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """(text before the first stop string, whether one was found)."""
    hits = [text.index(s) for s in stop if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def tokens_through_stop(count: int, prefix_text, stop: Sequence[str]) -> int:
    """How many of `count` generated tokens to keep: through the token whose text completes the first stop
    string (a stop string may span several tokens), all when none does. prefix_text(n): the first n's text."""
    for n in range(1, count + 1):
        if cut_at_stop(prefix_text(n), stop)[1]:
            return n
    return count


def stop_token_mask(tokenizer, size: int, stop: Sequence[str]) -> np.ndarray:
    """[size] bool: the token ids whose own text contains a stop string, and EOS: where a decode on the device may
    end at once (a stop string spanning tokens is found afterwards on the text, by `tokens_through_stop`)."""
    mask = np.zeros(max(tokenizer.vocab_size, size), bool)
    if any(stop):
        for i in range(tokenizer.vocab_size):
            piece = tokenizer.decode([i])
            mask[i] = any(s in piece for s in stop if s)
    if tokenizer.eos_id is not None:
        mask[tokenizer.eos_id] = True
    return mask
