"""One LSR training batch: LM supervision for the retrieved (query, document) pairs, and the fixed-shape
arrays of the jitted step (`train/step.py`)."""
from __future__ import annotations

import numpy as np

from replug_jax.method.passages import DOC_TEMPLATE, document_passes
from replug_jax.train.lm_cache import LMScoreCache

LM_SCORES = ("sum", "mean")
LSR_TARGETS = ("answer", "question")  # what the LM scores after each document: y (the paper) or x itself (ART)


class FrozenDocumentVectors:
    """Query-side-only training: the documents' vectors as the frozen index stores them (the very vectors that
    retrieval scored, so nothing is re-embedded). `self(rows [B, K]) -> [B, K, D]` float32 (0 for -1)."""

    def __init__(self, index):
        self.index = index

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        flat = np.asarray(rows).reshape(-1)
        out = np.zeros((flat.size, self.index.dim), np.float32)
        out[flat >= 0] = self.index.vectors(flat[flat >= 0])
        return out.reshape(*np.shape(rows), -1)


def make_batch(encoder, datastore, examples, rows: np.ndarray, lm_scores: np.ndarray, *, query_max_tokens: int,
               doc_max_tokens: int, doc_vectors: FrozenDocumentVectors | None = None) -> dict:
    """Fixed-shape arrays of the jitted step for B examples and their K retrieved rows.

    Token lengths 0 mean the encoder's own (what retrieval and the index use). With `doc_vectors`
    (query-side-only training) the documents come as vectors ("doc_embeddings" [B, K, D]), not tokens."""
    b, k = rows.shape
    query_ids, query_mask = encoder.padded([e.query for e in examples], query_max_tokens or encoder.max_length)
    batch = {"query_ids": query_ids, "query_mask": query_mask,  # [B, Lq]
             "doc_valid": rows >= 0, "lm_scores": np.where(rows >= 0, lm_scores, 0.0).astype(np.float32)}
    if doc_vectors is not None:
        return {**batch, "doc_embeddings": doc_vectors(rows)}
    texts = [datastore.texts[r] if r >= 0 else "" for r in rows.reshape(-1)]
    doc_ids, doc_mask = encoder.padded(texts, doc_max_tokens or encoder.max_length)  # [B*K, Ld]
    return {**batch, "doc_ids": doc_ids.reshape(b, k, -1), "doc_mask_tokens": doc_mask.reshape(b, k, -1)}


def supervise(cache: LMScoreCache, datastore, examples, rows: np.ndarray, *, lm_score: str = "sum",
              doc_template: str = DOC_TEMPLATE, target: str = "answer", progress: bool = False) -> np.ndarray:
    """ℓ for every example and retrieved row: [B, K] (0 where no document); the LM reads `doc_template`'s
    document, then x (`TrainExample.lm_prefix`), then y (`TrainExample.continuation`).

    target "answer" (the paper): ℓ = Σ_t log p(y_t | d ∘ x, y_<t). target "question" (ART, Sachan et al. 2023):
    ℓ = Σ_t log p(x_t | d, x_<t), x's own likelihood after the document, from one `score_with_query` pass with an
    empty continuation (y is never read: questions need no answers). lm_score "sum" as written; "mean": divided
    by the scored text's token count (y's or x's)."""
    return supervise_targets(cache, datastore, examples, rows, (target,), lm_score=lm_score,
                             doc_template=doc_template, progress=progress)[target]


def supervise_targets(cache: LMScoreCache, datastore, examples, rows: np.ndarray, targets, *, lm_score: str = "sum",
                      doc_template: str = DOC_TEMPLATE, progress: bool = False) -> dict[str, np.ndarray]:
    """{target: ℓ [B, K]} for each of `targets` (`supervise`'s meanings). Both targets come from ONE pass
    d ∘ x ∘ y per pair (`score_with_query`: x's log-probs and y's from the same forward pass), not two."""
    if lm_score not in LM_SCORES:
        raise ValueError(f"lm_score must be one of {LM_SCORES}, got {lm_score!r}")
    targets = tuple(dict.fromkeys(targets))
    if not targets or not set(targets) <= set(LSR_TARGETS):
        raise ValueError(f"lsr_target must be one of {LSR_TARGETS}, got {targets!r}")
    if targets == ("answer",):  # the paper's pass, d ∘ x scored for y (its own cache entries)
        contexts, continuations, where = document_passes(datastore, rows, [e.lm_prefix for e in examples],
                                                         [e.continuation for e in examples], doc_template)
        totals = {"answer": cache.score(contexts, continuations, progress=progress)}
    else:  # contexts: the documents alone; x is scored after each, then y where the answer target is asked too
        contexts, queries, where = document_passes(datastore, rows, [""] * len(examples),
                                                   [e.lm_prefix for e in examples], doc_template)
        answers = [examples[q].continuation if "answer" in targets else "" for q, _ in where]
        query_totals, answer_totals = cache.score_query_and_continuation(contexts, queries, answers,
                                                                         progress=progress)
        totals = {"question": query_totals, "answer": answer_totals}
    out = {}
    for target in targets:
        scores = np.zeros(rows.shape, np.float32)
        for (i, j), total, n in zip(where, *totals[target]):
            scores[i, j] = total / n if lm_score == "mean" else total
        out[target] = scores
    return out
