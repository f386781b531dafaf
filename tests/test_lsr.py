"""The LSR objective against a float64 numpy reference (explicit softmax and KL) and finite differences."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from replug_jax.method import lsr_loss
from tests.test_mixture import ref_weights as ref_softmax  # softmax(x / t) over mask & finite x, float64


def ref_kl(a, b):
    """Σ a log(a / b) per row over a > 0."""
    out = np.zeros(a.shape[0])
    for r in range(a.shape[0]):
        on = a[r] > 0
        out[r] = np.sum(a[r, on] * (np.log(a[r, on]) - np.log(b[r, on])))
    return out


def ref_entropy(p):
    return np.array([-np.sum(row[row > 0] * np.log(row[row > 0])) for row in p])


def ref_loss(scores, lm, mask, gamma, beta, direction):
    """(loss, metrics) in float64 with the lsr_loss conventions (-inf on either side = masked)."""
    s, l = np.asarray(scores, np.float64), np.asarray(lm, np.float64)
    valid = np.asarray(mask, bool) & (s != -np.inf) & (l != -np.inf)
    p, q = ref_softmax(np.where(valid, s, 0), valid, gamma), ref_softmax(np.where(valid, l, 0), valid, beta)
    kl = ref_kl(p, q) if direction == "pr_q" else ref_kl(q, p)
    rows = valid.any(-1)
    n = max(rows.sum(), 1)
    agree = np.argmax(np.where(valid, p, -1), -1) == np.argmax(np.where(valid, q, -1), -1)
    metrics = {"entropy_pr": ref_entropy(p)[rows].sum() / n, "entropy_q": ref_entropy(q)[rows].sum() / n,
               "top1_agreement": agree[rows].sum() / n}
    return kl[rows].sum() / n, metrics


def case(seed=0, b=6, k=5):
    rng = np.random.default_rng(seed)
    scores = rng.uniform(-1, 1, size=(b, k)).astype(np.float32)  # cosine-like
    lm = (-rng.uniform(20, 40, size=(b, k))).astype(np.float32)  # summed token log-probs
    mask = np.ones((b, k), bool)
    mask[1, 3:] = False
    scores[1, 3:] = np.nan  # garbage in masked slots must not leak
    lm[1, 3:] = np.inf
    mask[2, :] = False  # an all-masked row
    scores[2, :] = np.nan
    mask[3, 1:] = False  # one valid doc
    return scores, lm, mask


@pytest.mark.parametrize("direction", lsr_loss.DIRECTIONS)
@pytest.mark.parametrize("gamma,beta", [(0.1, 0.1), (1.0, 2.0)])
def test_matches_reference(direction, gamma, beta):
    scores, lm, mask = case()
    loss, metrics = lsr_loss.lsr_loss(scores, lm, mask, gamma, beta, direction)
    want, want_metrics = ref_loss(scores, lm, mask, gamma, beta, direction)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
    for name, value in want_metrics.items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-5, atol=1e-6, err_msg=name)

    log_p = lsr_loss.retrieval_log_likelihood(scores, mask, gamma)
    log_q = lsr_loss.lm_log_likelihood(lm, mask, beta)
    p64 = ref_softmax(np.where(mask, scores, 0), mask, gamma)
    q64 = ref_softmax(np.where(mask, lm, 0), mask, beta)
    np.testing.assert_allclose(np.exp(log_p), p64, atol=1e-6)
    np.testing.assert_allclose(np.exp(log_q), q64, atol=1e-6)
    per_row = lsr_loss.kl_loss(log_p, log_q, mask, direction)
    ref_rows = ref_kl(p64, q64) if direction == "pr_q" else ref_kl(q64, p64)
    np.testing.assert_allclose(per_row, ref_rows, rtol=1e-5, atol=1e-6)
    assert per_row[2] == 0 and per_row[3] == 0  # all-masked row; single valid doc


def test_kl_definitions():
    """The two directions are the textbook KLs of explicit distributions, and differ."""
    p = np.array([[0.7, 0.2, 0.1]])
    q = np.array([[0.1, 0.3, 0.6]])
    mask = np.ones((1, 3), bool)
    fwd = lsr_loss.kl_loss(jnp.log(p), jnp.log(q), mask, "pr_q")
    rev = lsr_loss.kl_loss(jnp.log(p), jnp.log(q), mask, "q_pr")
    np.testing.assert_allclose(fwd, [np.sum(p * np.log(p / q))], rtol=1e-6)
    np.testing.assert_allclose(rev, [np.sum(q * np.log(q / p))], rtol=1e-6)
    assert abs(float(fwd[0]) - float(rev[0])) > 0.05
    with pytest.raises(ValueError, match="direction"):
        lsr_loss.kl_loss(jnp.log(p), jnp.log(q), mask, "forward")
    # 0 · log 0 = 0, and mass where the other side has none is +inf
    zero = np.array([[np.log(0.5), np.log(0.5), -np.inf]])
    assert float(lsr_loss.kl_loss(zero, jnp.log(q), mask, "pr_q")[0]) == pytest.approx(
        0.5 * np.log(0.5 / 0.1) + 0.5 * np.log(0.5 / 0.3), rel=1e-6)
    assert float(lsr_loss.kl_loss(jnp.log(q), zero, mask, "pr_q")[0]) == np.inf


@pytest.mark.parametrize("direction", lsr_loss.DIRECTIONS)
def test_gradient_finite_differences(direction):
    scores, lm, mask = case(seed=1)
    scores[4, 2] = -np.inf  # a -inf score: out of both distributions, zero gradient
    gamma, beta = 0.5, 3.0
    with jax.enable_x64(True):
        s64, l64 = jnp.asarray(scores, jnp.float64), jnp.asarray(lm, jnp.float64)
        f = lambda s: lsr_loss.lsr_loss(s, l64, mask, gamma, beta, direction)[0]  # noqa: E731
        grad = np.asarray(jax.grad(f)(s64))
        assert grad.dtype == np.float64 and np.all(np.isfinite(grad))
        eps = 1e-6
        valid = mask & np.isfinite(scores)
        for b, k in zip(*np.nonzero(valid)):
            e = np.zeros(scores.shape)
            e[b, k] = eps
            fd = (float(f(s64 + e)) - float(f(s64 - e))) / (2 * eps)
            assert grad[b, k] == pytest.approx(fd, rel=1e-5, abs=1e-8), (b, k)
        assert np.all(grad[~valid] == 0)
        assert np.all(grad[3] == 0)  # one valid doc: constant loss
    # the sign is right: one gradient step lowers the loss
    s32 = jnp.where(jnp.asarray(valid), jnp.asarray(scores), 0.0)
    f32 = lambda s: lsr_loss.lsr_loss(s, lm, valid, gamma, beta, direction)[0]  # noqa: E731
    assert float(f32(s32 - 0.1 * jax.grad(f32)(s32))) < float(f32(s32))


def test_no_gradient_to_lm_scores():
    scores, lm, mask = case(seed=2)
    for direction in lsr_loss.DIRECTIONS:
        g = jax.grad(lambda l: lsr_loss.lsr_loss(scores, l, mask, 0.1, 0.1, direction)[0])(jnp.asarray(lm))
        assert np.all(np.asarray(g) == 0)
    g = jax.grad(lambda l: jnp.sum(jnp.where(mask, lsr_loss.lm_log_likelihood(l, mask, 0.1), 0.0)))(jnp.asarray(lm))
    assert np.all(np.asarray(g) == 0)


def test_single_document():
    scores = np.array([[0.3], [-0.9]], np.float32)
    lm = np.array([[-12.0], [-50.0]], np.float32)
    mask = np.ones((2, 1), bool)
    for direction in lsr_loss.DIRECTIONS:
        loss, metrics = lsr_loss.lsr_loss(scores, lm, mask, 0.1, 0.1, direction)
        assert float(loss) == 0
        assert float(metrics["entropy_pr"]) == 0 and float(metrics["entropy_q"]) == 0
        assert float(metrics["top1_agreement"]) == 1
        g = jax.grad(lambda s: lsr_loss.lsr_loss(s, lm, mask, 0.1, 0.1, direction)[0])(jnp.asarray(scores))
        assert np.all(np.asarray(g) == 0)


def test_ties():
    """Equal scores give uniform distributions; equal P_R and Q give zero loss and zero gradient."""
    scores = np.full((2, 4), 0.25, np.float32)
    lm = np.full((2, 4), -30.0, np.float32)
    mask = np.ones((2, 4), bool)
    np.testing.assert_allclose(np.exp(lsr_loss.retrieval_log_likelihood(scores, mask, 0.1)), 0.25, rtol=1e-6)
    loss, metrics = lsr_loss.lsr_loss(scores, lm, mask, 0.1, 0.1)
    assert float(loss) == 0  # identical inputs: exactly equal log-probabilities
    assert float(metrics["entropy_pr"]) == pytest.approx(np.log(4), rel=1e-6)
    assert float(metrics["top1_agreement"]) == 1  # ties resolve to the first index on both sides
    g = jax.grad(lambda s: lsr_loss.lsr_loss(s, lm, mask, 0.1, 0.1)[0])(jnp.asarray(scores))
    np.testing.assert_allclose(g, 0, atol=1e-6)
    # P_R tied, Q peaked: KL(P_R ‖ Q) against the reference
    lm2 = np.array([[-10.0, -30, -30, -30]] * 2, np.float32)
    want, _ = ref_loss(scores, lm2, mask, 0.1, 0.1, "pr_q")
    np.testing.assert_allclose(lsr_loss.lsr_loss(scores, lm2, mask, 0.1, 0.1)[0], want, rtol=1e-5)


@pytest.mark.parametrize("direction", lsr_loss.DIRECTIONS)
def test_minus_inf_is_like_masked(direction):
    scores, lm, mask = case(seed=3)
    mask[[1, 2, 3]] = True
    scores = np.nan_to_num(scores, nan=0.1)
    lm = np.where(np.isfinite(lm), lm, -25.0).astype(np.float32)
    s_inf, l_inf = scores.copy(), lm.copy()
    s_inf[0, 1] = -np.inf
    l_inf[4, 3] = -np.inf
    s_inf[5, :] = -np.inf  # a row whose every retrieval score is -inf: left out like an all-masked row
    masked = mask.copy()
    masked[0, 1] = masked[4, 3] = False
    masked[5, :] = False
    got, got_m = lsr_loss.lsr_loss(s_inf, l_inf, mask, 0.1, 0.1, direction)
    want, want_m = lsr_loss.lsr_loss(scores, lm, masked, 0.1, 0.1, direction)
    assert np.isfinite(float(got))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for name in want_m:
        np.testing.assert_allclose(got_m[name], want_m[name], rtol=1e-6)
    g = jax.grad(lambda s: lsr_loss.lsr_loss(s, l_inf, mask, 0.1, 0.1, direction)[0])(jnp.asarray(s_inf))
    assert np.all(np.isfinite(g)) and g[0, 1] == 0 and g[4, 3] == 0 and np.all(g[5] == 0)
    # the likelihoods alone give -inf-scored documents probability 0
    assert float(lsr_loss.retrieval_log_likelihood(s_inf, mask, 0.1)[0, 1]) == -np.inf


def test_all_masked_batch():
    scores = np.full((3, 4), np.nan, np.float32)
    lm = np.full((3, 4), np.nan, np.float32)
    mask = np.zeros((3, 4), bool)
    for direction in lsr_loss.DIRECTIONS:
        loss, metrics = lsr_loss.lsr_loss(scores, lm, mask, 0.1, 0.1, direction)
        assert float(loss) == 0 and all(float(v) == 0 for v in metrics.values())
        g = jax.grad(lambda s: lsr_loss.lsr_loss(s, lm, mask, 0.1, 0.1, direction)[0])(jnp.asarray(scores))
        assert np.all(np.asarray(g) == 0)


def test_mean_over_rows_with_documents():
    """Rows without documents are left out of the mean, rows with documents are not."""
    scores, lm, mask = case(seed=4)
    loss = float(lsr_loss.lsr_loss(scores, lm, mask, 0.1, 0.1)[0])
    keep = mask.any(-1)
    sub = float(lsr_loss.lsr_loss(scores[keep], lm[keep], mask[keep], 0.1, 0.1)[0])
    assert loss == pytest.approx(sub, rel=1e-6)


def test_top1_agreement():
    scores = np.array([[0.9, 0.1, 0.0], [0.9, 0.1, 0.0], [0.0, 0.2, 0.9], [0.5, 0.9, 0.0]], np.float32)
    lm = np.array([[-1.0, -5, -9], [-9.0, -5, -1], [-9.0, -5, -1], [-1.0, -5, -9]], np.float32)
    mask = np.ones((4, 3), bool)
    mask[3, 1] = False  # masked best retrieval score: argmax P_R is doc 0, as for Q
    _, metrics = lsr_loss.lsr_loss(scores, lm, mask, 0.1, 0.1)
    assert float(metrics["top1_agreement"]) == pytest.approx(0.75)


def test_jit_and_bf16_inputs():
    scores, lm, mask = case(seed=5)
    f = jax.jit(lsr_loss.lsr_loss, static_argnames="direction")
    loss, _ = f(jnp.asarray(scores, jnp.bfloat16), lm, mask, 0.1, 0.1, direction="q_pr")
    assert loss.dtype == jnp.float32 and np.isfinite(float(loss))


def test_float32_precision_with_long_continuations():
    """ℓ summed over 128 tokens is ~ -400; with β = 0.1 the float32 result still matches float64 closely."""
    rng = np.random.default_rng(6)
    lm = (-400 + rng.normal(size=(4, 20)) * 0.3).astype(np.float32)
    scores = rng.uniform(-1, 1, size=(4, 20)).astype(np.float32)
    mask = np.ones((4, 20), bool)
    q = np.exp(np.asarray(lsr_loss.lm_log_likelihood(lm, mask, 0.1), np.float64))
    np.testing.assert_allclose(q, ref_softmax(lm, mask, 0.1), rtol=2e-5, atol=1e-7)
    for direction in lsr_loss.DIRECTIONS:
        want, _ = ref_loss(scores, lm, mask, 0.1, 0.1, direction)
        np.testing.assert_allclose(lsr_loss.lsr_loss(scores, lm, mask, 0.1, 0.1, direction)[0], want, rtol=2e-5)
