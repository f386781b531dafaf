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

from replug_jax import replug


def answer_nll(lm, contexts: Sequence[Sequence[str]], log_weights: Sequence[np.ndarray],
               answers: Sequence[Sequence[str]], *, prefix: str = "") -> np.ndarray:
    """[Q] float: -max over answers of log p(" answer" | mixture of `prefix` ∘ contexts[q][i], log λ[q][i]).

    contexts[q]: the question's passes; log_weights[q]: [len(contexts[q])] log λ (normalised)."""
    flat_ctx, flat_cont, where = [], [], []
    for q, (ctx, golds) in enumerate(zip(contexts, answers)):
        for a, gold in enumerate(golds):
            for c in ctx:
                flat_ctx.append(prefix + c)
                flat_cont.append(f" {gold.strip()}")
            where.append((q, a))
    scored = lm.score(flat_ctx, flat_cont) if flat_ctx else []
    best = np.full(len(contexts), np.inf)
    at = 0
    for q, _ in where:
        k = len(contexts[q])
        per_pass = np.stack([np.asarray(s, np.float32) for s in scored[at : at + k]])[None]  # [1, K, T]
        log_w = np.asarray(log_weights[q], np.float32)[None]  # [1, K]
        mixed = replug.ensemble_logprobs(per_pass, log_w, np.isfinite(log_w), 1.0)  # [1, T]
        best[q] = min(best[q], -float(np.sum(mixed)))
        at += k
    return best
