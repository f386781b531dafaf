"""Sliding evaluation windows over held-out documents (the paper's §6.1 / §7 protocol).

A document of n LM tokens is scored in consecutive continuations of `stride_tokens`
tokens. For the window starting at token a, the LM context is the previous
`context_tokens` tokens and the retrieval query the previous `query_tokens` tokens; the
first window (a = 0) has neither, so every method scores it without retrieval. A document
of at most `stride_tokens` tokens, which would have only that window, is scored from token
min(query_tokens, n // 2) on instead: its first part is the query and context. Windows are
cut at token boundaries of the LM's tokenizer but kept as text (exact substrings of the
document), because the black-box LM contract takes text.
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


def first_scored_token(num_tokens: int, *, stride_tokens: int, query_tokens: int) -> int:
    """Where scoring starts: 0, or for a document of one stride or less, after its query (half of it at most)."""
    return 0 if num_tokens > stride_tokens else min(query_tokens, num_tokens // 2)


def document_windows(doc_id: str, text: str, tokenizer: TextTokenizer, *, stride_tokens: int, query_tokens: int,
                     context_tokens: int, max_windows: int | None = None, whole: bool = False) -> list[Window]:
    """The evaluation windows of one document, in order. `whole`: every token scored, from the first even in a
    short document and in stretches of whitespace alone (lm-eval's rolling log-likelihood of a text)."""
    if min(stride_tokens, query_tokens, context_tokens) < 1:
        raise ValueError("stride_tokens, query_tokens and context_tokens must be positive")
    starts = token_starts(tokenizer, text)
    n = len(starts) - 1
    windows = []
    first = 0 if whole else first_scored_token(n, stride_tokens=stride_tokens, query_tokens=query_tokens)
    for a in range(first, n, stride_tokens):
        b = min(a + stride_tokens, n)
        cut = lambda back: text[starts[max(0, a - back)] : starts[a]] if a else ""
        continuation = text[starts[a] : starts[b]]
        if continuation.strip() or (whole and continuation):
            windows.append(Window(doc_id, cut(query_tokens), cut(context_tokens), continuation))
        if max_windows is not None and len(windows) >= max_windows:
            break
    return windows


NOISY_BYTES = 4000  # scored text below this (about a thousand tokens) gives a perplexity that one document moves


def small_evaluation(windows: list[Window]) -> str | None:
    """A warning when the scored text is so short that its perplexity is noise at the size of REPLUG's gains."""
    scored = sum(w.num_bytes for w in windows)
    if scored >= NOISY_BYTES:
        return None
    return (f"only {scored:,} bytes of held-out text are scored ({len(windows)} windows): a perplexity over a few "
            "hundred tokens moves by whole percents with one document, so differences between methods of that size "
            "are noise; give more eval_data (or raise max_eval_docs)")


def retrieval_shortfall(windows: list[Window]) -> str | None:
    """A warning when most scored bytes, or most documents, get no retrieval (every method then scores them
    alike, as `none`); None otherwise."""
    scored = sum(w.num_bytes for w in windows)
    retrieved = sum(w.num_bytes for w in windows if w.query)
    documents = {w.doc_id for w in windows}
    without = documents - {w.doc_id for w in windows if w.query}
    if 2 * retrieved >= scored and 2 * len(without) <= len(documents):
        return None
    return (f"retrieval reaches only {retrieved / max(scored, 1):.0%} of the scored text: "
            f"{sum(not w.query for w in windows)} of {len(windows)} windows, and {len(without)} of {len(documents)} "
            "documents entirely, are scored without retrieval (a document's first stride_tokens tokens have no "
            "query), so every method scores them as none does. Lower stride_tokens (with query_tokens and "
            "context_tokens) for short documents, or raise max_windows_per_doc (0: all windows).")
