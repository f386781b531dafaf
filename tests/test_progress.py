"""Progress that moves: corpus embedding advances every PROGRESS_ROWS rows (not once per 4,096-row block) and
generation counts questions."""
import numpy as np

import replug_jax as rj
from replug_jax.retrieval import embeddings

from tests import hf_tiny


class CountingEncoder:
    dim = 4

    def __init__(self):
        self.calls = []

    def fingerprint(self):
        return "counting"

    def embed(self, texts):
        self.calls.append(len(texts))
        return np.ones((len(texts), self.dim), np.float32)


def test_embedding_progress_moves_every_few_hundred_rows(tmp_path, capsys):
    enc = CountingEncoder()
    texts = [f"t{i}" for i in range(600)]
    out = embeddings.embed_corpus(enc, texts, str(tmp_path / "e.npy"), block_size=4096, progress=True)
    assert out.shape == (600, 4) and enc.calls == [256, 256, 88] and embeddings.PROGRESS_ROWS == 256
    assert "600/600" in capsys.readouterr().err


def test_generation_progress_counts_questions(tmp_path, capsys):
    hf_tiny.tiny_gpt2(str(tmp_path), positions=256)
    lm = rj.load_lm(str(tmp_path), batch_size=8)
    lm.generate([["a b", "c"]] * 5, [np.log([0.5, 0.5])] * 5, max_new_tokens=2, stop=(), progress=True)
    err = capsys.readouterr().err
    assert "5/5" in err and "question" in err
