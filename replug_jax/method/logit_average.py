"""REPLUG as FlashRAG computes it (`flashrag/pipeline/replug_utils.py`, after fastRAG): for comparison only.

FlashRAG weighs each of the K passes by its retrieval score normalised by the sum, w_k = s_k / Σ_j s_j (no softmax,
no τ), and averages the passes' next-token *logits*, not their probabilities:

    z(v)        = Σ_k w_k · logits_k(v)
    p(y_t | x)  = softmax_v(z)(y_t)

Since Σ_k w_k = 1, softmax(Σ_k w_k logits_k) = softmax(Σ_k w_k log p_k): a weighted geometric mean of the passes'
distributions, renormalised (a product of experts), where REPLUG's §3.2 takes the arithmetic mean (method/mixture.py).
A token one pass rules out is ruled out by the average; REPLUG keeps it at the other passes' probability.

The weights are carried as log w_k, so that the generation program takes FlashRAG's the way it takes REPLUG's log λ
(-inf: no pass). They are weights only where every score is positive (cosine similarities of a question's top
passages, BM25, DPR's inner products are): a question with a score <= 0 among its passes is refused, naming it.

The numpy form is the reference (float64; `logit_average`), the JAX form (`logit_average_jax`) runs in the generation
program's decoding loop (lm/local_generate.py); tests/test_logit_average.py holds them to a plain reimplementation of
replug_utils.py's arithmetic.
"""
from __future__ import annotations

import numpy as np

NAME = "flashrag"  # the method's name in the jobs


def sum_normalised_log_weights(scores, doc_mask, names=None) -> np.ndarray:
    """log(s_k / Σ_j s_j) over each row's valid passes, [..., K] -> [..., K] float64 (-inf where masked). A row whose
    valid scores are not all positive is refused: s/Σs is no weighting there (`names`: each row's, for the message,
    e.g. its question)."""
    s = np.asarray(scores, np.float64)
    valid = np.asarray(doc_mask, bool)
    bad = np.flatnonzero(np.any(valid & ~(s > 0), axis=-1).reshape(-1))
    if bad.size:
        row = np.where(valid, s, np.nan).reshape(-1, s.shape[-1])[bad[0]]
        name = f" ({names[bad[0]]!r})" if names is not None else ""
        raise ValueError(f"{NAME}: the passages' scores must all be > 0 for FlashRAG's weights s / Σs; row {bad[0]}"
                         f"{name} (of {bad.size} such) has {np.round(row[~np.isnan(row)], 6).tolist()}")
    total = np.sum(np.where(valid, s, 0.0), axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return np.where(valid, np.log(np.where(valid, s, 1.0) / np.where(total > 0, total, 1.0)), -np.inf)


def logit_average(log_weights, per_pass_logits) -> np.ndarray:
    """FlashRAG's next-token log-probs, float64: log_softmax_v(Σ_k w_k · logits_k), [K] and [K, ..., V] -> [..., V].
    Passes of weight 0 (log w -inf) are never read."""
    log_w = np.asarray(log_weights, np.float64)
    logits = np.asarray(per_pass_logits, np.float64)
    valid = log_w > -np.inf
    w = np.exp(np.where(valid, log_w, 0.0)).reshape(log_w.shape + (1,) * (logits.ndim - 1))
    z = np.sum(np.where(valid.reshape(w.shape), w * logits, 0.0), axis=0)  # [..., V]
    top = np.max(z, axis=-1, keepdims=True)
    return z - top - np.log(np.sum(np.exp(z - top), axis=-1, keepdims=True))


def logit_average_jax(logits, log_weights):
    """The JAX form for the decoding loop: next-token logits [B·K, V] and log w [B, K] (-inf: no pass) -> log-probs
    [B, V] float32. A question without any pass gets a uniform row (it is never decoded: `done` from the start)."""
    import jax
    import jax.numpy as jnp

    b, k = log_weights.shape
    z = logits.astype(jnp.float32).reshape(b, k, -1)  # [B, K, V]
    valid = log_weights > -jnp.inf  # [B, K]
    w = jnp.where(valid, jnp.exp(jnp.where(valid, log_weights, 0.0)), 0.0)  # [B, K]
    mixed = jnp.sum(jnp.where(valid[..., None], w[..., None] * z, 0.0), axis=1)  # [B, V]
    return jax.nn.log_softmax(mixed, axis=-1)
