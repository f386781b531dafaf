"""REPLUG weights that know what the LM knows: the LM's posterior over the retrieved passages.

REPLUG's mixture p(y | x) = Σ_i λ_i p(y | d_i ∘ x) is a Bayesian model average over the top-k passages, and the
paper's λ = softmax(s / τ) is the retriever's prior alone. The posterior multiplies in the LM's likelihood of the
input after each passage (UPR, Sachan et al. 2022, re-ranks by the same quantity):

    log λ_i = log softmax_i( s_i / τ + α · log p(x | d_i) )        α = 0: the paper's REPLUG

x is the query the passage was retrieved for as it follows the passage in the pass (the QA question block, never
the scored continuation), so log p(x | d_i) comes from the very pass that scores the continuation
(`BlackBoxLM.score_with_query`): no extra LM pass for the same passages. Re-ranking (`rerank`): of the top
`depth` passages, the k with the highest posterior weight are kept and their weights renormalised.
"""
from __future__ import annotations

import numpy as np

from replug_jax import mixture


def check_alpha(alpha: float) -> None:
    """α must be a finite number >= 0 (0: the paper's weights)."""
    if not (isinstance(alpha, (int, float)) and np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"posterior_alpha must be a finite number >= 0 (0: REPLUG's weights), got {alpha!r}")


def posterior_log_weights(scores, doc_mask, query_logliks, temperature: float, alpha: float) -> np.ndarray:
    """log λ = log softmax(s / τ + α · log p(x | d)) over the valid passages of each row.

    scores, query_logliks: [B, K] (query_logliks: Σ_t log p(x_t | d_k, x_<t)); doc_mask: [B, K] bool.
    Returns float32 [B, K], -inf for masked passages (`mixture.ensemble_log_weights`'s conventions)."""
    check_alpha(alpha)
    mask = np.asarray(doc_mask, bool)
    evidence = np.where(mask, np.asarray(query_logliks, np.float64), 0.0)  # never read where masked
    # s/τ + α·ℓ = (s + τ·α·ℓ)/τ: the retrieval softmax's own stable centring serves both terms
    combined = np.asarray(scores, np.float64) + temperature * alpha * evidence  # [B, K]
    return np.asarray(mixture.ensemble_log_weights(combined.astype(np.float32), mask, temperature), np.float32)


def rerank(log_weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions [B, k'] of each row's k highest weights, best first; their log weights renormalised [B, k']),
    k' = min(k, row width); positions of missing passages (-inf weight) are -1 with weight -inf."""
    log_weights = np.asarray(log_weights, np.float64)  # [B, D]
    kept = min(k, log_weights.shape[1])
    order = np.argsort(-log_weights, axis=1, kind="stable")[:, :kept]  # [B, k']
    top = np.take_along_axis(log_weights, order, axis=1)  # [B, k']
    valid = np.isfinite(top)
    norm = np.logaddexp.reduce(np.where(valid, top, -np.inf), axis=1, keepdims=True)  # [B, 1]
    renormalised = np.where(valid, top - np.where(np.isfinite(norm), norm, 0.0), -np.inf)
    return np.where(valid, order, -1), renormalised.astype(np.float32)


def kept_passes(scores: np.ndarray, query_logliks, temperature: float, alpha: float,
                k: int) -> tuple[np.ndarray, np.ndarray]:
    """`rerank(posterior_log_weights(...), k)` for rows whose first len(query_logliks[b]) passages are retrieved
    (scores [B, D]; query_logliks: per row [D_b] Σ log p(x | d)): (positions [B, k'], renormalised log λ [B, k'])."""
    valid = np.zeros(scores.shape, bool)  # [B, D]
    evidence = np.zeros(scores.shape, np.float64)
    for b, ll in enumerate(query_logliks):
        valid[b, : len(ll)], evidence[b, : len(ll)] = True, ll
    return rerank(posterior_log_weights(scores, valid, evidence, temperature, alpha), k)
