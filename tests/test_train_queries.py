"""LSR training data (§5.2) and the persistent LM-score cache."""
import os

import numpy as np
import pytest

import replug_jax as rj
from replug_jax.method.posterior import PrefillPosterior
from replug_jax.lm.cache import CachedLM
from replug_jax.retrieval.datastore import Document, chunk_documents
from replug_jax.train.queries import check_disjoint, training_examples
from replug_jax.train.lm_cache import LMScoreCache

from tests import hf_tiny

TEXT = "The quick brown fox jumps over the lazy dog while the cat watches from the wall. " * 6


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm")
    hf_tiny.tiny_gpt2(str(path), positions=256)
    return rj.load_lm(str(path), batch_size=8)


def test_examples_are_query_and_continuation_windows(tiny_lm):
    tok = tiny_lm.tokenizer
    docs = [Document("a", "", TEXT), Document("b", "", TEXT[:100])]
    examples = training_examples(docs, tok, query_tokens=40, continuation_tokens=24, seed=3)
    assert {e.excluded_sources for e in examples} == {("a",), ("b",)}  # a window never retrieves its own document
    for e in examples:
        assert len(tok.encode(e.query)) == 40 and len(tok.encode(e.continuation)) == 24
        assert (e.query + e.continuation) in TEXT
    assert examples == training_examples(docs, tok, query_tokens=40, continuation_tokens=24, seed=3)
    assert examples != training_examples(docs, tok, query_tokens=40, continuation_tokens=24, seed=4)
    with pytest.raises(ValueError, match="too short"):
        training_examples([Document("c", "", "short")], tok, query_tokens=40, continuation_tokens=24)


def test_question_target_windows_need_no_continuation(tiny_lm):
    """continuation_tokens 0 (LSR's question target on text): windows of x alone, y empty, one every
    query_tokens tokens; the answer target, which scores y, is refused that setting before any model loads."""
    from replug_jax.jobs.config_files import sibling_config
    from replug_jax.jobs.input_checks import check_job_inputs

    tok = tiny_lm.tokenizer
    examples = training_examples([Document("a", "", TEXT)], tok, query_tokens=40, continuation_tokens=0, seed=3)
    assert len(examples) == (len(tok.encode(TEXT)) - 1) // 40 and {e.continuation for e in examples} == {""}
    assert all(len(tok.encode(e.query)) == 40 and e.query in TEXT for e in examples)
    configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "configs")
    config = sibling_config(os.path.join(configs, "x"), "demo_lsr.py")
    config.train_continuation_tokens = 0
    with pytest.raises(ValueError, match="train_continuation_tokens=0: the answer target"):
        check_job_inputs(config)
    config.lsr_target = "question"
    check_job_inputs(config)


def test_documents_too_short_for_a_window_are_named_not_skipped_in_silence(tiny_lm, caplog):
    docs = [Document("a", "", TEXT), Document("tiny", "", "short"), Document("b", "", TEXT[:100])]
    with caplog.at_level("WARNING"):
        examples = training_examples(docs, tiny_lm.tokenizer, query_tokens=40, continuation_tokens=24)
    assert {e.excluded_sources for e in examples} == {("a",), ("b",)}
    assert "1 of 3 training documents are shorter than one window of 64 tokens" in caplog.text
    assert "'tiny'" in caplog.text
    caplog.clear()
    training_examples(docs[:1], tiny_lm.tokenizer, query_tokens=40, continuation_tokens=24)
    assert "shorter than one window" not in caplog.text


def test_training_documents_must_be_disjoint_from_the_datastore(tiny_lm):
    corpus = [Document("x", "", TEXT), Document("y", "", "Another document entirely about rivers and the sea. " * 4)]
    store = chunk_documents(corpus, tiny_lm.tokenizer, chunk_tokens=80)
    check_disjoint([Document("t", "", "A fresh training document about mountains and snow. " * 3)], store)
    with pytest.raises(ValueError, match="also in the datastore"):
        check_disjoint([Document("x", "", "whatever")], store)
    with pytest.raises(ValueError, match="identical to datastore chunks"):
        check_disjoint([Document("copy", "", store.texts[0])], store)


class CountingLM:
    def __init__(self, lm):
        self.lm, self.name, self.pairs = lm, "counting", 0

    def fingerprint(self):
        return self.lm.fingerprint()

    def score(self, contexts, continuations, progress=False):
        self.pairs += len(contexts)
        return self.lm.score(contexts, continuations)


def test_cache_scores_each_pair_once_across_restarts(tiny_lm, tmp_path):
    lm = CountingLM(tiny_lm)
    contexts, conts = ["a b c", "d e f", "a b c"], [" x y", " z", " x y"]
    cache = LMScoreCache(str(tmp_path / "c.sqlite"), lm)
    sums, counts = cache.score(contexts, conts)
    expected = [x.sum() for x in tiny_lm.score(contexts, conts)]
    np.testing.assert_allclose(sums, expected, rtol=1e-6)
    assert list(counts) == [4, 2, 4] and lm.pairs == 2  # the duplicate pair is scored once
    assert cache.stats()["cache_misses"] == 2 and cache.stats()["cache_hits"] == 1
    cache.close()
    again = LMScoreCache(str(tmp_path / "c.sqlite"), lm)  # a restart: everything comes from disk
    sums2, _ = again.score(contexts + ["new"], conts + [" pair"])
    np.testing.assert_array_equal(sums2[:3], sums)
    assert lm.pairs == 3 and again.stats()["cache_hits"] == 3



def test_the_score_cache_has_one_query_scoring_path():
    """LSR's question target scores through `score_query_and_continuation` (train/batch.py); no unused
    query-only twin beside it."""
    assert hasattr(LMScoreCache, "score_query_and_continuation") and not hasattr(LMScoreCache, "score_query")

class DyingLM(CountingLM):
    """The LM, killed (an exception) in its call number `dies_at`."""

    def __init__(self, lm, dies_at):
        super().__init__(lm)
        self.calls, self.dies_at = 0, dies_at

    def score(self, contexts, continuations, progress=False):
        self.calls += 1
        if self.calls == self.dies_at:
            raise KeyboardInterrupt("killed mid-run")
        return super().score(contexts, continuations)


def test_a_run_killed_mid_call_keeps_the_chunks_scored_before(tiny_lm, tmp_path):
    contexts = [f"word {i} and" for i in range(7)]
    conts = [f" then {'x ' * i}" for i in range(7)]
    dying = DyingLM(tiny_lm, dies_at=3)
    cached = CachedLM(dying, str(tmp_path / "lm.sqlite"))
    cached.store_every = 3  # chunks of 3, 3, 1 misses: killed in the third
    with pytest.raises(KeyboardInterrupt):
        cached.score(contexts, conts, progress=True)
    assert dying.pairs == 6
    again = CachedLM(CountingLM(tiny_lm), str(tmp_path / "lm.sqlite"))  # the re-run
    got = again.score(contexts, conts)
    assert again.lm.pairs == 1 and again.cache_stats()["cache_hits"] == 6
    for g, want in zip(got, tiny_lm.score(contexts, conts)):
        np.testing.assert_array_equal(g, want.astype(np.float32))


def test_cached_lm_returns_the_lms_token_logprobs_and_is_the_lm_otherwise(tiny_lm, tmp_path):
    lm = CountingLM(tiny_lm)
    lm.tokenizer = tiny_lm.tokenizer
    contexts, conts = ["a b c", "", "d e"], [" x y", " z w v", " x y"]
    cached = CachedLM(lm, str(tmp_path / "lm.sqlite"))
    first = cached.score(contexts, conts)
    for got, want in zip(first, tiny_lm.score(contexts, conts)):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want.astype(np.float32))  # stored exactly
    first[0][:] = 0.0  # the caller's arrays are copies: the cache is not changed through them
    second = cached.score(contexts[::-1], conts[::-1])
    np.testing.assert_array_equal(second[2], tiny_lm.score(contexts[:1], conts[:1])[0].astype(np.float32))
    assert lm.pairs == 3 and cached.cache_stats() == {"cache_hits": 3, "cache_misses": 3, "cache_hit_rate": 0.5}
    assert cached.name == "counting" and cached.tokenizer is tiny_lm.tokenizer  # everything else is the LM's
    training = LMScoreCache("ignored.sqlite", cached)  # a job's cached LM serves the training loop as it is
    assert training.lm is cached and not os.path.exists("ignored.sqlite")
    sums, counts = training.score(contexts, conts)
    assert lm.pairs == 3 and list(counts) == [len(x) for x in second[::-1]]
    with pytest.raises(ValueError, match="3 contexts but 2 continuations"):
        cached.score(contexts, conts[:2])


class GeneratingLM(CountingLM):
    """The LM's `generate`, counting the questions it decodes; killed (an exception) in its call number `dies_at`."""

    def __init__(self, lm, dies_at=0):
        super().__init__(lm)
        self.questions, self.calls, self.dies_at = 0, 0, dies_at

    def generate(self, contexts, log_weights, **kw):
        self.calls += 1
        if self.calls == self.dies_at:
            raise KeyboardInterrupt("killed mid-generation")
        self.questions += len(contexts)
        return self.lm.generate(contexts, log_weights, **kw)


PASSES = [[f"Knowledge: fact {i} about {w}\nQuestion: what of {w}?\nAnswer:" for w in (f"cat {i}", "dogs")]
          for i in range(5)]
WEIGHTS = [np.log(np.array([0.7, 0.3], np.float32)) for _ in PASSES]
QUERIES = ["?\nAnswer:"] * len(PASSES)  # x: what ends every pass of its question


def _same_generations(got, want):
    for g, w in zip(got, want, strict=True):
        assert (g.text, g.token_ids, g.finish_reason) == (w.text, w.token_ids, w.finish_reason)
        np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-6)
        assert g.log_weights == w.log_weights and g.query_logliks == w.query_logliks


def test_a_generation_killed_mid_call_resumes_at_the_question_it_reached(tiny_lm, tmp_path, capsys):
    settings = dict(max_new_tokens=4, stop=("\n",), shared_prefix="Demo: one\n\n")
    want = tiny_lm.generate(PASSES, WEIGHTS, **settings)
    dying = CachedLM(GeneratingLM(tiny_lm, dies_at=3), str(tmp_path / "lm.sqlite"))
    dying.generations_every = 2  # chunks of 2, 2, 1 questions: killed in the third
    with pytest.raises(KeyboardInterrupt):
        dying.generate(PASSES, WEIGHTS, progress=True, **settings)
    assert dying.lm.questions == 4
    again = CachedLM(GeneratingLM(tiny_lm), str(tmp_path / "lm.sqlite"))  # the re-run
    capsys.readouterr()
    _same_generations(again.generate(PASSES, WEIGHTS, **settings), want)
    assert again.lm.questions == 1
    assert f"LM cache: 4 of 5 answers read back from {again.path}, 1 to compute" in capsys.readouterr().out
    assert again.cache_stats() == {"cache_hits": 0, "cache_misses": 0, "cache_hit_rate": 0.0,
                                   "generations_from_cache": 4, "generations_decoded": 1}
    # any input that changes a decoding is a miss: another weight, budget, prefix or stop string
    other = [w.copy() for w in WEIGHTS]
    other[0] = np.log(np.array([0.2, 0.8], np.float32))
    again.generate(PASSES, other, **settings)
    again.generate(PASSES[:1], WEIGHTS[:1], **{**settings, "max_new_tokens": 5})
    again.generate(PASSES[:1], WEIGHTS[:1], **{**settings, "shared_prefix": ""})
    again.generate(PASSES[:1], WEIGHTS[:1], **{**settings, "stop": (".",)})
    assert again.lm.questions == 1 + 4


def test_cached_generation_keeps_the_prefill_posterior_and_its_dropped_passes(tiny_lm, tmp_path):
    settings = dict(max_new_tokens=3, shared_prefix="Demo: one\n\n")
    posterior = PrefillPosterior(QUERIES, alpha=0.5, keep=1)
    want = tiny_lm.generate(PASSES, WEIGHTS, posterior=posterior, **settings)
    assert all(np.isneginf(g.log_weights).sum() == 1 for g in want)  # one pass of two dropped per question
    cached = CachedLM(GeneratingLM(tiny_lm), str(tmp_path / "lm.sqlite"))
    cached.generations_every = 3
    _same_generations(cached.generate(PASSES, WEIGHTS, posterior=posterior, **settings), want)
    _same_generations(cached.generate(PASSES, WEIGHTS, posterior=posterior, **settings), want)  # from disk
    assert cached.lm.questions == 5
    cached.generate(PASSES, WEIGHTS, posterior=PrefillPosterior(QUERIES, alpha=1.0, keep=1), **settings)
    cached.generate(PASSES, WEIGHTS, **settings)  # without the posterior: other generations
    assert cached.lm.questions == 15


class AnsweringLM(CountingLM):
    """The LM's `generate` with `on_answer`, counting the answers it gives; killed (an exception) right after its
    answer number `dies_after` is handed on."""

    def __init__(self, lm, dies_after=0):
        super().__init__(lm)
        self.answers, self.dies_after = 0, dies_after

    def generate(self, contexts, log_weights, *, on_answer=None, **kw):
        def relay(question, generation):
            self.answers += 1
            on_answer(question, generation)
            if self.answers == self.dies_after:
                raise KeyboardInterrupt("killed mid-generation")

        return self.lm.generate(contexts, log_weights, on_answer=relay if on_answer else None, **kw)


def test_each_answer_is_stored_as_it_completes_and_a_rerun_decodes_only_the_rest(tiny_lm, tmp_path, capsys):
    """Issue 69, item 4: where the LM hands on each answer as it completes (`on_answer`: the local backend per
    batch, the HTTP client per question), the cache asks for every question in one call and stores each answer at
    once; killed after its third answer, the rerun reads those three back, says so, and decodes the other two."""
    settings = dict(max_new_tokens=4, stop=("\n",), shared_prefix="Demo: one\n\n")
    want = tiny_lm.generate(PASSES, WEIGHTS, **settings)
    dying = CachedLM(AnsweringLM(tiny_lm, dies_after=3), str(tmp_path / "lm.sqlite"))
    with pytest.raises(KeyboardInterrupt):
        dying.generate(PASSES, WEIGHTS, **settings)
    again = CachedLM(AnsweringLM(tiny_lm), str(tmp_path / "lm.sqlite"))
    capsys.readouterr()
    _same_generations(again.generate(PASSES, WEIGHTS, **settings), want)
    assert again.lm.answers == 2
    assert f"LM cache: 3 of 5 answers read back from {again.path}, 2 to compute" in capsys.readouterr().out


def test_the_http_client_hands_on_each_answer_as_it_completes(tiny_lm):
    """The HTTP client's answers come through `on_answer` once each, equal to what it returns, mixed and one-pass
    alike (a server's logging outlives capsys: a test of its own)."""
    from replug_jax.lm.http.client import HTTPLM
    from replug_jax.serve import BackgroundServer

    settings = dict(max_new_tokens=4, stop=("\n",), shared_prefix="Demo: one\n\n")
    with BackgroundServer(tiny_lm) as server:
        remote = HTTPLM(server.url, tokenizer=tiny_lm.tokenizer)
        for passes, weights in ((PASSES, WEIGHTS), ([p[:1] for p in PASSES], [w[:1] for w in WEIGHTS])):
            seen = {}
            got = remote.generate(passes, weights, on_answer=seen.__setitem__, **settings)
            assert sorted(seen) == list(range(len(passes))) and [seen[i] for i in range(len(passes))] == got
