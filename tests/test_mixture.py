"""The REPLUG ensemble against a float64 numpy reference: an explicit mixture of probabilities."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replug_jax.method import mixture


def ref_weights(scores, mask, tau):
    """λ [B, K] in float64: softmax(s/τ) over valid docs (mask and finite score), 0 elsewhere."""
    s = np.asarray(scores, np.float64) / tau
    valid = np.asarray(mask, bool) & np.isfinite(s)
    w = np.zeros_like(s)
    for b in range(s.shape[0]):
        if valid[b].any():
            e = np.exp(s[b, valid[b]] - s[b, valid[b]].max())
            w[b, valid[b]] = e / e.sum()
    return w


def ref_mixture(doc_lp, scores, mask, tau):
    """log Σ_k λ_k p_k with p_k = exp(doc_lp), [B, K, ...] -> [B, ...], float64."""
    w = ref_weights(scores, mask, tau)
    p = np.exp(np.where(w[..., None] > 0, np.asarray(doc_lp, np.float64), -np.inf))
    with np.errstate(divide="ignore"):
        return np.log(np.einsum("bk,bkt->bt", w, np.nan_to_num(p, nan=0.0)))


def logprobs(rng, shape):
    """Random per-token log-probabilities (normalised over a vocabulary of 50 and then picked)."""
    x = rng.normal(size=shape + (50,)) * 2
    lp = x - np.logaddexp.reduce(x, axis=-1, keepdims=True)
    return lp[..., 0].astype(np.float32)


def case(seed=0, b=5, k=4, t=7):
    rng = np.random.default_rng(seed)
    lp = logprobs(rng, (b, k, t))
    scores = rng.normal(size=(b, k)).astype(np.float32)
    mask = np.ones((b, k), bool)
    return lp, scores, mask


@pytest.mark.parametrize("tau", [1.0, 0.1])
def test_matches_reference(tau):
    lp, scores, mask = case()
    mask[1, 2:] = False
    lp[1, 2:] = np.nan  # masked docs: garbage must not leak
    out = mixture.mixed_logprobs_jax(lp, scores, mask, tau)
    np.testing.assert_allclose(out, ref_mixture(lp, scores, mask, tau), rtol=1e-5, atol=1e-5)
    w = np.exp(mixture.log_weights_jax(scores, mask, tau))
    np.testing.assert_allclose(w, ref_weights(scores, mask, tau), atol=1e-6)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
    # the mixture is also logaddexp-reduce of log λ + log p
    with np.errstate(divide="ignore", invalid="ignore"):
        log_w = np.log(ref_weights(scores, mask, tau))[:, :, None]
        terms = np.where(mask[:, :, None], log_w + lp.astype(np.float64), -np.inf)
    np.testing.assert_allclose(out, np.logaddexp.reduce(terms, axis=1), rtol=1e-5, atol=1e-5)


def test_single_document_is_identity():
    lp, scores, mask = case(k=1)
    out = mixture.mixed_logprobs_jax(lp, scores, mask, 0.3)
    np.testing.assert_allclose(out, lp[:, 0], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(mixture.log_weights_jax(scores, mask), 0.0)


def test_ties_give_uniform_weights_and_mean_probability():
    lp, _, mask = case()
    scores = np.full(mask.shape, 0.7, np.float32)
    w = np.exp(mixture.log_weights_jax(scores, mask, 0.05))
    np.testing.assert_allclose(w, 0.25, rtol=1e-6)
    out = mixture.mixed_logprobs_jax(lp, scores, mask, 0.05)
    np.testing.assert_allclose(out, np.log(np.exp(lp.astype(np.float64)).mean(1)), rtol=1e-5, atol=1e-6)


def test_uniform_scores_give_one_over_k_of_the_valid_documents_at_any_temperature():
    mask = np.array([[True, True, True, True], [True, True, False, False], [False, True, False, True]])
    scores = mixture.uniform_scores(mask)  # [3, 4]
    want = mask / mask.sum(1, keepdims=True)
    for tau in (0.03, 1.0, 7.0):
        np.testing.assert_allclose(np.exp(mixture.log_weights_jax(scores, mask, tau)), want, rtol=1e-6)
        np.testing.assert_allclose(np.exp(mixture.log_weights(scores, mask, tau)), want, rtol=1e-12)
    np.testing.assert_allclose(np.exp(mixture.renormalised(scores)), want, rtol=1e-12)
    assert scores.dtype == np.float32 and np.isneginf(scores[~mask]).all()


def test_minus_inf_scores_and_masked_nan_logprobs():
    lp, scores, mask = case()
    scores[0, 0] = -np.inf  # weight 0, but its logprobs are still finite
    scores[2, :3] = -np.inf  # only doc 3 left: equals its logprobs
    mask[3, 1] = False
    lp[3, 1] = np.nan
    scores[3, 1] = np.nan  # a masked doc's score is garbage too
    out = np.asarray(mixture.mixed_logprobs_jax(lp, scores, mask, 0.5))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref_mixture(lp, scores, mask, 0.5), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[2], lp[2, 3], rtol=1e-6, atol=1e-6)
    log_w = np.asarray(mixture.log_weights_jax(scores, mask, 0.5))
    assert log_w[0, 0] == -np.inf and log_w[3, 1] == -np.inf and not np.isnan(log_w).any()


def test_minus_inf_token_logprob_of_one_doc():
    lp, scores, mask = case()
    lp[0, 1, 2] = -np.inf  # one doc gives the token probability 0: the mixture does not
    lp[1, :, 3] = -np.inf  # every doc gives probability 0: so does the mixture
    out = np.asarray(mixture.mixed_logprobs_jax(lp, scores, mask))
    assert np.isfinite(out[0]).all() and out[1, 3] == -np.inf and not np.isnan(out).any()
    np.testing.assert_allclose(out, ref_mixture(lp, scores, mask, 1.0), rtol=1e-5, atol=1e-5)


def test_all_documents_masked_is_minus_inf_without_nan():
    lp, scores, mask = case()
    mask[4] = False
    lp[4] = np.nan
    out = np.asarray(mixture.mixed_logprobs_jax(lp, scores, mask))
    assert (out[4] == -np.inf).all() and np.isfinite(out[:4]).all()
    assert (np.asarray(mixture.log_weights_jax(scores, mask))[4] == -np.inf).all()
    grad = jax.grad(lambda s: jnp.sum(mixture.mixed_logprobs_jax(lp, s, mask)[:4]))(scores)
    assert np.isfinite(grad).all() and (grad[4] == 0).all()


def test_temperature_sharpens_towards_best_document():
    lp, scores, mask = case()
    best = scores.argmax(1)
    hot = np.asarray(mixture.mixed_logprobs_jax(lp, scores, mask, 1e6))
    cold = np.asarray(mixture.mixed_logprobs_jax(lp, scores, mask, 1e-3))
    np.testing.assert_allclose(cold, lp[np.arange(len(best)), best], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(hot, np.log(np.exp(lp.astype(np.float64)).mean(1)), atol=2e-5)
    w = lambda tau: np.exp(mixture.log_weights_jax(scores, mask, tau))[np.arange(len(best)), best]
    assert (w(0.1) > w(1.0)).all() and (w(1.0) > w(10.0)).all()
    with pytest.raises(ValueError):
        mixture.log_weights_jax(scores, mask, 0.0)


def test_next_token_mixture_is_normalised():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4, 101)).astype(np.float32) * 3
    lp = np.array(jax.nn.log_softmax(x, -1))
    scores = rng.normal(size=(3, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 1, 0]], bool)
    lp[~mask] = np.nan
    out = np.asarray(mixture.mixed_logprobs_jax(lp, scores, mask, 0.2))
    assert out.shape == (3, 101)
    np.testing.assert_allclose(np.exp(out.astype(np.float64)).sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(out, ref_mixture(lp, scores, mask, 0.2), rtol=1e-5, atol=1e-5)


def test_gradient_wrt_scores_matches_finite_differences():
    lp, scores, mask = case(b=2, k=3, t=4)
    mask[1, 0] = False
    lp[1, 0] = np.nan
    with jax.enable_x64(True):
        lp64, s64 = jnp.asarray(lp, jnp.float64), jnp.asarray(scores, jnp.float64)
        f = jax.jit(lambda s: jnp.sum(mixture.mixed_logprobs_jax(lp64, s, mask, 0.5) * jnp.arange(1.0, 5.0)))
        grad = np.asarray(jax.grad(f)(s64))
        assert grad.dtype == np.float64
        eps, fd = 1e-6, np.zeros_like(grad)
        for idx in np.ndindex(*scores.shape):
            e = np.zeros(scores.shape)
            e[idx] = eps
            fd[idx] = (f(s64 + e) - f(s64 - e)) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
    assert grad[1, 0] == 0
    np.testing.assert_allclose(grad.sum(1), 0.0, atol=1e-9)  # softmax: shifting all scores changes nothing


def test_weights_keep_precision_for_large_scores_and_small_temperature():
    """BM25-sized scores over a small τ: the row maximum is subtracted before dividing by τ, so log λ keeps
    float32 precision (dividing first rounds s/τ ≈ 1e6 to ~0.06 and shifts the weights by that much)."""
    scores = np.asarray([[1000.1, 1000.125, 1000.05, 999.98]], np.float32)
    tau = 0.001
    z = scores.astype(np.float64) / tau
    want = z - np.log(np.exp(z - z.max()).sum()) - z.max()
    got = np.asarray(mixture.log_weights_jax(scores, np.ones((1, 4), bool), tau), np.float64)
    np.testing.assert_allclose(got, want, atol=1e-3)
    divided_first = (scores / np.float32(tau)).astype(np.float32)  # the old order, in float32
    old = divided_first - np.log(np.exp((divided_first - divided_first.max()).astype(np.float64)).sum()) - divided_first.max()
    assert np.abs(old - want).max() > 1e-2  # the test would catch the old order


@pytest.mark.parametrize("tau", [1.0, 0.1])
def test_the_host_form_is_the_jax_form_in_float64(tau):
    """`mixed_logprobs` / `mixed_loglik` (numpy, the HTTP client's and the answer NLL's) against the jitted
    `mixed_logprobs_jax` and the float64 reference, a pass of weight 0 and a token a pass does not offer included."""
    lp, scores, mask = case(seed=3)
    mask[2, 1] = False
    scores[4, 0] = -np.inf
    log_w = np.asarray(mixture.log_weights_jax(scores, mask, tau), np.float64)  # [B, K]
    jax_out = np.asarray(mixture.mixed_logprobs_jax(lp, scores, mask, tau))  # [B, T]
    for b in range(lp.shape[0]):
        host = mixture.mixed_logprobs(log_w[b], lp[b])  # [T]
        assert host.dtype == np.float64
        np.testing.assert_allclose(host, jax_out[b], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(host, ref_mixture(lp, scores, mask, tau)[b], rtol=1e-5, atol=1e-5)
        assert mixture.mixed_loglik(log_w[b], lp[b]) == pytest.approx(float(host.sum()), abs=1e-9)
    offered = np.array([[-1.0, -np.inf], [-2.0, -0.5]])  # pass 0 does not offer token 1
    got = mixture.mixed_logprobs(np.log([0.25, 0.75]), offered)
    np.testing.assert_allclose(np.exp(got), [0.25 * np.exp(-1.0) + 0.75 * np.exp(-2.0), 0.75 * np.exp(-0.5)])
    assert mixture.mixed_logprobs([-np.inf, 0.0], offered)[1] == -0.5  # a weight-0 pass adds nothing


@pytest.mark.parametrize("tau", [1.0, 0.1, 0.001])
def test_host_weights_are_the_reference_in_float64(tau):
    """`log_weights` (the posterior's and the HTTP client's weights, numpy float64) against the float64
    reference and the JAX form: masked and -inf-scored passes weigh 0, a row without any is all -inf (no NaN), and
    BM25-sized scores over a small τ keep their precision; `renormalised` makes any kept weights sum to 1."""
    _, scores, mask = case(seed=4)
    scores = scores.astype(np.float64) * 300 + 1000  # BM25-sized
    mask[1, 2:] = False
    scores[3, 1] = -np.inf
    mask[4] = False  # no passage at all
    got = mixture.log_weights(scores, mask, tau)
    assert got.dtype == np.float64 and not np.isnan(got).any()
    valid = mask & np.isfinite(scores)
    for b in range(4):  # in log space (exp would underflow): z - log Σ exp z over the valid passes, z = s / τ
        z = scores[b, valid[b]] / tau
        np.testing.assert_allclose(got[b, valid[b]], z - np.logaddexp.reduce(z), rtol=1e-9, atol=1e-9)
    assert np.isneginf(got[4]).all() and np.isneginf(got[1, 2:]).all() and np.isneginf(got[3, 1])
    if tau >= 0.1:  # the JAX form in float32
        jax_form = np.asarray(mixture.log_weights_jax(scores.astype(np.float32), mask, tau), np.float64)
        np.testing.assert_allclose(got, jax_form, atol=2e-4 / tau)
    kept = mixture.renormalised(np.where(mask, got - 3.0, -np.inf))  # any shift: renormalised back
    np.testing.assert_allclose(np.exp(kept[:4]).sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(kept[:4], got[:4], atol=1e-12)
    assert np.isneginf(mixture.renormalised([[-np.inf, -np.inf]])).all()
