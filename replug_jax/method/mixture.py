"""The REPLUG ensemble (Shi et al., 2023, §3.2) as pure functions: one mixture under one set of names, in a numpy
form for the host (`log_weights`, `renormalised`, `mixed_logprobs`, `mixed_loglik`, float64) and a JAX form for
jitted code (the same names ending `_jax`: `log_weights_jax`, `mixed_logprobs_jax`, float32), held equal by
tests/test_mixture.py.

Each of the K retrieved documents d_k is prepended to the input x and scored by the
black-box LM separately; the K predictions are mixed in probability space with weights
from the retrieval scores s_k = s(d_k, x):

    λ_k            = softmax_k(s_k / τ)                      (over valid documents only)
    p(y_t | x)     = Σ_k λ_k · p(y_t | d_k ∘ x, y_<t)
    log p(y_t | x) = logsumexp_k( log λ_k + log p(y_t | d_k ∘ x, y_<t) )

The paper writes λ = softmax(s) (τ = 1); τ is exposed because cosine similarities are
confined to [-1, 1], where τ = 1 gives an almost uniform mixture.

Masking and infinities (no NaN is ever produced by the functions here from masked input):
  * `doc_mask[b, k] = False` marks a padding slot: its weight is 0 (log λ = -inf) and its
    log-probabilities are never read (`where`, not multiplication), so they may be garbage
    or NaN.
  * A score of -inf is allowed and means weight 0, like a masked document.
  * A row with no valid document (all masked or all scores -inf) has log λ = -inf
    everywhere and its ensemble log-probabilities are -inf (probability 0): callers must
    not evaluate such rows. Gradients through such rows are 0, not NaN.
  * NaN scores or log-probabilities of a *valid* document do propagate: that is a bug
    upstream, and hiding it would be worse. Scores of +inf are not supported.

Shapes: B queries, K documents per query, T continuation tokens, V vocabulary.
The JAX form computes in at least float32 (bf16 inputs are promoted); the numpy form in float64.
The JAX form imports jax on its first call (`_jax`): the numpy form serves the HTTP client (lm/http/), which
imports no JAX.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only
    import jax

__all__ = [
    "log_weights_jax",
    "mixed_logprobs_jax",
    "log_weights",
    "mixed_loglik",
    "mixed_logprobs",
    "renormalised",
]


def log_weights(scores, doc_mask, temperature: float = 1.0) -> np.ndarray:
    """`log_weights_jax` on the host, float64: log softmax(scores / τ) over the valid documents of each row,
    [..., K] -> [..., K], -inf for masked or -inf-scored documents (a row without any: all -inf)."""
    _check_temperature(temperature)
    s = np.asarray(scores, np.float64)
    valid = np.asarray(doc_mask, bool) & (s != -np.inf)
    top = np.max(np.where(valid, s, -np.inf), axis=-1, keepdims=True)  # centred before dividing by τ, as the JAX form
    top = np.where(np.isfinite(top), top, 0.0)
    return renormalised(np.where(valid, (np.where(valid, s, 0.0) - top) / temperature, -np.inf))


def uniform_scores(doc_mask) -> np.ndarray:
    """Scores [..., K] whose softmax at any τ is λ = 1/k over each row's valid documents: 0 where valid, -inf
    elsewhere, float32. The uniform mixture (the official GPT-3 path's logsumexp − log k) as REPLUG's weights."""
    return np.where(np.asarray(doc_mask, bool), 0.0, -np.inf).astype(np.float32)


def renormalised(log_weights) -> np.ndarray:
    """Log weights [..., K] (-inf: none) shifted to sum to 1 over each row's others, float64; a row without any stays
    all -inf. The one renormalisation of the host: REPLUG's softmax and the posterior's kept passages alike."""
    w = np.asarray(log_weights, np.float64)
    valid = w > -np.inf
    with np.errstate(invalid="ignore"):  # a row without any weight: its norm is -inf, never subtracted
        norm = np.logaddexp.reduce(np.where(valid, w, -np.inf), axis=-1, keepdims=True)
    return np.where(valid, w - np.where(np.isfinite(norm), norm, 0.0), -np.inf)


def mixed_logprobs(log_weights, per_pass) -> np.ndarray:
    """The mixture on the host, float64: logsumexp_k(log λ_k + per_pass[k, ...]) for any trailing shape, [K] and
    [K, *S] -> [*S]. A pass of weight 0 (log λ -inf) or a value of -inf (a token a pass does not offer: probability
    0 there) adds nothing; where nothing is left the result is -inf."""
    log_w = np.asarray(log_weights, np.float64)  # [K]
    stacked = np.stack([np.asarray(p, np.float64) for p in per_pass])  # [K, *S]
    return np.logaddexp.reduce(log_w.reshape(log_w.shape + (1,) * (stacked.ndim - 1)) + stacked, axis=0)  # [*S]


def mixed_loglik(log_weights, per_pass) -> float:
    """Σ_t logsumexp_k(log λ_k + log p_k(y_t | ...)): one continuation under the per-token mixture of its passes.
    log_weights: [K] log λ; per_pass: K arrays [T] (one continuation's token log-probs in each pass)."""
    return float(np.sum(mixed_logprobs(log_weights, per_pass)))


def _jax():
    """(jax, jax.numpy), imported at the JAX form's first call."""
    import jax
    import jax.numpy as jnp

    return jax, jnp


def _as_float(x):
    _, jnp = _jax()
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _check_temperature(temperature) -> None:
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _masked_logsumexp(x: jax.Array, valid: jax.Array, axis: int) -> jax.Array:
    """log Σ_{valid} exp(x) along `axis`; -inf (with zero gradient) where nothing is valid.

    Entries that are not valid are never read, so they may be NaN. The max shift uses
    `stop_gradient`, and both the log and the shift use the double-`where` trick so that
    empty sums give neither NaN values nor NaN gradients.
    """
    jax, jnp = _jax()
    x = jnp.where(valid, x, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    total = jnp.sum(jnp.where(valid, jnp.exp(x - m), 0.0), axis=axis)
    ok = total > 0
    return jnp.where(ok, jnp.log(jnp.where(ok, total, 1.0)) + jnp.squeeze(m, axis), -jnp.inf)


def log_weights_jax(scores, doc_mask, temperature=1.0) -> jax.Array:
    """log λ = log softmax(scores / τ) over the valid documents of each row.

    scores: [B, K] retrieval scores (-inf allowed: weight 0); doc_mask: [B, K] bool.
    Returns [B, K]: -inf for masked or -inf-scored documents; a row with no valid
    document is all -inf (its weights sum to 0, not 1).
    """
    jax, jnp = _jax()
    _check_temperature(temperature)
    s = _as_float(scores)  # [B, K]
    valid = jnp.asarray(doc_mask, bool) & (s != -jnp.inf)  # [B, K]; a NaN score stays valid and propagates
    # centre on the row maximum BEFORE dividing by τ: large scores (BM25) over a small τ keep their precision
    top = jax.lax.stop_gradient(jnp.max(jnp.where(valid, s, -jnp.inf), axis=-1, keepdims=True))  # [B, 1]
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    z = (jnp.where(valid, s, 0.0) - top) / temperature  # [B, K]
    lse = _masked_logsumexp(z, valid, axis=-1)  # [B]
    safe_z = jnp.where(valid, z, 0.0)
    safe_lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return jnp.where(valid, safe_z - safe_lse[:, None], -jnp.inf)


def mixed_logprobs_jax(doc_logprobs, scores, doc_mask, temperature=1.0) -> jax.Array:
    """The REPLUG mixture for any trailing shape: [B, K, *S] -> [B, *S]: per continuation token ([B, K, T]: the
    scored log p(y_t | d_k ∘ x, y_<t), pads masked by the caller afterwards) or over the vocabulary ([B, K, V]:
    normalised next-token log-probs, for generation; the result is normalised for rows with a valid document).

    out[b, ...] = logsumexp_k(log λ[b, k] + doc_logprobs[b, k, ...]); documents with
    zero weight are skipped entirely (their log-probabilities may be NaN).
    """
    _, jnp = _jax()
    lp = _as_float(doc_logprobs)  # [B, K, *S]
    log_w = log_weights_jax(scores, doc_mask, temperature)  # [B, K]
    extra = (1,) * (lp.ndim - 2)
    log_w = log_w.reshape(log_w.shape + extra)  # [B, K, 1, ...]
    valid = log_w != -jnp.inf  # [B, K, 1, ...]
    terms = jnp.where(valid, jnp.where(valid, log_w, 0.0) + lp, -jnp.inf)  # [B, K, *S]
    valid = jnp.broadcast_to(valid, terms.shape)
    return _masked_logsumexp(terms, valid, axis=1)  # [B, *S]
