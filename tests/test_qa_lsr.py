"""REPLUG LSR on question–answer pairs: the training pairs are the QA prompt's own passes, the answer likelihood
equals a hand computation, and the LSR job → QA job flow runs on tiny models (disjointness checked)."""
import json
import os

import numpy as np
import pytest
from ml_collections import config_dict

from replug_jax.jobs import report
from replug_jax.jobs import prepare
from replug_jax.data import question_sets
from replug_jax.data.records import QAExample
from replug_jax.evaluate import qa
from replug_jax.evaluate.answer_nll import answer_nll
from replug_jax.jobs.input_checks import InputError, check_job_inputs
from replug_jax.jobs import downstream, lsr
from replug_jax.method.lsr_loss import lm_log_likelihood
from replug_jax.method.passages import DOC_TEMPLATE, QA_DOC_TEMPLATE, passage_text, question_block
from replug_jax.retrieval.datastore import Datastore, read_jsonl
from replug_jax.retrieval.retriever import excluded_rows
from replug_jax.train.batch import supervise, supervise_targets
from replug_jax.train import loop
from replug_jax.train.queries import (TrainExample, check_disjoint_questions, qa_training_examples,
                                   trained_questions_record, trains_on_questions)
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

    def score_with_query(self, contexts, queries, continuations, progress=False):
        self.calls.append((list(contexts), list(queries), list(continuations)))
        return self.inner.score_with_query(contexts, queries, continuations)


def test_qa_training_pairs_are_the_qa_prompts_passes(smollm2, tmp_path):
    examples = qa_training_examples(QUESTIONS, seed=3)
    assert sorted(e.question_id for e in examples) == ["q1", "q2", "q3"]
    assert all(e.excluded_sources == () for e in examples)  # a question is no datastore document: nothing hidden
    by_id = {e.question_id: e for e in examples}
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
        q = next(q for q in QUESTIONS if q.id == e.question_id)
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


@pytest.mark.parametrize("kind", ["qa", "text"])
def test_question_target_is_the_querys_likelihood_after_each_passage(smollm2, tmp_path, kind):
    """lsr_target="question" (ART): Q = softmax(ℓ / β) with ℓ_k = Σ_t log p(x_t | d_k, x_<t), x the query as it
    follows the passage (QA: the question block after "Knowledge: ...\\n"; text windows: the window after the
    document), by hand in float64 from separate LM calls; one pass per pair with an empty continuation, no answer
    read, and no pair scored twice (mean: divided by x's token count). QA: `lm.score(d_k, x)` (the template ends in
    a newline, so x scored as a continuation has the same tokens). Text windows: the tokens of d_k ∘ x as one text,
    as the answer target's pass reads them, x's being those from its first character ("\\n\\n" + "Leaves" is not
    the "\\n\\n" token then "Leaves": `lm.score(d_k, x)` would score another context)."""
    store = Datastore(ids=["p0", "p1", "p2"], titles=[t for t, _ in PASSAGES], texts=[x for _, x in PASSAGES],
                      sources=["d0", "d1", "d2"])
    rows = np.array([[0, 2, 1], [1, -1, 0]])
    if kind == "qa":  # questions alone: nothing to score after x
        examples = qa_training_examples([QAExample(q.id, q.question, ()) for q in QUESTIONS[:2]], target="question")
        queries = [question_block(e.query, None) for e in examples]
        docs = [f"Knowledge: {passage_text(t, x)}\n" for t, x in PASSAGES]
        template = QA_DOC_TEMPLATE
    else:  # a window's query text (the second one mid-document, with its leading space); y is never read
        examples = [TrainExample("Leaves of green plants take in", " carbon dioxide.", excluded_sources=("d9",)),
                    TrainExample(" no stone is harder than", " diamond.", excluded_sources=("d8",))]
        queries = [e.query for e in examples]
        docs = [f"{t}\n{x}\n\n" for t, x in PASSAGES]
        template = DOC_TEMPLATE
    lm = Recording(smollm2)
    cache = LMScoreCache(str(tmp_path / "cache.sqlite"), lm)
    ell = supervise(cache, store, examples, rows, lm_score="sum", doc_template=template, target="question")
    (contexts, scored, continuations), = lm.calls  # one score_with_query call: document, then x, nothing after
    assert contexts == [docs[r] for row in rows for r in row if r >= 0] and set(continuations) == {""}
    assert scored == [queries[i] for i, row in enumerate(rows) for r in row if r >= 0]
    mean = supervise(cache, store, examples, rows, lm_score="mean", doc_template=template, target="question")
    assert len(lm.calls) == 1 and cache.stats()["cache_misses"] == 5 and cache.stats()["cache_hits"] == 5
    cache.close()
    beta, valid = 5.0, rows >= 0
    hand, tokens = np.zeros(rows.shape), np.ones(rows.shape)
    at = list(zip(*np.nonzero(valid)))
    if kind == "qa":  # x as a continuation
        lps = smollm2.score([docs[rows[i, j]] for i, j in at], [queries[i] for i, _ in at])
    else:
        pairs = []
        for i, j in at:
            ids, offsets = smollm2.tokenizer.encode_with_offsets(docs[rows[i, j]] + queries[i])
            n = sum(start < len(docs[rows[i, j]]) for start, _ in offsets)
            assert smollm2.tokenizer.decode(ids[n:]) == queries[i]
            pairs.append((ids[:n], ids[n:]))
        lps = smollm2.score_token_pairs(pairs)
    for (i, j), lp in zip(at, lps):
        hand[i, j], tokens[i, j] = np.sum(np.asarray(lp, np.float64)), len(lp)
    np.testing.assert_allclose(ell, np.where(valid, hand, 0.0), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(mean, np.where(valid, hand / tokens, 0.0), rtol=1e-5, atol=1e-4)
    z = np.where(valid, np.exp((hand - hand.max(axis=1, keepdims=True)) / beta), 0.0)
    q_hand = z / z.sum(axis=1, keepdims=True)  # float64 softmax(ℓ / β) over the retrieved passages
    q = np.exp(np.asarray(lm_log_likelihood(ell, valid, beta), np.float64))
    np.testing.assert_allclose(q, q_hand, atol=2e-4)
    assert q_hand[0].max() < 0.999  # not one-hot: the comparison has room to fail


def test_both_targets_come_from_one_pass_per_passage(smollm2, tmp_path):
    """supervise_targets(("answer", "question")): ONE score_with_query call, one pass d ∘ x ∘ y per retrieved
    pair, whose ℓ equal the answer target's own pass (d ∘ x scored for y) and the question target's (x after d)."""
    store = Datastore(ids=["p0", "p1", "p2"], titles=[t for t, _ in PASSAGES], texts=[x for _, x in PASSAGES],
                      sources=["d0", "d1", "d2"])
    rows = np.array([[0, 2, 1], [1, -1, 0], [2, 0, -1]])
    examples = qa_training_examples(QUESTIONS, seed=3)
    lm = Recording(smollm2)
    cache = LMScoreCache(str(tmp_path / "both.sqlite"), lm)
    both = supervise_targets(cache, store, examples, rows, ("answer", "question"), doc_template=QA_DOC_TEMPLATE)
    cache.close()
    (contexts, queries, continuations), = lm.calls
    assert len(contexts) == int((rows >= 0).sum()) == 7
    assert continuations == [examples[i].continuation for i, row in enumerate(rows) for r in row if r >= 0]
    apart = LMScoreCache(str(tmp_path / "apart.sqlite"), smollm2)
    for target in ("answer", "question"):
        alone = supervise(apart, store, examples, rows, doc_template=QA_DOC_TEMPLATE, target=target)
        np.testing.assert_allclose(both[target], alone, rtol=1e-5, atol=2e-3)
        assert np.all(both[target][rows >= 0] < 0) and np.all(both[target][rows < 0] == 0)
    apart.close()
    with pytest.raises(ValueError, match="lsr_target must be one of"):
        supervise_targets(cache, store, examples, rows, ("answer", "options"))


def test_training_questions_must_not_be_evaluated():
    trained = {"ids": ["q1"], "questions": ["What is the hardest  natural mineral"]}
    check_disjoint_questions(trained, [QUESTIONS[2]])
    with pytest.raises(ValueError, match="2 evaluated questions were LSR training questions"):
        check_disjoint_questions(trained, QUESTIONS)  # q1 by id, q2 by its normalised text


def test_line_numbers_are_no_identity_across_files(tmp_path):
    """JSONL rows without ids get their line numbers: a held-out file's line 1 is not the training file's line 1,
    and corpus row i (say question i's support passage) is not hidden from question i."""
    rows = lambda qs: [{"question": q.question, "answers": list(q.answers)} for q in qs]
    train = question_sets.read_qa_jsonl(_jsonl(tmp_path / "train.jsonl", rows(QUESTIONS)))
    held_out = question_sets.read_qa_jsonl(_jsonl(tmp_path / "test.jsonl", rows(
        [QAExample("", "Which planet is the largest?", ("Jupiter",))])))
    assert train[0].id == held_out[0].id == "1" and not train[0].id_given
    examples = qa_training_examples(train)
    record = trained_questions_record(str(tmp_path / "train.jsonl"), examples)
    assert record["ids"] == [] and sorted(record["questions"]) == sorted(q.question for q in QUESTIONS)
    check_disjoint_questions(record, held_out)  # line 1 of another file: another question
    again = question_sets.read_qa_jsonl(_jsonl(tmp_path / "again.jsonl", rows([QUESTIONS[2], held_out[0]])))
    with pytest.raises(ValueError, match=r"1 evaluated questions .*\['1'\]"):  # a training question, by its text
        check_disjoint_questions(record, again)
    given = trained_questions_record("q.jsonl", qa_training_examples(QUESTIONS))  # ids the data gave still count
    with pytest.raises(ValueError, match="were LSR training questions"):
        check_disjoint_questions(given, [QAExample("q2", "Reworded: which mineral is hardest?", ("diamond",))])
    corpus = list(read_jsonl(_jsonl(tmp_path / "corpus.jsonl", [{"text": text} for _, text in PASSAGES])))
    store = Datastore([f"p{i}" for i in range(3)], ["", "", ""], [d.text for d in corpus], [d.id for d in corpus])
    assert store.sources == ["1", "2", "3"]
    exclude = excluded_rows(store, [e.excluded_sources for e in examples], len(examples))
    assert all(len(rows) == 0 for rows in exclude)  # every support passage can be retrieved for its question


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


def test_qa_lsr_job_then_qa_job(tiny_qa, tmp_path, monkeypatch):
    assert trains_on_questions(tiny_qa["train"]) and trains_on_questions("sciq")
    assert not trains_on_questions(tiny_qa["corpus"]) and not trains_on_questions("gensim_wiki")
    workdir = str(tmp_path / "lsr")
    excluded = []  # what the training loop excluded from each question's retrieval: nothing
    monkeypatch.setattr(loop, "excluded_rows", lambda store, sources, n: excluded.extend(sources) or
                        excluded_rows(store, sources, n))
    trained = lsr.run_lsr(_config(tiny_qa), workdir)
    assert len(excluded) >= 16 and not any(excluded)
    assert trained["training_questions"] == 16 and trained["lsr"]["doc_template"] == QA_DOC_TEMPLATE
    assert trained["lsr"]["cache_misses"] > 0
    recorded = json.load(open(os.path.join(workdir, lsr.TRAIN_QUESTIONS)))
    assert sorted(recorded["ids"]) == sorted(f"q{i}" for i in range(4, 20))
    encoder, train_documents = prepare.load_trained_encoder(
        prepare.load_job_encoder(_config(tiny_qa), np.float32), workdir)
    assert train_documents is False

    results = downstream.run_downstream(_qa_config(tiny_qa, tiny_qa["eval"], workdir), str(tmp_path / "qa"))
    assert set(results["answer_nll"]) == {"none", "replug", "concat", "replug_lsr"}
    assert all(np.isfinite(v) and v > 0 for v in results["answer_nll"].values())
    rows = [json.loads(line) for line in open(tmp_path / "qa" / "predictions.jsonl")]
    for m in ("none", "replug_lsr"):
        assert results["answer_nll"][m] == pytest.approx(np.mean([r[m]["answer_nll"] for r in rows]))
    # the trained query encoder ranks differently from the initial one: another mixture, another likelihood
    assert results["answer_nll"]["replug_lsr"] != results["answer_nll"]["replug"]
    direction = trained["lsr"]["direction"]  # the table names the KL direction the retriever was trained with
    assert results["lsr_direction"] == direction and direction in ("pr_q", "q_pr")
    assert f"| replug_lsr ({report.KL_NAMES[direction]}) |" in open(tmp_path / "qa" / "results.md").read()

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
    """experiments/qa_lsr_pools.py: REPLUG's sequence-mixture answer NLL over the top k by the scores, top-1
    accuracy, Spearman and the oracle, on two pools worked by hand."""
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
        assert got[f"seq_nll_tau{tau:g}"] == pytest.approx(want, rel=1e-12)
    oracle = np.mean([-math.log((math.exp(-1) + math.exp(-2)) / 2), -math.log((math.exp(-3) + math.exp(-4)) / 2)])
    assert pools.oracle_nll(ell, 2) == pytest.approx(oracle, rel=1e-12)
    ell_question = np.array([[-7.0, -9.0, -8.0], [-2.0, -1.0, -3.0]])  # the posterior's first: passages 0 and 1
    assert pools.pool_metrics(scores, ell, 2, (1.0,), ell_question)["posterior_top1"] == 1.0
    assert pools.pool_metrics(scores, ell, 2, (1.0,), -ell_question)["posterior_top1"] == 0.0  # firsts 1 and 2


def test_pools_experiment_trains_the_question_target_on_unlabelled_questions_too():
    """qa_lsr_pools.py --lsr_targets question: the run's pool is the labelled questions with ℓ = log p(x | d),
    then the unlabelled ones (MMLU validation questions, no answers); the answer target never sees them."""
    pools = _pools_experiment()
    unlabelled = pools.unlabelled_questions("mmlu:validation", 6)
    assert len(unlabelled) == 6 and all(q.answers == () and q.id.startswith("mmlu-validation-") for q in unlabelled)
    assert len({q.id for q in unlabelled}) == 6 and unlabelled == pools.unlabelled_questions("mmlu:validation", 6)
    rng = np.random.default_rng(0)
    labelled = {"examples": ["a", "b", "c"], "rows": rng.integers(0, 9, (3, 4)), "initial": rng.normal(size=(3, 4)),
                "ell": rng.normal(size=(3, 4)), "ell_question": rng.normal(size=(3, 4))}
    extra = {"examples": ["u", "v"], "rows": rng.integers(0, 9, (2, 4)), "initial": rng.normal(size=(2, 4)),
             "ell_question": rng.normal(size=(2, 4))}
    both = {"train": labelled, "unlabelled": extra}
    answer = pools.training_pool(both, "answer", 2)
    assert answer["examples"] == ["a", "b"] and np.array_equal(answer["ell"], labelled["ell"][:2])
    question = pools.training_pool(both, "question", 0)
    assert question["examples"] == ["a", "b", "c", "u", "v"]
    np.testing.assert_array_equal(question["ell"], np.concatenate([labelled["ell_question"], extra["ell_question"]]))
    np.testing.assert_array_equal(question["rows"], np.concatenate([labelled["rows"], extra["rows"]]))
    with pytest.raises(ValueError, match="only --lsr_targets question"):
        pools.main(["--workdir", "unused", "--unlabelled", "nq_open"])
    # after an epoch, "train" is judged by the answers; the question target's own pool (ℓ = log p(x | d), whose
    # "seq NLL" is the question's) is reported under its own name, never as "train"
    judged = pools.pools_to_judge(both, question, "question")
    assert judged["train"] is labelled and judged["trained on, ℓ = log p(x | d)"] is question
    assert "unlabelled" not in judged  # no answers: nothing to judge it by
    assert pools.pools_to_judge(both, answer, "answer") == {"train": answer}  # a learning curve's subset
    assert pools.pools_to_judge(both) == {"train": labelled}


def test_unlabelled_science_questions_from_olmes_files_leave_out_the_evaluated_ones():
    """--unlabelled olmes:TASK:FORM reads an OLMES request file's questions; any whose normalised text is an
    excluded question's (SciQ validation: OLMES's sciq file holds the very questions evaluated) is dropped."""
    from replug_jax.data import olmes
    pools = _pools_experiment()
    arc, _ = olmes.load_olmes("arc_easy", "rc_0shot")
    got = pools.unlabelled_questions("olmes:arc_easy:rc_0shot", 0)
    assert len(got) == len(arc) and {q.question for q in got} == {q.question for q in arc}
    assert all(q.answers == () for q in got)
    sciq, _ = olmes.load_olmes("sciq", "rc_0shot")
    evaluated = [q.question.upper() + "?" for q in sciq[:10]]  # the same questions up to case and punctuation
    kept = pools.unlabelled_questions("olmes:sciq:rc_0shot", 0, exclude=evaluated)
    assert len(kept) == len(sciq) - len({pools.question_key(q) for q in evaluated})
    assert not {pools.question_key(q.question) for q in kept} & {pools.question_key(q) for q in evaluated}


def test_pools_experiment_saves_a_retriever_the_qa_job_reads(tiny_qa, tmp_path):
    """qa_lsr_pools.py --save_retriever: the QA job's replug_lsr method loads the query encoder it saved (query side,
    over the original index) and refuses to evaluate the questions it was trained on."""
    import jax

    config = _config(tiny_qa)
    encoder = prepare.load_job_encoder(config, np.float32)
    trained = jax.tree.map(lambda x: x * 1.5, encoder.params)  # any parameters other than the initial ones
    examples = qa_training_examples(question_sets.load_qa(tiny_qa["train"], "validation"))
    _pools_experiment().save_retriever(str(tmp_path / "saved"), trained, config, examples, {"gamma": 0.1})
    saved = json.load(open(tmp_path / "saved" / "results.json"))  # qa_lsr.py --trained reads γ there
    assert saved["lsr"]["gamma"] == 0.1 and saved["training_questions"] == len(examples) == 16
    loaded, train_documents = prepare.load_trained_encoder(encoder, str(tmp_path / "saved"))
    assert train_documents is False and loaded.name.endswith("+lsr")
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(trained)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="were LSR training questions"):
        downstream.run_downstream(_qa_config(tiny_qa, tiny_qa["all"], str(tmp_path / "saved")), str(tmp_path / "qa"))
    # multiple choice too, by the question's text (OLMES's sciq requests hold SciQ's validation questions)
    trained_text = question_sets.load_qa(tiny_qa["train"], "validation")[0].question
    mc = tmp_path / "mc.jsonl"
    with open(mc, "w") as f:
        for i, question in enumerate(["Which is no training question?", trained_text]):
            f.write(json.dumps({"id": f"q{i + 4}", "question": question, "choices": ["a", "b", "c", "d"],
                                "answer": 0, "subject": "science"}) + "\n")
    mc_config = _qa_config(tiny_qa, str(mc), str(tmp_path / "saved"), job="mmlu", demos=str(mc), shots=0,
                           methods=("replug_lsr",), scoring="options", max_new_tokens=1)
    with pytest.raises(ValueError, match="1 evaluated questions were LSR training questions"):
        downstream.run_downstream(mc_config, str(tmp_path / "mc"))


def test_a_users_question_file_trains_on_all_its_rows(tmp_path):
    """qa_lsr.py skips SciQ's first 300 rows (sciq.py evaluates them), not a user's: a 400-question file trains on
    400 questions unless --config.train_offset is set."""
    from replug_jax.jobs.config_files import sibling_config
    from replug_jax.train.queries import SCIQ_TRAIN_OFFSET

    configs = os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments", "configs")
    config = sibling_config(os.path.join(configs, "qa_lsr.py"), "qa_lsr.py")
    assert config.train_data == "sciq"
    assert lsr.training_questions(config) == question_sets.load_qa("sciq", "validation")[SCIQ_TRAIN_OFFSET:]
    rows = [{"id": f"u{i}", "question": f"What is item {i}?", "answers": [f"thing {i}"]} for i in range(400)]
    config.train_data = _jsonl(tmp_path / "mine.jsonl", rows)
    assert [q.id for q in lsr.training_questions(config)] == [f"u{i}" for i in range(400)]
    config.train_offset = 100  # set explicitly: skipped
    assert [q.id for q in lsr.training_questions(config)] == [f"u{i}" for i in range(100, 400)]


def test_question_target_trains_on_questions_without_answers(tiny_qa, tmp_path):
    """lsr_target="question": a JSONL of questions alone trains (one real step, finite loss) and results.json
    records the target; the answer target refuses that file naming the key, and an unknown target is refused in
    the first second."""
    rows = [json.loads(line) for line in open(tiny_qa["train"])]
    unlabelled = _jsonl(tmp_path / "questions.jsonl", [{"id": r["id"], "question": r["question"]} for r in rows])
    config = _config(tiny_qa, train_data=unlabelled, lsr_target="question", steps=1, checkpoint_every=1)
    check_job_inputs(config)
    for bad in ("answers", "passage", ""):
        with pytest.raises(InputError, match="lsr_target"):
            check_job_inputs(_config(tiny_qa, lsr_target=bad))
    with pytest.raises(ValueError, match="lsr_target"):
        loop.LSRSettings(lsr_target="questions")
    answer = _config(tiny_qa, train_data=unlabelled, lsr_target="answer")
    with pytest.raises(InputError, match="lsr_target"):  # the first second: the file's first row
        check_job_inputs(answer)
    with pytest.raises(ValueError, match=r"line 1: needs \"answers\".*lsr_target=question"):  # the job itself
        lsr.training_questions(answer)
    workdir = str(tmp_path / "lsr")
    results = lsr.run_lsr(config, workdir)
    assert results["lsr"]["lsr_target"] == "question" and results["training_questions"] == len(rows) == 16
    assert json.load(open(os.path.join(workdir, "results.json")))["lsr"]["lsr_target"] == "question"
    logged = [json.loads(line) for line in open(os.path.join(workdir, "lsr", "metrics.jsonl"))]
    assert [m["step"] for m in logged] == [1] and np.isfinite(logged[0]["loss"])
    assert results["lsr"]["cache_misses"] == 8 * 3  # every (question, passage) pair of the step scored once
