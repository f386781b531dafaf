"""Progress that moves: corpus embedding advances with every encoder batch (not once per 4,096-row block),
generation counts questions, and a black box that takes no `progress` keyword is never given one."""
import numpy as np

import replug_jax as rj
from replug_jax.evaluate import mmlu, qa
from replug_jax.lm.blackbox import Generation
from replug_jax.lm.cache import CachedLM
from replug_jax.retrieval import embeddings

from tests import hf_tiny


class CountingEncoder:
    """Reports its work 100 rows at a time, as DenseEncoder reports its batches."""

    dim = 4

    def __init__(self):
        self.calls, self.reports = [], []

    def fingerprint(self):
        return "counting"

    def embed(self, texts, progress=False):
        self.calls.append(len(texts))
        for start in range(0, len(texts), 100):
            if callable(progress):
                progress(min(100, len(texts) - start))
                self.reports.append(start)
        return np.ones((len(texts), self.dim), np.float32)


def test_embedding_progress_moves_with_every_batch(tmp_path, capsys):
    enc = CountingEncoder()
    texts = [f"t{i}" for i in range(600)]
    out = embeddings.embed_corpus(enc, texts, str(tmp_path / "e.npy"), block_size=4096, progress=True)
    assert out.shape == (600, 4) and enc.calls == [600] and len(enc.reports) == 6  # one call, six updates
    assert "600/600" in capsys.readouterr().err


def test_dense_encoder_reports_rows_per_batch(tmp_path):
    hf_tiny.tiny_bert(str(tmp_path))
    enc = rj.load_encoder(str(tmp_path), batch_size=8)
    seen = []
    E = enc.embed([f"text number {i}" for i in range(20)], progress=seen.append)
    assert E.shape == (20, 32) and sum(seen) == 20 and len(seen) == 3


def test_generation_progress_counts_questions(tmp_path, capsys):
    hf_tiny.tiny_gpt2(str(tmp_path), positions=256)
    lm = rj.load_lm(str(tmp_path), batch_size=8)
    lm.generate([["a b", "c"]] * 5, [np.log([0.5, 0.5])] * 5, max_new_tokens=2, stop=(), progress=True)
    err = capsys.readouterr().err
    assert "5/5" in err and "question" in err


class ContractLM:
    """A user's black box with exactly lm/blackbox.py's methods: no `progress` keyword anywhere."""

    name = "contract"

    def fingerprint(self):
        return "contract-v1"

    def count_tokens(self, text):
        return len(text)

    def score(self, contexts, continuations):
        return [np.full(len(y), -0.5 - len(c) % 3, np.float32) for c, y in zip(contexts, continuations)]

    def generate(self, contexts, log_weights, *, max_new_tokens, stop=("\n",), shared_prefix=""):
        return [Generation(text=f"{len(ctx)}", token_ids=[1], logprobs=[-0.1], finish_reason="stop")
                for ctx in contexts]


def test_a_black_box_without_progress_keywords_runs_where_the_projects_lms_show_progress(tmp_path):
    """Asked for progress, the project's helpers and cache give `progress` only to LMs that take it."""
    lm = ContractLM()
    cached = CachedLM(lm, str(tmp_path / "c.sqlite"))
    cached.store_every = 2  # several chunks: the cache's own bar, the inner calls without a keyword
    contexts, continuations = ["a", "bb", "ccc", "dddd", "e"], [" x", " yy", " z", " w", " v"]
    want = lm.score(contexts, continuations)
    for progress in (True, False):
        got = cached.score(contexts, continuations, progress=progress)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert mmlu.option_logprobs(lm, [["p"], ["q", "rr"]], progress=True).shape == (2, 2, 4)
    for ensemble in qa.ENSEMBLES:
        answers = qa.generate_answers(lm, [["d1", "d2"]], [np.log([0.5, 0.5])], ensemble=ensemble, demo_prefix="",
                                      max_new_tokens=2, progress=True)
        assert answers[0]["prediction"] in ("1", "2")
