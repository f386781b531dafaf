"""Progress that moves: corpus embedding advances with every encoder batch (not once per 4,096-row block) and
generation counts questions."""
import numpy as np

import replug_jax as rj
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
