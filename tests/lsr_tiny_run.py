"""A tiny REPLUG LSR run in its own process (for the kill-and-resume test).

    python tests/lsr_tiny_run.py MODELS_DIR WORKDIR STEPS [SECONDS_PER_LM_CALL]

Trains with the tiny random BERT and GPT-2 saved in MODELS_DIR/{enc,lm}; writes the final
parameters to WORKDIR/final_params.npz. The LM may be slowed down so that a parent can kill
the run in the middle. `load(models, workdir)` and `SETTINGS` are also imported by the
in-process tests (tests/test_lsr_loop.py), so both train on the same tiny problem.
"""
import os
import signal
import sys
import time

if __name__ == "__main__":  # in-process users (pytest) have set up jax already
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import replug_jax as rj  # noqa: E402
from replug_jax.retrieval.datastore import Document, chunk_documents  # noqa: E402
from replug_jax.retrieval.embeddings import embed_corpus  # noqa: E402
from replug_jax.retrieval.index import DenseIndex  # noqa: E402
from replug_jax.retrieval.retriever import index_meta  # noqa: E402
from replug_jax.train.queries import training_examples  # noqa: E402
from replug_jax.train.loop import LSRSettings, train_lsr  # noqa: E402

WORDS = ["river", "mountain", "violin", "bread", "snow", "desert", "ocean", "forest", "city", "garden"]
# the settings of the kill-and-resume run (tests override some of them with dataclasses.replace)
SETTINGS = dict(k=3, batch_size=8, learning_rate=3e-3, refresh_every=3, swap_after=1, query_max_tokens=32,
                doc_max_tokens=56, checkpoint_every=2, keep_checkpoints=2)


def settings_for(sides: str) -> dict:
    """SETTINGS training "both" encoders (refreshing the index) or the "query" side only."""
    if sides not in ("both", "query"):
        raise ValueError(f"sides must be 'both' or 'query', got {sides!r}")
    return dict(SETTINGS, train_documents=sides == "both")


def documents(prefix, n, length=60, seed=0):
    rng = np.random.default_rng(seed)
    return [Document(f"{prefix}{i}", f"T{i}", " ".join(rng.choice(WORDS, size=length)) + ".") for i in range(n)]


def save_models(root) -> str:
    """The tiny random BERT and GPT-2 of these runs, saved to root/{enc,lm}; returns root as a string."""
    from tests import hf_tiny

    hf_tiny.tiny_bert(os.path.join(root, "enc"))
    hf_tiny.tiny_gpt2(os.path.join(root, "lm"), positions=256)
    return str(root)


class CountingLM:
    """The LM, counting the (context, continuation) pairs it is asked for; each call slowed by `delay` seconds
    (so that a parent can kill the run midway), and SIGKILLing its process at LM call `kill_at` (0: never)."""

    def __init__(self, lm, kill_at=0, delay=0.0):
        self.lm, self.name, self.kill_at, self.delay, self.calls, self.pairs = lm, lm.name, kill_at, delay, 0, 0

    def fingerprint(self):
        return self.lm.fingerprint()

    def score(self, contexts, continuations, progress=False):
        time.sleep(self.delay)
        self.calls += 1
        if self.calls == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        self.pairs += len(contexts)
        return self.lm.score(contexts, continuations)


def load(models, workdir):
    """(encoder, lm, datastore, index of the datastore under the initial encoder, training examples)."""
    os.makedirs(workdir, exist_ok=True)
    encoder = rj.load_encoder(os.path.join(models, "enc"), batch_size=8)
    lm = rj.load_lm(os.path.join(models, "lm"), batch_size=8)
    store = chunk_documents(documents("c", 12, seed=1), lm.tokenizer, chunk_tokens=48)
    index = DenseIndex.build(embed_corpus(encoder, store.texts, os.path.join(workdir, "emb.npy"), progress=False),
                             meta=index_meta(encoder, store))
    examples = training_examples(documents("t", 6, seed=2), lm.tokenizer, query_tokens=24, continuation_tokens=16)
    return encoder, lm, store, index, examples


def main(models, workdir, steps, delay=0.0):
    encoder, lm, store, index, examples = load(models, workdir)
    settings = LSRSettings(steps=steps, **SETTINGS)
    out = train_lsr(encoder, CountingLM(lm, delay=delay), store, examples, workdir, settings, initial_index=index, progress=False)
    leaves = jax.tree_util.tree_leaves(out["params"])
    np.savez(os.path.join(workdir, "final_params.npz"), *[np.asarray(x) for x in leaves])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
