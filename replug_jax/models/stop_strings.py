"""Where greedy decoding stops: stop strings on the decoded text, and the tokens that can end a decode on the device.

A stop string is matched on the decoded text (whole characters: models/detokenize.py) by the local backend
(lm/local_generate.py), the scoring server (server/completions.py) and the HTTP client (lm/http/generation.py), so it
ends an answer at the same token on every path. On the device (`StopMasks`: the local backend's loop and the
server's decoding batch) a token holding a whole stop string, or EOS, ends a row at once. A stop string spanning
tokens is found on the text: the server's decoding batch (server/decoding_batch.py) looks at its rows' texts every
few steps and ends a row there; the local backend's loop decodes on to its budget and the text is cut where the stop
string completes. Numpy only: the HTTP client imports it without JAX.
"""
from __future__ import annotations

import collections
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


class StopMasks:
    """[size] bool per stop tuple: the token ids whose own text contains a stop string, and EOS: where a decode on
    the device may end at once (a stop string spanning tokens is found afterwards on the text, by
    `tokens_through_stop`). Each token's text is decoded once, on the first tuple that needs it; the masks of the
    latest `capacity` tuples are kept (a server sees whatever stop strings its clients send)."""

    def __init__(self, tokenizer, size: int, capacity: int = 64):
        self.tokenizer, self.size, self.capacity = tokenizer, size, capacity
        self._pieces: list[str] | None = None
        self._masks: collections.OrderedDict[tuple, np.ndarray] = collections.OrderedDict()

    def __call__(self, stop: Sequence[str]) -> np.ndarray:
        key = tuple(stop)
        if key in self._masks:
            self._masks.move_to_end(key)
            return self._masks[key]
        mask = np.zeros(self.size, bool)
        wanted = [s for s in key if s]
        if wanted:
            for i, piece in enumerate(self._token_texts()):
                mask[i] = any(s in piece for s in wanted)
        eos = self.tokenizer.eos_id
        if eos is not None and eos < self.size:
            mask[eos] = True
        self._masks[key] = mask
        if len(self._masks) > self.capacity:
            self._masks.popitem(last=False)
        return mask

    def _token_texts(self) -> list[str]:
        """Each id's own text, for the ids the model can emit (below `size`) that the tokenizer knows."""
        if self._pieces is None:
            self._pieces = [self.tokenizer.decode([i]) for i in range(min(self.tokenizer.vocab_size, self.size))]
        return self._pieces
