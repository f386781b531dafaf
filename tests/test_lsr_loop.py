"""The REPLUG LSR loop's bookkeeping: LM scores belong to their (query, document) pair, queries are
embedded with the current parameters, settings are validated, the LM score cache is keyed by
everything that changes a score, enough index versions are kept for every kept checkpoint (a
corrupt newest checkpoint falls back to an older one and its index), and the LSR job end to end."""
import concurrent.futures
import hashlib
import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import config_dict

import replug_jax as rj
from replug_jax.jobs.lsr import run_lsr
from replug_jax.jobs.prepare import load_trained_encoder
from replug_jax.lm.local import LocalLM
from replug_jax.method.passages import DOC_TEMPLATE, format_docs
from replug_jax.retrieval.index import read_meta
from replug_jax.retrieval.refresh import IndexRefresher
from tests.index_files import saved_versions
from replug_jax.train import loop
from replug_jax.train import step as train_step_lib
from replug_jax.train.checkpoint import CORRUPT_DIR, Checkpointer
from replug_jax.train.lm_cache import LMScoreCache
from replug_jax.train.batch import FrozenDocumentVectors, make_batch, supervise
from replug_jax.train.loop import LSRSettings, train_lsr
from replug_jax.train.metrics import read_metrics

from tests import hf_tiny, lsr_tiny_run

TINY = lsr_tiny_run.SETTINGS  # k=3, batch 8, 32 / 56 encoder tokens, ... (as the kill-and-resume run)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    hf_tiny.tiny_bert(str(root / "enc"))
    hf_tiny.tiny_gpt2(str(root / "lm"), positions=256)
    encoder, lm, store, index, examples = lsr_tiny_run.load(str(root), str(root / "setup"))
    return dict(models=str(root), encoder=encoder, lm=lm, store=store, index=index, examples=examples)


def pair_logprobs(context: str, continuation: str) -> np.ndarray:
    """Per-token "log-probabilities" that are a known function of the (context, continuation) pair, for
    2-10 "tokens" that depend on the continuation (so that "mean" is not "sum" divided by a constant)."""
    digest = lambda text: int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    tokens = 2 + digest(continuation) % 9
    return -np.random.default_rng(digest(f"{context}\0{continuation}")).uniform(0.1, 5.0, tokens).astype(np.float32)


class PairLM:
    """A black-box LM whose score of a pair is `pair_logprobs(tag + context, continuation)`."""

    def __init__(self, name="pair-lm", fingerprint="pair-lm/1", tag=""):
        self.name, self._fingerprint, self.tag, self.pairs = name, fingerprint, tag, 0

    def fingerprint(self):
        return self._fingerprint

    def score(self, contexts, continuations, progress=False):
        self.pairs += len(contexts)
        return [pair_logprobs(self.tag + c, y) for c, y in zip(contexts, continuations)]


def reduce(logprobs, lm_score):
    total = float(np.sum(logprobs, dtype=np.float64))
    return total / len(logprobs) if lm_score == "mean" else total


# ---- 1. LM scores in a batch belong to their (query, document) pair ----

@pytest.mark.parametrize("lm_score", ["sum", "mean"])
def test_supervision_and_batch_slots_belong_to_their_pair(tiny, tmp_path, lm_score):
    store, examples, encoder = tiny["store"], tiny["examples"], tiny["encoder"]
    rng = np.random.default_rng(7)
    batch_examples = [examples[i] for i in rng.permutation(len(examples))[:5]]  # shuffled, not in dataset order
    rows = np.stack([rng.choice(len(store), 4, replace=False) for _ in batch_examples]).astype(np.int64)
    rows[0, 1] = rows[2, 0] = rows[2, 3] = -1  # empty slots among documents
    rows[4, :] = -1  # a query without any document
    rows[3, 2] = rows[1, 0]  # the same document retrieved for two queries
    template = "<{title}> {text} |"
    lm = PairLM()
    cache = LMScoreCache(str(tmp_path / "cache.sqlite"), lm)
    scores = supervise(cache, store, batch_examples, rows, lm_score=lm_score, doc_template=template)

    expected = np.zeros(rows.shape)
    for i, example in enumerate(batch_examples):
        for j, r in enumerate(rows[i]):
            if r >= 0:
                context = template.format(title=store.titles[r], text=store.texts[r]) + example.query
                expected[i, j] = reduce(pair_logprobs(context, example.continuation), lm_score)
    assert scores.shape == rows.shape and scores.dtype == np.float32
    np.testing.assert_allclose(scores, expected, rtol=1e-6)
    assert len(set(expected[rows >= 0].tolist())) == (rows >= 0).sum()  # every pair scores differently
    assert len({len(pair_logprobs("", e.continuation)) for e in batch_examples}) > 1  # token counts differ
    assert lm.pairs == (rows >= 0).sum() and cache.misses == lm.pairs

    # the same pairs in another batch order come from the cache, each still in its own slot
    order = [3, 0, 4, 2, 1]
    again = supervise(cache, store, [batch_examples[i] for i in order], rows[order], lm_score=lm_score,
                      doc_template=template)
    np.testing.assert_allclose(again, expected[order], rtol=1e-6)
    assert lm.pairs == cache.misses == (rows >= 0).sum() and cache.hits == (rows >= 0).sum()

    # the batch of the jitted step: slot [i, j] holds the tokens of datastore row rows[i, j] and its score
    batch = make_batch(encoder, store, batch_examples, rows, scores, query_max_tokens=32, doc_max_tokens=56)
    b, k = rows.shape
    assert batch["doc_ids"].shape[:2] == batch["lm_scores"].shape == batch["doc_valid"].shape == (b, k)
    np.testing.assert_array_equal(batch["doc_valid"], rows >= 0)
    np.testing.assert_allclose(batch["lm_scores"], np.where(rows >= 0, expected, 0.0), rtol=1e-6)
    query_ids, query_mask = encoder.padded([e.query for e in batch_examples], 32)
    np.testing.assert_array_equal(batch["query_ids"], query_ids)
    np.testing.assert_array_equal(batch["query_mask"], query_mask)
    for i in range(b):
        for j in range(k):
            if rows[i, j] >= 0:
                ids, mask = encoder.padded([store.texts[rows[i, j]]], 56)
                np.testing.assert_array_equal(batch["doc_ids"][i, j], ids[0])
                np.testing.assert_array_equal(batch["doc_mask_tokens"][i, j], mask[0])
    valid = batch["doc_ids"][rows >= 0]
    assert len({v.tobytes() for v in valid}) == len(set(rows[rows >= 0].tolist()))  # distinct rows, distinct tokens


def test_supervision_matches_direct_scores_of_the_real_lm(tiny, tmp_path):
    store, lm = tiny["store"], tiny["lm"]
    batch_examples = [tiny["examples"][i] for i in (5, 0, 3)]
    rows = np.array([[4, -1, 9], [17, 2, -1], [-1, 11, 4]])
    cache = LMScoreCache(str(tmp_path / "cache.sqlite"), lm)
    direct = {}
    for i, example in enumerate(batch_examples):
        for j, r in enumerate(rows[i]):
            if r >= 0:  # one pair per call: nothing to mix up
                direct[i, j] = lm.score([format_docs(store, [r])[0] + example.query], [example.continuation])[0]
    for lm_score in ("sum", "mean"):
        scores = supervise(cache, store, batch_examples, rows, lm_score=lm_score)
        expected = np.zeros(rows.shape)
        for (i, j), logprobs in direct.items():
            expected[i, j] = reduce(logprobs, lm_score)
        np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    assert cache.misses == len(direct) and cache.hits == len(direct)  # "mean" reused the cached sums


def test_question_target_on_text_windows_scores_the_query_context_after_each_document(tiny, tmp_path):
    """lsr_target="question" on text windows (issue 37, item 3): ℓ[i, j] = Σ_t log p(x_t | d_j, x_<t) with x the
    window's query context, from the real LM's own pass d ∘ x; the continuation y is never read."""
    store, lm = tiny["store"], tiny["lm"]
    windows = [tiny["examples"][i] for i in (1, 4)]
    rows = np.array([[3, -1, 8], [12, 0, 5]])
    scores = supervise(LMScoreCache(str(tmp_path / "cache.sqlite"), lm), store, windows, rows, target="question")
    expected = np.zeros(rows.shape)
    for i, window in enumerate(windows):
        for j, r in enumerate(rows[i]):
            if r >= 0:
                x_after_d = lm.score(format_docs(store, [r]), [window.query])[0]  # one pass, nothing else in it
                expected[i, j] = np.sum(x_after_d, dtype=np.float64)
    assert all(window.prompt is None and window.continuation for window in windows)  # x is the query context
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    assert len(set(np.round(expected[rows >= 0], 4).tolist())) == (rows >= 0).sum()  # the document matters


# ---- 2. queries are embedded with the current parameters ----

def host_copy(tree):
    return jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(tree))


def same_tree(a, b):
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# One run of train_lsr serves this test and test 6: refreshes every 2 steps (versions 1-5 requested after steps
# 2, 4, ..., 10, each swapped in a step later), a checkpoint due every 5 steps: step 5 (index version 2), and
# step 10 deferred past the pending refresh to step 11 (version 5). No warmup: every step changes the parameters.
CORRUPT_RUN = dict(TINY, steps=11, refresh_every=2, swap_after=1, checkpoint_every=5, keep_checkpoints=2,
                   warmup_fraction=0.0)
EXPECTED_VERSIONS = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5]  # serving steps 1..11


def train(tiny, workdir, settings):
    return train_lsr(tiny["encoder"], tiny["lm"], tiny["store"], tiny["examples"], workdir, settings,
                     initial_index=tiny["index"], progress=False)


@pytest.fixture(scope="module")
def first_run(tiny, tmp_path_factory):
    """train_lsr for CORRUPT_RUN, recording the parameters each step embeds its queries with and each step returns."""
    encoder, queries = tiny["encoder"], {e.query for e in tiny["examples"]}
    embedded_with, after_step = [], []
    embed, make_train_step = encoder.embed, train_step_lib.make_train_step

    def spy_embed(texts, progress=False, params=None):
        if set(texts) <= queries:  # the loop's query embedding (index builds embed datastore chunks)
            embedded_with.append(None if params is None else host_copy(params))
        return embed(texts, progress=progress, params=params)

    def spy_make_train_step(*args, **kwargs):
        step_fn = make_train_step(*args, **kwargs)

        def spy_step(state, batch):
            state, metrics = step_fn(state, batch)
            after_step.append(host_copy(state["params"]))
            return state, metrics

        return spy_step

    workdir = str(tmp_path_factory.mktemp("lsr") / "run")
    initial = host_copy(encoder.params)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(encoder, "embed", spy_embed)
        patch.setattr(train_step_lib, "make_train_step", spy_make_train_step)
        out = train(tiny, workdir, LSRSettings(**CORRUPT_RUN))
    return dict(workdir=workdir, out=out, initial=initial, embedded_with=embedded_with, after_step=after_step)


def test_queries_are_embedded_with_the_current_parameters(tiny, first_run):
    embedded_with, after_step, initial = first_run["embedded_with"], first_run["after_step"], first_run["initial"]
    steps = CORRUPT_RUN["steps"]
    assert len(embedded_with) == len(after_step) == steps
    assert all(p is not None for p in embedded_with)
    assert same_tree(embedded_with[0], initial)  # step 1: the initial parameters
    for t in range(1, steps):  # step t + 1: the parameters step t returned, which differ from every earlier one
        assert same_tree(embedded_with[t], after_step[t - 1]), f"step {t + 1} embedded its queries with stale params"
        assert not same_tree(after_step[t - 1], initial)
        assert t == 1 or not same_tree(after_step[t - 1], after_step[t - 2])
    assert same_tree(host_copy(first_run["out"]["params"]), after_step[-1])
    assert same_tree(host_copy(tiny["encoder"].params), initial)  # the encoder's own weights are left alone


# ---- 2b. query-side-only training, and one truncation for retrieval and the train step ----

def test_step_scores_are_the_retrieval_scores_full_and_query_side(tiny):
    """With token lengths 0 (the encoder's own), the step's scores at the index's parameters equal the scores
    that retrieved the documents, for a full batch and a query-side batch (document vectors from the index's
    encoder); shorter fixed lengths truncate differently from retrieval and do not."""
    encoder, store, examples, index = tiny["encoder"], tiny["store"], tiny["examples"][:4], tiny["index"]
    retrieved, rows = index.search(encoder.embed([e.query for e in examples]), 3)  # [4, 3]
    lm_scores = np.zeros(rows.shape, np.float32)
    full = make_batch(encoder, store, examples, rows, lm_scores, query_max_tokens=0, doc_max_tokens=0)
    query_side = make_batch(encoder, store, examples, rows, lm_scores, query_max_tokens=0, doc_max_tokens=0,
                            doc_vectors=FrozenDocumentVectors(index))
    assert "doc_ids" not in query_side and query_side["doc_embeddings"].shape == (4, 3, encoder.dim)
    step_scores = jax.jit(lambda params, batch: train_step_lib.retrieval_scores(params, encoder.config, batch))
    for batch in (full, query_side):
        scores, valid = step_scores(encoder.params, batch)
        assert valid.all()
        np.testing.assert_allclose(scores, retrieved, atol=2e-5)
    short = make_batch(encoder, store, examples, rows, lm_scores, query_max_tokens=8, doc_max_tokens=12)
    scores, _ = step_scores(encoder.params, short)
    assert np.abs(np.asarray(scores) - retrieved).max() > 1e-2

    # the query-side loss has no document path: its gradient is the full gradient with the documents held fixed
    loss_fn = train_step_lib.make_loss_fn(encoder.config, gamma=0.1, beta=1.0)
    grad = jax.jit(jax.grad(lambda params, batch: loss_fn(params, batch)[0]))  # compiled: eager grads take minutes
    lm_batch = lambda b: {**b, "lm_scores": np.random.default_rng(0).normal(size=rows.shape).astype(np.float32)}
    g_query = grad(encoder.params, lm_batch(query_side))
    g_full = grad(encoder.params, lm_batch(full))
    leaves = lambda g: np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
    assert np.linalg.norm(leaves(g_query)) > 0
    assert np.linalg.norm(leaves(g_full) - leaves(g_query)) > 1e-3 * np.linalg.norm(leaves(g_full))


def test_query_side_only_run_trains_queries_and_never_refreshes(tiny, tmp_path):
    settings = LSRSettings(**dict(TINY, steps=4, refresh_every=2, swap_after=1, warmup_fraction=0.0, lm_score="mean",
                                  train_documents=False))
    initial = host_copy(tiny["encoder"].params)
    workdir = str(tmp_path / "run")
    out = train(tiny, workdir, settings)
    rows = read_metrics(workdir)
    assert [m["index_version"] for m in rows] == [0, 0, 0, 0] and out["stats"]["refreshes"] == 0
    assert saved_versions(os.path.join(workdir, "indexes")) == [0]  # nothing re-embedded
    assert all(np.isfinite(m["loss"]) for m in rows) and not same_tree(host_copy(out["params"]), initial)
    assert same_tree(host_copy(tiny["encoder"].params), initial)


# ---- 2c. the pipelined loop ----

class SynchronousExecutor:
    """ThreadPoolExecutor's interface, running each task at submit: the pipelined schedule without a thread."""

    def __init__(self, *args, **kwargs):
        pass

    def submit(self, fn, *args):
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args))
        except BaseException as error:  # noqa: BLE001 (handed to the caller, as a thread's future would)
            future.set_exception(error)
        return future

    def shutdown(self, wait=True, cancel_futures=False):
        pass


PIPELINED = dict(TINY, steps=6, refresh_every=3, swap_after=1, checkpoint_every=2, keep_checkpoints=3,
                 warmup_fraction=0.0, pipeline=True)


class Crash(Exception):
    pass


def spied_run(tiny, workdir, settings, crash_at_step=None):
    """train_lsr recording the parameters each query embedding used and each step returned."""
    encoder, queries = tiny["encoder"], {e.query for e in tiny["examples"]}
    embedded_with, after_step = [], []
    embed, make_train_step = encoder.embed, train_step_lib.make_train_step

    def spy_embed(texts, progress=False, params=None):
        if set(texts) <= queries:
            embedded_with.append(host_copy(params))
        return embed(texts, progress=progress, params=params)

    def spy_make_train_step(*args, **kwargs):
        step_fn = make_train_step(*args, **kwargs)

        def spy_step(state, batch):
            if len(after_step) + 1 == crash_at_step:
                raise Crash(f"killed at step {crash_at_step}")
            state, metrics = step_fn(state, batch)
            after_step.append(host_copy(state["params"]))
            return state, metrics

        return spy_step

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(encoder, "embed", spy_embed)
        patch.setattr(train_step_lib, "make_train_step", spy_make_train_step)
        out = train(tiny, workdir, LSRSettings(**settings))
    return out, embedded_with, after_step


def test_pipelined_loop_retrieves_one_step_stale_deterministically_and_resumes(tiny, tmp_path, monkeypatch):
    initial = host_copy(tiny["encoder"].params)
    out, embedded_with, after_step = spied_run(tiny, str(tmp_path / "threaded"), PIPELINED)
    steps = PIPELINED["steps"]
    assert len(embedded_with) == len(after_step) == steps
    # steps 1 and 2 retrieve with the initial parameters; step t + 1 with those before step t
    assert same_tree(embedded_with[0], initial) and same_tree(embedded_with[1], initial)
    for t in range(2, steps):
        assert same_tree(embedded_with[t], after_step[t - 2]), f"step {t + 1} did not retrieve with step {t - 1}'s"
        assert not same_tree(embedded_with[t], after_step[t - 1])
    threaded = read_metrics(str(tmp_path / "threaded"))
    assert [m["index_version"] for m in threaded] == [0, 0, 0, 1, 1, 1]  # refreshed after step 3, served from 4
    assert all(m["lm_seconds"] >= 0 and m["wait_seconds"] >= 0 for m in threaded)

    # the same schedule without the thread: the same losses and parameters
    monkeypatch.setattr(loop, "ThreadPoolExecutor", SynchronousExecutor)
    serial_out, _, _ = spied_run(tiny, str(tmp_path / "synchronous"), PIPELINED)
    serial = read_metrics(str(tmp_path / "synchronous"))
    np.testing.assert_allclose([m["loss"] for m in serial], [m["loss"] for m in threaded], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(host_copy(serial_out["params"])), jax.tree.leaves(host_copy(out["params"]))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    monkeypatch.undo()

    # killed during step 5, restarted: resumes from step 4 with the rows step 5 had retrieved, to the same end
    killed = str(tmp_path / "killed")
    with pytest.raises(Crash):
        spied_run(tiny, killed, PIPELINED, crash_at_step=5)
    assert Checkpointer(os.path.join(killed, "checkpoints")).all_steps() == [2, 4]
    resumed_out, resumed_embedded, _ = spied_run(tiny, killed, PIPELINED)
    assert len(resumed_embedded) == 1  # step 5's rows came from the checkpoint; step 6 retrieved (with step 4's)
    assert same_tree(resumed_embedded[0], after_step[3])
    resumed = read_metrics(killed)
    assert [m["step"] for m in resumed] == list(range(1, steps + 1))
    np.testing.assert_allclose([m["loss"] for m in resumed], [m["loss"] for m in threaded], rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(host_copy(resumed_out["params"])), jax.tree.leaves(host_copy(out["params"]))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# ---- 3. settings: validation, and index versions kept for every kept checkpoint ----

POSITIVE_INTS = ("k", "steps", "batch_size", "refresh_every", "checkpoint_every", "keep_checkpoints", "log_every")
INVALID = ([(name, {name: value}) for name in POSITIVE_INTS for value in (0, -1)]
           + [(name, {name: -1}) for name in ("query_max_tokens", "doc_max_tokens")]  # 0: the encoder's own
           + [(name, {name: value}) for name in ("learning_rate", "gamma", "beta") for value in (0.0, -0.1, math.nan)]
           + [("lm_score", {"lm_score": "max"}), ("lm_score", {"lm_score": "SUM"}),
              ("direction", {"direction": "kl"}), ("metric", {"metric": "l2"}),
              ("embedding_dtype", {"embedding_dtype": "bfloat16"}),
              ("swap_after", {"refresh_every": 3, "swap_after": 3}), ("swap_after", {"refresh_every": 3, "swap_after": 7}),
              ("swap_after", {"swap_after": -1}), ("warmup_fraction", {"warmup_fraction": 1.0}),
              ("warmup_fraction", {"warmup_fraction": -0.1}), ("doc_template", {"doc_template": "{title}\n"})]
           + [("clip_norm", {"clip_norm": value}) for value in (0.0, -1.0)])


@pytest.mark.parametrize("field,values", INVALID, ids=[f"{c[0]}={list(c[1].values())[-1]}" for c in INVALID])
def test_invalid_settings_raise_naming_the_field(field, values):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        LSRSettings(**values)


def test_valid_settings_boundaries():
    LSRSettings()  # the paper's defaults
    LSRSettings(refresh_every=3, swap_after=2, warmup_fraction=0.0, lm_score="mean", direction="q_pr", metric="ip",
                embedding_dtype="float16", doc_template="{text}")
    LSRSettings(refresh_every=1, swap_after=0, k=1, steps=1, batch_size=1, keep_checkpoints=1)


def run_schedule(s: LSRSettings, keep: int):
    """The index versions and checkpoints of train_lsr, as its loop and IndexRefresher document them,
    with `keep` saved versions: yields (step, serving index version, kept checkpoints [(step, index version)],
    versions on disk) after every step, i.e. what a run killed during the next step leaves behind."""
    serving, pending, saved, due = 0, None, [], False
    disk = {0}  # the initial index (adopted as version 0)
    for step in range(1, s.steps + 1):
        if pending is not None and step >= pending[1]:  # maybe_swap at the start of the step
            serving, pending = pending[0], None
        if step % s.refresh_every == 0 and step + max(s.swap_after, 1) <= s.steps:  # request after the train step
            pending = (serving + 1, step + s.swap_after)
            disk.add(serving + 1)  # saved by the build thread (at worst before the run is killed)
            disk -= {v for v in sorted(disk)[:-keep] if v not in (serving, serving + 1)}  # IndexRefresher._prune
        due = due or step % s.checkpoint_every == 0 or step == s.steps
        if due and (pending is None or step == s.steps):  # checkpoints wait until no refresh is pending
            saved.append((step, serving))
            due = False
        yield step, serving, saved[-s.keep_checkpoints:], set(disk)


def missing_versions(s: LSRSettings, keep: int):
    """[(step killed after, checkpoint step, its index version)] of checkpoints whose index is gone."""
    return [(step, c, v) for step, _, kept, disk in run_schedule(s, keep) for c, v in kept if v not in disk]


def grid(keep_checkpoints):
    return [LSRSettings(steps=40, refresh_every=r, swap_after=a, checkpoint_every=c, keep_checkpoints=n)
            for r in range(1, 7) for a in range(r) for c in range(1, 9) for n in keep_checkpoints]


GRID = grid(range(1, 4))


def describe(s: LSRSettings) -> str:
    return (f"refresh_every={s.refresh_every} swap_after={s.swap_after} checkpoint_every={s.checkpoint_every} "
            f"keep_checkpoints={s.keep_checkpoints}: keeps {s.index_versions_to_keep()} versions")


LATE_REFRESH = dict(TINY, steps=7, refresh_every=3, swap_after=2, checkpoint_every=2, keep_checkpoints=3,
                    warmup_fraction=0.0)  # the step-6 refresh would swap at step 8: not requested


def test_the_schedule_simulation_is_the_real_loop(tiny, first_run, tmp_path):
    """run_schedule (the grid below checks thousands of settings with it) against train_lsr itself: per step the
    serving index version, and at the end the kept checkpoints and the index versions on disk."""
    late = str(tmp_path / "late")
    train(tiny, late, LSRSettings(**LATE_REFRESH))
    for values, workdir in ((CORRUPT_RUN, first_run["workdir"]), (LATE_REFRESH, late)):
        s = LSRSettings(**values)
        simulated = list(run_schedule(s, s.index_versions_to_keep()))
        assert [m["index_version"] for m in read_metrics(workdir)] == [serving for _, serving, _, _ in simulated]
        assert Checkpointer(os.path.join(workdir, "checkpoints")).all_steps() == [c for c, _ in simulated[-1][2]]
        assert set(saved_versions(os.path.join(workdir, "indexes"))) == simulated[-1][3]
    assert Checkpointer(os.path.join(late, "checkpoints")).all_steps()[-1] == 7  # the final checkpoint, always


def test_index_versions_to_keep_covers_every_kept_checkpoint():
    for s in GRID:
        assert not missing_versions(s, s.index_versions_to_keep()), describe(s)
    # the schedule of the run below (checkpoints deferred past pending refreshes included) is what it simulates
    s = LSRSettings(**CORRUPT_RUN)
    run = list(run_schedule(s, s.index_versions_to_keep()))
    assert [serving for _, serving, _, _ in run] == EXPECTED_VERSIONS
    assert run[-1][2:] == ([(5, 2), (11, 5)], {0, 1, 2, 3, 4, 5})
    tiny_run = LSRSettings(**lsr_tiny_run.SETTINGS, steps=9)  # the kill-and-resume run of test_lsr_train.py
    assert [serving for _, serving, _, _ in run_schedule(tiny_run, 2)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # the old rule, keep_checkpoints + 1 versions, loses the index of older checkpoints
    assert missing_versions(s, s.keep_checkpoints + 1)[-1] == (11, 5, 2)
    assert sum(bool(missing_versions(g, g.keep_checkpoints + 1)) for g in GRID) > len(GRID) // 4


# Checkpoints due while a refresh is pending are deferred to its swap, and several dues then make one
# checkpoint (checkpoint_every <= swap_after, or swap_after=0 with checkpoint_every=1): the kept checkpoints
# span up to keep_checkpoints * (checkpoint_every + max(swap_after, 1)) steps, more than the
# keep_checkpoints * checkpoint_every + 2 * swap_after that index_versions_to_keep() once assumed.
COALESCED = [LSRSettings(steps=40, refresh_every=r, swap_after=a, checkpoint_every=c, keep_checkpoints=n)
             for r, a, c, n in [(2, 0, 1, 4), (2, 1, 1, 6), (3, 2, 1, 5), (4, 2, 2, 6), (4, 3, 1, 5)]]


@pytest.mark.parametrize("s", COALESCED, ids=[describe(s).split(":")[0].replace(" ", ",") for s in COALESCED])
def test_index_versions_to_keep_when_deferred_checkpoints_coalesce(s):
    missing = missing_versions(s, s.index_versions_to_keep())
    assert not missing, f"{describe(s)}; (killed after step, checkpoint step, its lost index version): {missing[:3]}"


# ---- 4. the LM score cache key ----

class CountingLM(PairLM):
    """The name and fingerprint of a real LM; fake scores (depending on `tag`), counted."""

    def __init__(self, lm, tag):
        super().__init__(name=lm.name, tag=tag)
        self.lm = lm

    def fingerprint(self):
        return self.lm.fingerprint()


def test_cache_entries_are_keyed_by_lm_weights_dtype_window_and_template(tiny, tmp_path):
    lm, store, examples = tiny["lm"], tiny["store"], tiny["examples"]
    contexts_for = lambda template: [t + e.query for t, e in zip(format_docs(store, [1, 2, 3, 4], template), examples)]
    continuations = [e.continuation for e in examples[:4]]
    path = str(tmp_path / "cache.sqlite")
    params = jax.device_get(lm.params)
    noise = np.random.default_rng(0)
    other_weights = jax.tree.map(lambda a: a + 0.01 * noise.standard_normal(a.shape).astype(a.dtype), params)
    variant = lambda p=params, **kw: LocalLM(lm.config, p, lm.tokenizer, **{"name": lm.name, "batch_size": 8, **kw})

    def score(model, tag, template=DOC_TEMPLATE):
        counting = CountingLM(model, tag)
        cache = LMScoreCache(path, counting)  # the template reaches the key through the contexts it formats
        sums, counts = cache.score(contexts_for(template), continuations)
        cache.close()
        return (cache.hits, cache.misses), sums

    expected = lambda tag, template=DOC_TEMPLATE: np.array([pair_logprobs(tag + c, y).sum()
                                                             for c, y in zip(contexts_for(template), continuations)])
    assert score(lm, "a")[0] == (0, 4)
    for name, model, template in [("same LM", lm, DOC_TEMPLATE),
                                  ("same weights, reloaded", rj.load_lm(os.path.join(tiny["models"], "lm")), DOC_TEMPLATE),
                                  ("same weights, rebuilt", variant(), DOC_TEMPLATE)]:
        counts, sums = score(model, "b", template)
        assert counts == (4, 0), name
        np.testing.assert_allclose(sums, expected("a"), rtol=1e-6)  # the first LM's entries
    for tag, (name, model, template) in enumerate([
            ("other weights, same name", variant(other_weights), DOC_TEMPLATE),
            ("bfloat16", variant(dtype=jnp.bfloat16), DOC_TEMPLATE),
            ("shorter window", variant(max_length=128), DOC_TEMPLATE),
            ("other name", variant(name="other-lm"), DOC_TEMPLATE),
            ("other document template", lm, "{text}\n")]):
        assert model.name == lm.name or name == "other name"
        counts, sums = score(model, f"v{tag}", template)
        assert counts == (0, 4), f"{name} hit the cache of another LM"
        np.testing.assert_allclose(sums, expected(f"v{tag}", template), rtol=1e-6)
    counts, sums = score(lm, "c")  # nothing overwrote the first LM's entries
    assert counts == (4, 0)
    np.testing.assert_allclose(sums, expected("a"), rtol=1e-6)


def truncate_state_data(step_dir):
    """Cut every OCDBT data file of a checkpoint's state in half. (tests/test_checkpoint.py cuts only the largest
    file: for this state, replicated over 8 devices, that is a top-level OCDBT file whose second half the restore
    does not read, so the checkpoint still restores, checksums and all.)"""
    files = [os.path.join(folder, name) for folder, _, names in os.walk(os.path.join(step_dir, "state"))
             if os.path.basename(folder) == "d" for name in names]
    assert files
    for path in files:
        os.truncate(path, os.path.getsize(path) // 2)


# (5. the exact index versions of the kill-and-resume run: tests/test_lsr_train.py)

# ---- 6. a corrupt newest checkpoint falls back to an older one and finds its index ----

@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax, as in test_checkpoint
def test_corrupt_newest_checkpoint_falls_back_to_an_older_one_and_its_index(tiny, first_run, tmp_path, monkeypatch):
    settings = LSRSettings(**CORRUPT_RUN)
    workdir = str(tmp_path / "run")
    shutil.copytree(first_run["workdir"], workdir)
    first = read_metrics(workdir)
    assert [m["step"] for m in first] == list(range(1, 12))
    assert [m["index_version"] for m in first] == EXPECTED_VERSIONS
    checkpoints = os.path.join(workdir, "checkpoints")
    assert Checkpointer(checkpoints).all_steps() == [5, 11]
    indexes = os.path.join(workdir, "indexes")
    assert saved_versions(indexes) == [0, 1, 2, 3, 4, 5] and settings.index_versions_to_keep() >= 6

    # the old rule (keep_checkpoints + 1 saved versions) would have deleted version 2, named by step 5
    old_rule = str(tmp_path / "old_rule")
    shutil.copytree(indexes, old_rule)
    refresher = IndexRefresher(tiny["encoder"], tiny["store"], workdir=old_rule, keep=settings.keep_checkpoints + 1)
    refresher._prune(5)
    assert saved_versions(old_rule) == [3, 4, 5]
    with pytest.raises(FileNotFoundError):
        refresher.load_version(2)

    truncate_state_data(os.path.join(checkpoints, "11"))
    loaded = []
    load_version = IndexRefresher.load_version
    monkeypatch.setattr(IndexRefresher, "load_version",
                        lambda self, version, *a, **k: loaded.append(version) or load_version(self, version, *a, **k))
    with pytest.warns(RuntimeWarning, match="checkpoint step 11 .* restored step 5"):
        out = train(tiny, workdir, settings)
    assert loaded == [2]  # the index version step 5 names
    assert out["steps"] == 11 and out["index_version"] == 5
    resumed = read_metrics(workdir)
    assert [m["step"] for m in resumed] == list(range(1, 12))
    assert [m["index_version"] for m in resumed] == EXPECTED_VERSIONS
    # steps 6-11 again, from step 5's parameters, data position and index: the same losses as the first time
    np.testing.assert_allclose([m["loss"] for m in resumed], [m["loss"] for m in first], rtol=1e-5, atol=1e-7)
    assert resumed[-1]["cache_hits"] > 0
    assert Checkpointer(checkpoints).all_steps() == [5, 11]
    assert os.listdir(os.path.join(checkpoints, CORRUPT_DIR))[0].startswith("11-")
    for a, b in zip(jax.tree.leaves(host_copy(out["params"])), jax.tree.leaves(host_copy(first_run["out"]["params"]))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# ---- 7. the LSR job end to end ----

def write_jsonl(path, documents):
    with open(path, "w") as f:
        for d in documents:
            f.write(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n")


def test_lsr_job_end_to_end(tiny, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "corpus.jsonl", lsr_tiny_run.documents("c", 6, seed=1))
    write_jsonl(data / "train.jsonl", lsr_tiny_run.documents("t", 3, seed=2))
    write_jsonl(data / "heldout.jsonl", lsr_tiny_run.documents("h", 2, seed=3))
    config = config_dict.ConfigDict(dict(
        job="lsr", corpus=str(data / "corpus.jsonl"), eval_data=str(data / "heldout.jsonl"),
        train_data=str(data / "train.jsonl"), encoder=os.path.join(tiny["models"], "enc"),
        lm=os.path.join(tiny["models"], "lm"), k=3, eval_k=2, k_sweep=(1, 2), temperature=1.0, bm25_temperature=1.0,
        doc_tokens=48, query_tokens=16, context_tokens=16, stride_tokens=24, max_eval_docs=2, max_windows_per_doc=2,
        methods=("replug",), metric="cosine", index_factory="Flat", embedding_dtype="float32", lm_batch_size=8,
        lm_max_length=0, encoder_batch_size=8, seed=0, dtype="float32",
        steps=2, batch_size=8, learning_rate=3e-3, warmup_fraction=0.0, clip_norm=1.0, gamma=0.1, beta=0.1,
        direction="pr_q", lm_score="mean", refresh_every=2, swap_after=1, train_query_tokens=24,
        train_continuation_tokens=16, max_train_examples=16, query_max_tokens=32, doc_max_tokens=56,
        checkpoint_every=2, keep_checkpoints=2, log_every=1))
    settings = LSRSettings.from_mapping(config)
    assert (settings.steps, settings.lm_score, settings.refresh_every, settings.k) == (2, "mean", 2, 3)
    workdir = str(tmp_path / "job")
    results = run_lsr(config, workdir)
    saved = json.load(open(os.path.join(workdir, "results.json")))
    for method in ("none", "replug", "replug_lsr"):
        assert np.isfinite(saved["perplexity"][method]) and np.isfinite(saved["bits_per_byte"][method]), method
    assert saved["perplexity"] == pytest.approx(results["perplexity"])
    # the trained retriever weighs (or ranks) the documents differently from the initial one
    assert saved["perplexity"]["replug_lsr"] != saved["perplexity"]["replug"]
    lsr = saved["lsr"]
    assert {key: lsr[key] for key in ("steps", "batch_size", "k", "refresh_every", "direction", "train_documents")} == \
        {"steps": 2, "batch_size": 8, "k": 3, "refresh_every": 2, "direction": "pr_q", "train_documents": True}
    assert lsr["learning_rate"] == pytest.approx(3e-3) and lsr["gamma"] == lsr["beta"] == pytest.approx(0.1)
    assert lsr["training_examples"] == 16 and lsr["refreshes"] == 0  # none is requested after the last step
    assert lsr["cache_misses"] > 0
    rows = read_metrics(os.path.join(workdir, "lsr"))
    assert [m["step"] for m in rows] == [1, 2] and [m["index_version"] for m in rows] == [0, 0]
    assert all(np.isfinite(m["loss"]) for m in rows)
    # the trained retriever's index: over the same datastore, under other weights than the initial index
    lsr_meta, initial_meta = read_meta(os.path.join(workdir, "index_lsr")), read_meta(os.path.join(workdir, "index_dense"))
    assert lsr_meta["datastore"] == initial_meta["datastore"] and lsr_meta["encoder"] != initial_meta["encoder"]
    assert saved_versions(os.path.join(workdir, "lsr", "indexes")) == [0]  # the evaluation's index, adopted
    assert Checkpointer(os.path.join(workdir, "lsr", "checkpoints")).all_steps() == [2]
    # both τ = config.temperature and τ = γ are reported for REPLUG and REPLUG LSR
    for method in ("replug", "replug_lsr"):
        assert set(saved["temperature_sweep"][method]) == {"0.1", "1.0"}
    assert saved["perplexity"]["replug_lsr"] == pytest.approx(saved["temperature_sweep"]["replug_lsr"]["1.0"]["perplexity"])

    # query side only, evaluated at τ = γ: the trained query encoder searches the original index
    config.update(train_documents=False, lsr_temperature=0.1)
    query_side = str(tmp_path / "query_side")
    saved = run_lsr(config, query_side)
    assert not os.path.exists(os.path.join(query_side, "index_lsr")) and saved["lsr"]["train_documents"] is False
    assert saved["temperature"]["replug_lsr"] == 0.1
    assert saved["perplexity"]["replug_lsr"] == pytest.approx(saved["temperature_sweep"]["replug_lsr"]["0.1"]["perplexity"])
    assert saved["perplexity"]["replug_lsr"] != saved["temperature_sweep"]["replug"]["0.1"]["perplexity"]
    trained, train_documents = load_trained_encoder(tiny["encoder"], query_side)
    assert train_documents is False and trained.fingerprint() != tiny["encoder"].fingerprint()
    assert load_trained_encoder(tiny["encoder"], workdir)[1] is True
