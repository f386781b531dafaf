"""Sliding evaluation windows over held-out documents (the paper's §6.1 / §7 protocol).

A document of n LM tokens is scored in consecutive continuations of `stride_tokens`
tokens. For the window starting at token a, the LM context is the previous
`context_tokens` tokens and the retrieval query the previous `query_tokens` tokens; the
first window (a = 0) has neither, so every method scores it without retrieval. Windows
are cut at token boundaries of the LM's tokenizer but kept as text (exact substrings of
the document), because the black-box LM contract takes text.
"""
from __future__ import annotations

import dataclasses

from replug_jax.models.tokenizer import TextTokenizer, token_starts


@dataclasses.dataclass(frozen=True)
class Window:
    doc_id: str
    query: str  # retrieval query: the previous query_tokens tokens ("" for the first window)
    prefix: str  # LM context: the previous context_tokens tokens ("" for the first window)
    continuation: str  # the scored text: the next stride_tokens tokens

    @property
    def num_bytes(self) -> int:
        return len(self.continuation.encode("utf-8"))


def document_windows(doc_id: str, text: str, tokenizer: TextTokenizer, *, stride_tokens: int, query_tokens: int,
                     context_tokens: int, max_windows: int | None = None) -> list[Window]:
    """The evaluation windows of one document, in order."""
    if min(stride_tokens, query_tokens, context_tokens) < 1:
        raise ValueError("stride_tokens, query_tokens and context_tokens must be positive")
    starts = token_starts(tokenizer, text)
    n = len(starts) - 1
    windows = []
    for a in range(0, n, stride_tokens):
        b = min(a + stride_tokens, n)
        cut = lambda back: text[starts[max(0, a - back)] : starts[a]] if a else ""
        continuation = text[starts[a] : starts[b]]
        if continuation.strip():
            windows.append(Window(doc_id, cut(query_tokens), cut(context_tokens), continuation))
        if max_windows is not None and len(windows) >= max_windows:
            break
    return windows
