"""REPLUG LSR, the LM-supervised retrieval objective (Shi et al., 2023, §4.1–4.3), as pure JAX functions.

For a query x with K retrieved documents d_k, retrieval scores s_k = s(d_k, x) and LM
scores ℓ_k = log P_LM(y | d_k ∘ x) of the ground-truth continuation y:

    P_R(d_k | x)    = softmax_k(s_k / γ)          retrieval likelihood (§4.1), trained
    Q(d_k | x, y)   = softmax_k(ℓ_k / β)          LM likelihood (§4.2), a constant
    loss            = mean_x KL(P_R ‖ Q)          (§4.3, as the paper writes it)

`direction="q_pr"` gives KL(Q ‖ P_R) instead, the direction of Atlas and of the official
REPLUG training stub; which one was used belongs in the results.

LM scores. ℓ_k = Σ_t log P_LM(y_t | d_k ∘ x, y_<t), summed over the continuation's
tokens. The paper's formula literally exponentiates the probability P_LM(y | d, x); for
a 128-token y that is ~e^-300 for every document and Q would be uniform, so we follow
Atlas and the issue and use the log-likelihood. Passing the per-token *mean* instead (a
softer Q, independent of |y|) is the caller's choice: these functions only see [B, K]
numbers and do not know which was passed. Q never receives a gradient
(`jax.lax.stop_gradient`): the LM is a black box and is not trained.

Masking and infinities (no NaN is ever produced here from masked input):
  * `doc_mask[b, k] = False` marks a padding slot; its scores are never read (`where`,
    not multiplication), so they may be NaN or garbage, and they get zero gradient.
  * In `retrieval_log_likelihood` / `lm_log_likelihood` a score of -inf means
    probability 0 (as in `mixture.log_weights_jax`). In `lsr_loss` a -inf on either
    side (retrieval or LM score) removes the document from *both* distributions, exactly
    as if it were masked: otherwise one side would give it probability 0 and the other
    not, and the KL (hence the batch mean) would be +inf.
  * `kl_loss` itself keeps the mathematics: 0·log 0 = 0, and p·log(p / 0) = +inf.
  * A row with no valid document has loss 0 and zero gradient and is left out of the
    batch mean; a row with one valid document has P_R = Q = 1 and loss 0 (it does count).
  * NaN scores of a *valid* document propagate (a bug upstream). +inf is not supported.

Shapes: B queries, K documents per query. Computation is in at least float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from replug_jax.method.mixture import log_weights_jax

__all__ = ["DIRECTIONS", "retrieval_log_likelihood", "lm_log_likelihood", "kl_loss", "lsr_loss"]

DIRECTIONS = ("pr_q", "q_pr")


def retrieval_log_likelihood(scores, doc_mask, gamma) -> jax.Array:
    """log P_R = log softmax(s / γ) over the valid documents: scores, doc_mask [B, K] -> [B, K].

    -inf for masked or -inf-scored documents; a row with no valid document is all -inf.
    """
    return log_weights_jax(scores, doc_mask, gamma)  # centred on the row maximum before dividing by γ


def lm_log_likelihood(lm_scores, doc_mask, beta) -> jax.Array:
    """log Q = log softmax(ℓ / β) over the valid documents, with no gradient: [B, K] -> [B, K].

    lm_scores ℓ [B, K] = log P_LM(y | d_k ∘ x) (summed over y's tokens, or its mean: the
    caller decides). Q is a constant of the objective: the gradient wrt ℓ is exactly 0.
    """
    # log_weights_jax subtracts the row maximum before dividing: ℓ/β of a 128-token continuation is ~ -4000,
    # where a float32 ulp is 2.4e-4, so dividing first would put errors of that size into log Q
    return jax.lax.stop_gradient(log_weights_jax(jax.lax.stop_gradient(lm_scores), doc_mask, beta))


def _support(log_p, doc_mask) -> jax.Array:
    """Where a distribution given as log-probabilities has mass: [B, K] bool."""
    return jnp.asarray(doc_mask, bool) & (log_p != -jnp.inf)


def kl_loss(log_p_r, log_q, doc_mask, direction: str = "pr_q") -> jax.Array:
    """Per-row KL divergence between two distributions over K documents: [B, K] x 2 -> [B].

    direction "pr_q": KL(P_R ‖ Q) = Σ_k P_R (log P_R − log Q)   (the paper, §4.3)
    direction "q_pr": KL(Q ‖ P_R) = Σ_k Q (log Q − log P_R)     (Atlas, the official stub)
    Terms of masked documents, and terms whose first distribution is 0, are 0 (their
    inputs may be NaN); a row with no valid document gives 0 with zero gradient.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    log_p_r = jnp.asarray(log_p_r)
    log_q = jnp.asarray(log_q)
    log_a, log_b = (log_p_r, log_q) if direction == "pr_q" else (log_q, log_p_r)
    on = _support(log_a, doc_mask)  # [B, K]: terms with a > 0
    safe_a = jnp.where(on, log_a, 0.0)  # double `where`: no NaN gradient from the unread entries
    safe_b = jnp.where(on, log_b, 0.0)
    terms = jnp.where(on, jnp.exp(safe_a) * (safe_a - safe_b), 0.0)  # [B, K]
    return jnp.sum(terms, axis=-1)  # [B]


def _entropy(log_p, doc_mask) -> jax.Array:
    """−Σ_k p log p per row over the documents with p > 0: [B, K] -> [B]."""
    on = _support(log_p, doc_mask)
    safe = jnp.where(on, log_p, 0.0)
    return -jnp.sum(jnp.where(on, jnp.exp(safe) * safe, 0.0), axis=-1)


def lsr_loss(scores, lm_scores, doc_mask, gamma, beta, direction: str = "pr_q"):
    """The REPLUG LSR loss and its diagnostics.

    scores [B, K]: retrieval scores s(d_k, x) (differentiable); lm_scores [B, K]: ℓ_k
    (constant); doc_mask [B, K] bool. A document takes part when it is in doc_mask and
    neither of its scores is -inf.

    Returns (loss, metrics): loss = mean over rows with >= 1 valid document of the per-row
    KL (0 when there is no such row); metrics (scalars, means over the same rows, 0 when
    there are none): "entropy_pr", "entropy_q" (nats) and "top1_agreement", the fraction
    of rows where argmax P_R == argmax Q (ties go to the lowest index on both sides).
    """
    scores = jnp.asarray(scores)
    lm_scores = jax.lax.stop_gradient(jnp.asarray(lm_scores))
    valid = jnp.asarray(doc_mask, bool) & (scores != -jnp.inf) & (lm_scores != -jnp.inf)  # [B, K]
    log_p_r = retrieval_log_likelihood(scores, valid, gamma)  # [B, K]
    log_q = lm_log_likelihood(lm_scores, valid, beta)  # [B, K]
    per_row = kl_loss(log_p_r, log_q, valid, direction)  # [B]

    rows = jnp.any(valid, axis=-1)  # [B]
    n = jnp.maximum(jnp.sum(rows), 1).astype(per_row.dtype)
    row_mean = lambda v: jnp.sum(jnp.where(rows, v, 0.0)) / n  # noqa: E731
    loss = row_mean(per_row)

    log_p_r_c = jax.lax.stop_gradient(log_p_r)
    agree = jnp.argmax(log_p_r_c, axis=-1) == jnp.argmax(log_q, axis=-1)  # [B]
    metrics = {
        "entropy_pr": row_mean(_entropy(log_p_r_c, valid)),
        "entropy_q": row_mean(_entropy(log_q, valid)),
        "top1_agreement": row_mean(agree.astype(per_row.dtype)),
    }
    return loss, metrics
