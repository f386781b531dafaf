"""FlashRAG's REPLUG (method/logit_average.py) against a plain numpy reimplementation of the arithmetic of
`flashrag/pipeline/replug_utils.py`'s REPLUGLogitsProcessor and its sampler: scores divided by their sum, the passes'
logits weighted and summed, a softmax over the vocabulary."""
import numpy as np
import pytest

from replug_jax.method import logit_average


def flashrag_next_token_probs(doc_scores, logits):
    """replug_utils.py's steps, one by one: doc_scores /= doc_scores.sum(); (doc_scores[:, None] * scores).sum(0);
    softmax of the result (its sampler's `probs`)."""
    doc_scores = np.array(doc_scores, np.float64)
    doc_scores /= doc_scores.sum()
    replug_scores = (doc_scores[:, None] * np.asarray(logits, np.float64)).sum(axis=0)
    e = np.exp(replug_scores - replug_scores.max())
    return e / e.sum()


@pytest.fixture
def fixed():
    rng = np.random.default_rng(7)
    return np.array([0.62, 0.55, 0.31, 0.08]), rng.normal(0.0, 3.0, (4, 50))  # 4 passes' scores, logits [K, V]


def test_the_logit_average_is_flashrags_arithmetic(fixed):
    scores, logits = fixed
    log_w = logit_average.sum_normalised_log_weights(scores, np.ones(4, bool))
    np.testing.assert_allclose(np.exp(log_w), scores / scores.sum(), rtol=1e-12)
    expected = np.log(flashrag_next_token_probs(scores, logits))
    np.testing.assert_allclose(logit_average.logit_average(log_w, logits), expected, atol=1e-12)
    # the passes' log-probs instead of their logits give the same distribution (the weights sum to 1)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(logit_average.logit_average(log_w, log_probs), expected, atol=1e-12)
    # and it is not REPLUG's mixture of probabilities with the same weights
    replug = np.log(np.sum(np.exp(log_w)[:, None] * np.exp(log_probs), axis=0))
    assert np.max(np.abs(replug - expected)) > 0.1


def test_the_jax_form_equals_the_reference_with_a_missing_pass(fixed):
    scores, logits = fixed
    valid = np.array([[True, True, True, True], [True, True, False, False]])
    log_w = logit_average.sum_normalised_log_weights(np.stack([scores, scores]), valid)  # [2, 4]
    flat = np.concatenate([logits, logits]).astype(np.float32)  # [2·4, V]; the second question's last 2: padding
    flat[6:] = np.nan  # a pass of no weight is never read
    got = np.asarray(logit_average.logit_average_jax(flat, log_w.astype(np.float32)))  # [2, V]
    np.testing.assert_allclose(got[0], np.log(flashrag_next_token_probs(scores, logits)), atol=2e-5)
    np.testing.assert_allclose(got[1], np.log(flashrag_next_token_probs(scores[:2], logits[:2])), atol=2e-5)


@pytest.mark.parametrize("bad", [[0.5, 0.0, 0.2], [0.5, -0.1, 0.2]])
def test_scores_that_are_no_weights_are_refused_naming_the_row(bad):
    scores = np.array([[0.3, 0.2, 0.1], bad])
    with pytest.raises(ValueError, match=r"scores must all be > 0.*row 1"):
        logit_average.sum_normalised_log_weights(scores, np.ones((2, 3), bool))
    with pytest.raises(ValueError, match=r"row 1 \('Who wrote Кобзар\?'\)"):
        logit_average.sum_normalised_log_weights(scores, np.ones((2, 3), bool), ["Où est Zürich?", "Who wrote Кобзар?"])
    masked = np.array([[True] * 3, [True, False, True]])  # the bad score masked out: a weighting again
    log_w = logit_average.sum_normalised_log_weights(scores, masked)
    np.testing.assert_allclose(np.exp(log_w[1, [0, 2]]), [0.5 / 0.7, 0.2 / 0.7])
    assert log_w[1, 1] == -np.inf
