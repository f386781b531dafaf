"""REPLUG LSR on question–answer pairs: the training pairs are the QA prompt's own passes, the answer likelihood
equals a hand computation, and the LSR job → QA job flow runs on tiny models (disjointness checked)."""
import json
import os

import numpy as np
import pytest
from ml_collections import config_dict

from replug_jax import workspace
from replug_jax.data import downstream as downstream_data
from replug_jax.data.records import QAExample
from replug_jax.evaluate import qa
from replug_jax.evaluate.answer_nll import answer_nll
from replug_jax.jobs import downstream, lsr
from replug_jax.passages import QA_DOC_TEMPLATE, passage_text, question_block
from replug_jax.retrieval.datastore import Datastore
from replug_jax.train.batch import supervise
from replug_jax.train.data import check_disjoint_questions, qa_training_examples, trains_on_questions
from replug_jax.train.lm_cache import LMScoreCache

from tests import hf_tiny

QUESTIONS = [QAExample("q1", "What gas do plants take in?", ("carbon dioxide", "CO2")),
             QAExample("q2", "What is the hardest natural mineral?", ("diamond",)),
             QAExample("q3", "Which organ pumps blood?", ("the heart",))]
PASSAGES = [("Photosynthesis", "Plants take in carbon dioxide and release oxygen."),
            ("", "Diamond is the hardest natural mineral  known."),
            ("Heart", "The heart pumps blood through the body.")]


class Recording:
    """Delegates `score` to a real LM and records each call's pairs."""

    def __init__(self, inner):
        self.inner, self.calls, self.name = inner, [], inner.name

    def fingerprint(self):
        return self.inner.fingerprint()

    def score(self, contexts, continuations, progress=False):
        self.calls.append((list(contexts), list(continuations)))
        return self.inner.score(contexts, continuations)


def test_qa_training_pairs_are_the_qa_prompts_passes(smollm2, tmp_path):
    examples = qa_training_examples(QUESTIONS, seed=3)
    assert sorted(e.doc_id for e in examples) == ["q1", "q2", "q3"]
    by_id = {e.doc_id: e for e in examples}
    for q in QUESTIONS:  # query: the question; x: its closed-book block; y: the first gold answer, leading space
        e = by_id[q.id]
        assert (e.query, e.lm_prefix, e.continuation) == (q.question, f"Question: {q.question}\nAnswer:",
                                                          f" {q.answers[0]}")
    store = Datastore(ids=["p0", "p1", "p2"], titles=[t for t, _ in PASSAGES], texts=[x for _, x in PASSAGES],
                      sources=["d0", "d1", "d2"])
    rows = np.array([[0, 2], [1, -1], [2, 0]])
    lm = Recording(smollm2)
    cache = LMScoreCache(str(tmp_path / "cache.sqlite"), lm)
    ell = supervise(cache, store, examples, rows, lm_score="sum", doc_template=QA_DOC_TEMPLATE)
    cache.close()
    (contexts, continuations), = lm.calls
    expected = []
    for i, e in enumerate(examples):  # d_k ∘ x is exactly the QA evaluation's pass of passage k
        q = next(q for q in QUESTIONS if q.id == e.doc_id)
        for r in rows[i][rows[i] >= 0]:
            expected.append((question_block(q.question, passage_text(*PASSAGES[r])), e.continuation))
    assert list(zip(contexts, continuations)) == expected
    passes, _ = qa.method_passes([QUESTIONS[0]], [[passage_text(*PASSAGES[0])]], np.zeros((1, 1)), method="replug",
                                 temperature=1.0)
    assert passes[0][0] == question_block(QUESTIONS[0].question, passage_text(*PASSAGES[0]))
    direct = smollm2.score(contexts, continuations)  # ℓ = Σ_t log p(y_t | d ∘ x, y_<t), the LM's own score
    at = 0
    for i in range(len(examples)):
        for j in np.flatnonzero(rows[i] >= 0):
            assert ell[i, j] == pytest.approx(float(np.sum(direct[at])), abs=1e-4)
            at += 1
    assert ell[1, 1] == 0.0


def test_training_questions_must_not_be_evaluated():
    trained = {"ids": ["q1"], "questions": ["What is the hardest  natural mineral"]}
    check_disjoint_questions(trained, [QUESTIONS[2]])
    with pytest.raises(ValueError, match="2 evaluated questions were LSR training questions"):
        check_disjoint_questions(trained, QUESTIONS)  # q1 by id, q2 by its normalised text


def test_answer_nll_is_the_per_token_mixture(smollm2):
    """−log p(answer) under REPLUG's per-token mixture, the best gold answer, by hand in float64."""
    contexts = [["Knowledge: a\nQuestion: x\nAnswer:", "Knowledge: b\nQuestion: x\nAnswer:"], ["Question: y\nAnswer:"]]
    log_w = [np.log(np.array([0.7, 0.3], np.float32)), np.zeros(1, np.float32)]
    answers = [("carbon dioxide", "CO2"), ("diamond",)]
    got = answer_nll(smollm2, contexts, log_w, answers, prefix="Demo.\n\n")
    for q, (ctx, golds) in enumerate(zip(contexts, answers)):
        best = np.inf
        for gold in golds:
            per_pass = [np.asarray(s, np.float64) for s in smollm2.score(["Demo.\n\n" + c for c in ctx],
                                                                         [f" {gold}"] * len(ctx))]
            mixed = np.log(sum(np.exp(float(w)) * np.exp(lp) for w, lp in zip(log_w[q], per_pass)))  # [T]
            best = min(best, -float(mixed.sum()))
        assert got[q] == pytest.approx(best, rel=1e-5, abs=1e-4)


def _jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


@pytest.fixture(scope="module")
def tiny_qa(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa_lsr")
    hf_tiny.tiny_bert(str(root / "enc"))
    hf_tiny.tiny_gpt2(str(root / "lm"), positions=256)
    words = ["river", "mountain", "violin", "bread", "snow", "desert", "ocean", "forest"]
    rng = np.random.default_rng(0)
    corpus = [{"id": f"c{i}", "title": f"T{i}", "text": " ".join(rng.choice(words, 30))} for i in range(8)]
    qas = [{"id": f"q{i}", "question": f"Where is the {words[i % 8]} {i}?", "answers": [words[(i + 3) % 8]]}
           for i in range(20)]
    return {"root": str(root), "corpus": _jsonl(root / "corpus.jsonl", corpus),
            "train": _jsonl(root / "train.jsonl", qas[4:]), "eval": _jsonl(root / "eval.jsonl", qas[:4]),
            "all": _jsonl(root / "all.jsonl", qas)}


def _config(tiny_qa, **overrides):
    c = config_dict.ConfigDict(dict(
        job="lsr", train_data=tiny_qa["train"], corpus=tiny_qa["corpus"], encoder=os.path.join(tiny_qa["root"], "enc"),
        lm=os.path.join(tiny_qa["root"], "lm"), k=3, metric="cosine", index_factory="Flat",
        embedding_dtype="float32", lm_batch_size=8, lm_max_length=0, encoder_batch_size=8, seed=0, dtype="float32",
        doc_tokens=48, steps=2, batch_size=8, learning_rate=3e-3, warmup_fraction=0.0, clip_norm=1.0, gamma=0.1,
        beta=1.0, direction="q_pr", lm_score="sum", train_documents=False, refresh_every=10, swap_after=0,
        query_max_tokens=32, doc_max_tokens=56, checkpoint_every=2, keep_checkpoints=2, log_every=1))
    c.update(overrides)
    return c


def _qa_config(tiny_qa, questions, retriever_workdir, **overrides):
    c = _config(tiny_qa, job="qa", questions=questions, demos="", split="validation", demo_split="validation",
                k=2, shots=1, max_new_tokens=3, max_questions=0, demo_passages="top1", ensemble="replug",
                methods=("none", "replug", "concat", "replug_lsr"), retriever_workdir=retriever_workdir,
                temperature=1.0)
    c.update(overrides)
    return c


def test_qa_lsr_job_then_qa_job(tiny_qa, tmp_path):
    assert trains_on_questions(tiny_qa["train"]) and trains_on_questions("sciq")
    assert not trains_on_questions(tiny_qa["corpus"]) and not trains_on_questions("gensim_wiki")
    workdir = str(tmp_path / "lsr")
    trained = lsr.run_lsr(_config(tiny_qa), workdir)
    assert trained["training_questions"] == 16 and trained["lsr"]["doc_template"] == QA_DOC_TEMPLATE
    assert trained["lsr"]["cache_misses"] > 0
    recorded = json.load(open(os.path.join(workdir, lsr.TRAIN_QUESTIONS)))
    assert sorted(recorded["ids"]) == sorted(f"q{i}" for i in range(4, 20))
    encoder, train_documents = workspace.load_trained_encoder(
        workspace.load_job_encoder(_config(tiny_qa), np.float32), workdir)
    assert train_documents is False

    results = downstream.run_downstream(_qa_config(tiny_qa, tiny_qa["eval"], workdir), str(tmp_path / "qa"))
    assert set(results["answer_nll"]) == {"none", "replug", "concat", "replug_lsr"}
    assert all(np.isfinite(v) and v > 0 for v in results["answer_nll"].values())
    rows = [json.loads(line) for line in open(tmp_path / "qa" / "predictions.jsonl")]
    for m in ("none", "replug_lsr"):
        assert results["answer_nll"][m] == pytest.approx(np.mean([r[m]["answer_nll"] for r in rows]))
    # the trained query encoder ranks differently from the initial one: another mixture, another likelihood
    assert results["answer_nll"]["replug_lsr"] != results["answer_nll"]["replug"]

    with pytest.raises(ValueError, match="were LSR training questions"):  # evaluated ∩ trained is refused
        downstream.run_downstream(_qa_config(tiny_qa, tiny_qa["all"], workdir), str(tmp_path / "qa_all"))


def _pools_experiment():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments", "qa_lsr_pools.py")
    spec = importlib.util.spec_from_file_location("qa_lsr_pools", path)
    pools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pools)
    return pools


def test_pool_metrics_of_the_pools_experiment_equal_a_hand_computation():
    """experiments/qa_lsr_pools.py: REPLUG's answer NLL over the top k by the scores, top-1 accuracy, Spearman and
    the oracle, on two pools worked by hand."""
    import math

    pools = _pools_experiment()
    scores = np.array([[0.9, 0.1, 0.5], [0.2, 0.3, 0.1]])
    ell = np.array([[-2.0, -1.0, -5.0], [-4.0, -3.0, -6.0]])
    got = pools.pool_metrics(scores, ell, k=2, taus=(1.0, 0.5))
    assert got["top1_accuracy"] == 0.5  # pool 0: best score is passage 0, best ℓ passage 1; pool 1: both passage 1
    assert got["spearman"] == pytest.approx((-0.5 + 1.0) / 2)  # ranks (2,0,1) vs (1,2,0): -0.5; identical: 1

    def nll(s, e, tau):  # the top 2 by score, λ = softmax(s / τ) over them, -log Σ λ p(y | d)
        top = sorted(range(3), key=lambda i: -s[i])[:2]
        z = sum(math.exp(s[i] / tau) for i in top)
        return -math.log(sum(math.exp(s[i] / tau) / z * math.exp(e[i]) for i in top))

    for tau in (1.0, 0.5):
        want = np.mean([nll(scores[n], ell[n], tau) for n in range(2)])
        assert got[f"nll_tau{tau:g}"] == pytest.approx(want, rel=1e-12)
    oracle = np.mean([-math.log((math.exp(-1) + math.exp(-2)) / 2), -math.log((math.exp(-3) + math.exp(-4)) / 2)])
    assert pools.oracle_nll(ell, 2) == pytest.approx(oracle, rel=1e-12)


def test_pools_experiment_saves_a_retriever_the_qa_job_reads(tiny_qa, tmp_path):
    """qa_lsr_pools.py --save_retriever: the QA job's replug_lsr method loads the query encoder it saved (query side,
    over the original index) and refuses to evaluate the questions it was trained on."""
    import jax

    config = _config(tiny_qa)
    encoder = workspace.load_job_encoder(config, np.float32)
    trained = jax.tree.map(lambda x: x * 1.5, encoder.params)  # any parameters other than the initial ones
    examples = qa_training_examples(downstream_data.load_qa(tiny_qa["train"], "validation"))
    _pools_experiment().save_retriever(str(tmp_path / "saved"), trained, config, examples, {"gamma": 0.1})
    saved = json.load(open(tmp_path / "saved" / "results.json"))  # qa_lsr.py --trained reads γ there
    assert saved["lsr"]["gamma"] == 0.1 and saved["training_questions"] == len(examples) == 16
    loaded, train_documents = workspace.load_trained_encoder(encoder, str(tmp_path / "saved"))
    assert train_documents is False and loaded.name.endswith("+lsr")
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(trained)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="were LSR training questions"):
        downstream.run_downstream(_qa_config(tiny_qa, tiny_qa["all"], str(tmp_path / "saved")), str(tmp_path / "qa"))
