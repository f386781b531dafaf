"""is_greedy from the scoring pass's top tokens (method/greedy_match.py) against the whole mixture in plain numpy:
wherever the bounds decide, they say what the full-vocabulary mixture's argmax says; they decide nearly always at
the project's TOP; and the local LM's `score_top` gives the very log-probs `score` gives, with its top tokens."""
import numpy as np
import pytest

from replug_jax.lm.blackbox import TopScores
from replug_jax.method import greedy_match


def full_mixture_is_greedy(probs: np.ndarray, weights: np.ndarray, tokens: list[int]) -> bool:
    """probs [K, T, V]: is every token the argmax of Σ_j λ_j p_j at its position (numpy, the whole vocabulary)?"""
    mixed = np.einsum("k,ktv->tv", weights, probs)  # [T, V]
    return all(int(np.argmax(mixed[t])) == y for t, y in enumerate(tokens))


def passes_of(probs: np.ndarray, tokens: list[int], top: int) -> list[TopScores]:
    """What `score_top` returns for passes with these full distributions [K, T, V]."""
    out = []
    for p in probs:  # [T, V]
        order = np.argsort(-p, axis=-1, kind="stable")[:, :top]  # [T, top]
        out.append(TopScores(np.log(p[np.arange(len(tokens)), tokens]).astype(np.float32),
                             np.log(np.take_along_axis(p, order, -1)).astype(np.float32), order, list(tokens)))
    return out


@pytest.mark.parametrize("top", [2, greedy_match.TOP])
def test_where_the_top_tokens_decide_they_agree_with_the_whole_mixture(top):
    rng = np.random.default_rng(0)
    decided = agreed = trials = 0
    for trial in range(400):
        k, t, v = rng.integers(1, 5), rng.integers(1, 4), 50
        logits = rng.normal(size=(k, t, v)) * rng.uniform(0.5, 4.0)  # flat to peaked distributions
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        weights = rng.dirichlet(np.ones(k))
        mixed = np.einsum("k,ktv->tv", weights, probs)
        # half the continuations are the mixture's own greedy tokens, half are random
        tokens = [int(x) for x in (np.argmax(mixed, -1) if trial % 2 else rng.integers(0, v, size=t))]
        got = greedy_match.mixture_is_greedy(passes_of(probs, tokens, top), np.log(weights))
        want = full_mixture_is_greedy(probs, weights, tokens)
        trials += 1
        if got is not None:
            decided += 1
            agreed += got == want
    assert agreed == decided  # never a wrong answer where it decides
    assert decided >= (0.5 if top == 2 else 0.9) * trials, (decided, trials)  # and it decides the most


def test_a_pass_left_out_and_mismatched_passes():
    probs = np.array([[[0.6, 0.3, 0.1]], [[0.1, 0.1, 0.8]]])  # [K=2, T=1, V=3]
    passes = passes_of(probs, [0], 3)
    assert greedy_match.mixture_is_greedy(passes, [0.0, -np.inf]) is True  # the second pass weighs nothing
    assert greedy_match.mixture_is_greedy(passes, np.log([0.5, 0.5])) is False  # 0.35 against token 2's 0.45
    near = passes_of(np.array([[[0.5, 0.5 - 1e-6, 1e-6]]]), [0], 3)
    assert greedy_match.mixture_is_greedy(near, [0.0]) is None  # a near-tie is left to decoding
    with pytest.raises(ValueError, match="different continuation tokens"):
        greedy_match.mixture_is_greedy(passes_of(probs, [0], 3)[:1] + passes_of(probs, [1], 3)[1:], [0.0, 0.0])


def test_the_local_lms_top_tokens_come_with_its_own_scores(smollm2):
    contexts = ["The capital of France is", "Monday, Tuesday, Wednesday,", "1, 2, 3,"]
    continuations = [" Paris", " Thursday and Friday", " 4"]
    plain = smollm2.score(contexts, continuations)
    tops = smollm2.score_top(contexts, continuations, 4)
    for p, x, y in zip(plain, tops, continuations):
        np.testing.assert_allclose(x.logprobs, p, atol=1e-5)
        assert x.token_ids == smollm2.tokenizer.encode(y) and x.top_ids.shape == (len(p), 4)
        assert np.all(np.diff(x.top_logprobs, axis=-1) <= 0)  # best first
        for t, token in enumerate(x.token_ids):  # a token among the top has its own score there
            if token in x.top_ids[t]:
                assert abs(x.top_logprobs[t][list(x.top_ids[t]).index(token)] - x.logprobs[t]) < 1e-5
    assert tops[0].top_ids[0][0] == tops[0].token_ids[0]  # " Paris" is the LM's first choice


DOCS = [{"id": "a", "title": "Paris", "text": "Paris is the capital and largest city of France."},
        {"id": "b", "title": "Kyiv", "text": "Київ є столицею України."},
        {"id": "c", "title": "Tokyo", "text": "東京は日本の首都です。"},
        {"id": "d", "title": "Days", "text": "The days of the week are Monday, Tuesday, Wednesday and Thursday."},
        {"id": "e", "title": "Café", "text": "Le café crème est servi à Montréal. 🙂"}]
PAIRS = [("The capital of France is", " Paris"), ("The capital of France is", " Lyon"),
         ("Monday, Tuesday, Wednesday,", " Thursday"), ("Monday, Tuesday, Wednesday,", " Sunday and"),
         ("Monday, Tuesday, Wednesday,", " Thursday, Saturday"),  # the first token greedy, a later one not
         ("Столиця України —", " Київ"), ("日本の首都は", "東京")]


@pytest.mark.parametrize("weights", ["replug", "replug_posterior"])
def test_replugs_is_greedy_from_the_scoring_pass_is_its_greedy_decoding(smollm2, minilm, weights):
    """The object's score_and_greedy: the log-probs of score_many, and where the passes' top tokens decide, what
    REPLUG's own greedy decoding (`generations`, the same weights: retrieval's or the posterior's) gives."""
    import replug_jax as rj

    mixing = {"posterior_alpha": 1.0, "rerank_depth": 3} if weights == "replug_posterior" else {}
    rag = rj.REPLUG.from_documents(DOCS, lm=smollm2, encoder=minilm, k=2, temperature=0.1, weights=weights, **mixing)
    contexts, continuations = (list(x) for x in zip(*PAIRS))
    lps, flags = rag.score_and_greedy(contexts, continuations)
    for got, want in zip(lps, rag.score_many(contexts, continuations)):
        np.testing.assert_allclose(got, want, atol=1e-6)
    ids = [smollm2.tokenizer.encode(y) for y in continuations]
    decoded = rag.generations(contexts, max_new_tokens=max(map(len, ids)), stop=())
    truth = [list(g.token_ids[: len(w)]) == w for g, w in zip(decoded, ids)]
    assert sum(f is not None for f in flags) >= len(flags) - 1  # the scoring pass decides (nearly) all
    assert [f for f in flags if f is not None] == [t for f, t in zip(flags, truth) if f is not None]
    assert any(truth) and not all(truth)  # compared both ways


def test_the_lm_cache_keeps_the_top_tokens(smollm2, tmp_path):
    """CachedLM's score_top and score_with_query(top=): the second call reads everything back, token for token."""
    from replug_jax.lm.cache import CachedLM

    cached = CachedLM(smollm2, str(tmp_path / "lm_cache.sqlite"))
    first = cached.score_top(["Київ —", "東京は"], [" столиця", "日本の首都"], 3)
    again = cached.score_top(["Київ —", "東京は"], [" столиця", "日本の首都"], 3)
    query_first = cached.score_with_query(["Paris."], [" Question:"], [" France"], top=3)
    query_again = cached.score_with_query(["Paris."], [" Question:"], [" France"], top=3)
    assert cached.hits == 3 and cached.misses == 3
    for a, b in zip(first + [query_first[0][1]], again + [query_again[0][1]]):
        assert a.token_ids == b.token_ids and np.array_equal(a.top_ids, b.top_ids)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
        np.testing.assert_array_equal(a.top_logprobs, b.top_logprobs)
    np.testing.assert_array_equal(query_first[0][0], query_again[0][0])
    assert first[0].token_ids == smollm2.tokenizer.encode(" столиця")


def test_our_servers_scoring_requests_give_the_local_top_tokens(smollm2, minilm):
    """Over HTTP to our server (the local tokenizer's token-id prompts, and the server's /tokenize): `score_top` and
    `score_with_query(top=)` read each continuation position's top tokens from the scoring request itself
    (`logprobs` with `echo_from`, tokens named by id), as the local LM gives them; so the object's score_and_greedy
    decides is_greedy over HTTP as it does locally. A client whose server does not honour echo_from offers none."""
    import replug_jax as rj
    from replug_jax.serve import BackgroundServer

    contexts, continuations = (list(x) for x in zip(*PAIRS))
    want = smollm2.score_top(contexts, continuations, greedy_match.TOP)
    want_query = smollm2.score_with_query(["Paris."], [" Question:"], [" France"], top=greedy_match.TOP)
    local = rj.REPLUG.from_documents(DOCS, lm=smollm2, encoder=minilm, k=2, temperature=0.1)
    want_flags = local.score_and_greedy(contexts, continuations)[1]
    with BackgroundServer(smollm2) as server:
        for lm in (rj.load_lm(server.url, tokenizer="smollm2"), rj.load_lm(server.url)):
            got = lm.score_top(contexts, continuations, greedy_match.TOP)
            query = lm.score_with_query(["Paris."], [" Question:"], [" France"], top=greedy_match.TOP)
            for a, b in zip(got + [query[0][1]], want + [want_query[0][1]]):
                assert a.token_ids == b.token_ids and np.array_equal(a.top_ids, b.top_ids)
                np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
                np.testing.assert_allclose(a.top_logprobs, b.top_logprobs, atol=1e-4)
            np.testing.assert_allclose(query[0][0], want_query[0][0], atol=1e-4)
            rag = rj.REPLUG.from_documents(DOCS, lm=lm, encoder=minilm, k=2, temperature=0.1)
            assert rag.score_and_greedy(contexts, continuations)[1] == want_flags
        lm.echo_from = False
        assert not hasattr(lm, "score_top")
    assert sum(f is not None for f in want_flags) >= len(want_flags) - 1
