"""Answer likelihood, the QA metric that moves where exact match moves in steps of 1/N.

For each question and method: the negative log-likelihood of the gold answer (" <answer>", the continuation
the QA prompt's "Answer:" expects) under that method's mixture, in nats per answer; for several gold
answers, the best. The mixture is REPLUG's per token (§3.2):

    log p(y | x) = Σ_t logsumexp_i( log λ_i + log p(y_t | c_i, y_<t) )

over the method's passes c_i with weights λ (one pass of weight 1 for closed book and concat). Every pass
is scored by the LM's own `score` (the contract's tokenisation, nothing tokenised twice).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from replug_jax.base.progress import progress_keyword
from replug_jax.method.mixture import mixed_loglik


def continuation_logliks(lm, contexts: Sequence[Sequence[str]], log_weights: Sequence[np.ndarray],
                         continuations: Sequence[Sequence[str]], *, prefix: str = "",
                         progress: bool = False) -> list[list[tuple[float, int]]]:
    """Per question, per continuation: (log p(continuation | mixture), its token count), the mixture per token
    over `prefix` ∘ contexts[q][i] with weights log_weights[q] ([len(contexts[q])] log λ, normalised).
    `progress`: the LM's progress bar (the project's LMs; a user's black box is called without it)."""
    empty = [q for q, ctx in enumerate(contexts) if not ctx]
    if empty:
        raise ValueError(f"questions {empty[:5]} have no passes to score (no passage retrieved?)")
    flat_ctx, flat_cont = [], []
    for ctx, conts in zip(contexts, continuations):
        for cont in conts:
            for c in ctx:
                flat_ctx.append(prefix + c)
                flat_cont.append(cont)
    scored = lm.score(flat_ctx, flat_cont, **progress_keyword(lm.score, progress)) if flat_ctx else []
    out, at = [], 0
    for q, conts in enumerate(continuations):
        k, log_w = len(contexts[q]), np.asarray(log_weights[q], np.float64)  # [K]
        row = []
        for _ in conts:
            row.append((mixed_loglik(log_w, scored[at : at + k]), len(scored[at])))
            at += k
        out.append(row)
    return out


def query_and_continuation_scores(lm, doc_contexts: Sequence[Sequence[str]], queries: Sequence[str],
                                  continuations: Sequence[Sequence[str]], progress: bool = False):
    """Every pass `doc_contexts[q][i] ∘ queries[q] ∘ continuation` of one `lm.score_with_query` call:
    (query_logliks: per question [D_q] float64 Σ_t log p(x_t | d_i, x_<t); continuation scores: per question, per
    continuation, the D_q passes' token log-probs [T]). A question without continuations is scored query-only."""
    flat_ctx, flat_query, flat_cont = [], [], []
    for docs, query, conts in zip(doc_contexts, queries, continuations):
        for cont in conts or [""]:
            flat_ctx += list(docs)
            flat_query += [query] * len(docs)
            flat_cont += [cont] * len(docs)
    scored = (lm.score_with_query(flat_ctx, flat_query, flat_cont, **progress_keyword(lm.score_with_query, progress))
              if flat_ctx else [])
    query_logliks, cont_scores, at = [], [], 0
    for docs, conts in zip(doc_contexts, continuations):
        first = scored[at : at + len(docs)]
        query_logliks.append(np.array([np.sum(q, dtype=np.float64) for q, _ in first]))
        per_cont = []
        for _ in conts or [""]:
            per_cont.append([c for _, c in scored[at : at + len(docs)]])
            at += len(docs)
        cont_scores.append(per_cont if conts else [])
    return query_logliks, cont_scores


def answer_nll(lm, contexts: Sequence[Sequence[str]], log_weights: Sequence[np.ndarray],
               answers: Sequence[Sequence[str]], *, prefix: str = "", progress: bool = False) -> np.ndarray:
    """[Q] float: -max over answers of log p(" answer" | mixture of `prefix` ∘ contexts[q][i], log λ[q][i]).

    contexts[q]: the question's passes; log_weights[q]: [len(contexts[q])] log λ (normalised)."""
    golds = [[f" {gold.strip()}" for gold in answers_q] for answers_q in answers]
    logliks = continuation_logliks(lm, contexts, log_weights, golds, prefix=prefix, progress=progress)
    return np.array([-max(ll for ll, _ in row) if row else np.inf for row in logliks])
