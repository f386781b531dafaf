"""The downstream evaluations (REPLUG §6.2 MMLU, §6.3 open-domain QA) against hand computations, and the jobs.

MMLU option probabilities are checked against a float64 mixture of separate `lm.score` calls on the real
SmolLM2; QA prompts and REPLUG weights are checked by a recording wrapper around a real LM; the
sequence-level vote by a scripted LM; the "qa" and "mmlu" jobs end to end on a tiny offline corpus.
"""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import replug_jax as rj
from replug_jax.lm.http.transport import BlackBoxServerError
from replug_jax.jobs.config_files import sibling_config
from replug_jax.data.question_sets import MMLU_CATEGORIES, MMLU_SUBJECTS, MCExample, QAExample
from replug_jax.evaluate import demo_passages, mmlu, qa
from replug_jax.evaluate.qa_metrics import normalize_answer
from replug_jax.jobs import downstream as job
from replug_jax.jobs import prepare
from replug_jax.lm.blackbox import Generation
from replug_jax.models import precision

from tests import hf_tiny

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "configs")


class RecordingLM:
    """Delegates to a real LM and records every `score` and `generate` call (arguments and results)."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name
        self.tokenizer = getattr(inner, "tokenizer", None)
        self.score_calls, self.generate_calls, self.query_calls = [], [], []

    def count_tokens(self, text):
        return self.inner.count_tokens(text)

    def fingerprint(self):
        return self.inner.fingerprint()

    def score(self, contexts, continuations, progress=False):
        out = self.inner.score(contexts, continuations)
        self.score_calls.append({"contexts": list(contexts), "continuations": list(continuations), "out": out})
        return out

    def score_with_query(self, contexts, queries, continuations, progress=False, prefix=""):
        out = self.inner.score_with_query(contexts, queries, continuations, prefix=prefix)
        self.query_calls.append({"contexts": list(contexts), "queries": list(queries),
                                 "continuations": list(continuations), "prefix": prefix, "out": out})
        return out

    def generate(self, contexts, log_weights, *, max_new_tokens, stop=("\n",), shared_prefix="", progress=False):
        gens = self.inner.generate(contexts, log_weights, max_new_tokens=max_new_tokens, stop=stop,
                                   shared_prefix=shared_prefix)
        self.generate_calls.append({"contexts": [list(c) for c in contexts],
                                    "log_weights": [np.array(w, np.float64) for w in log_weights],
                                    "max_new_tokens": max_new_tokens, "stop": tuple(stop),
                                    "shared_prefix": shared_prefix, "gens": gens})
        return gens


class SpaceStoppingLM(RecordingLM):
    """The real LM, with " " among the stop strings: an answer whose first token starts with a space is cut to ""."""

    def generate(self, contexts, log_weights, *, max_new_tokens, stop=("\n",), shared_prefix="", progress=False):
        return super().generate(contexts, log_weights, max_new_tokens=max_new_tokens, stop=tuple(stop) + (" ",),
                                shared_prefix=shared_prefix)


class LMThatDiesInTheThirdMethod(RecordingLM):
    """The real LM, which fails as a server that has gone would once WORKDIR/results.json says two methods finished."""

    def __init__(self, inner, workdir):
        super().__init__(inner)
        self.results = os.path.join(str(workdir), "results.json")

    def score(self, contexts, continuations, progress=False):
        if os.path.isfile(self.results) and len(json.load(open(self.results)).get("methods_finished", [])) == 2:
            raise BlackBoxServerError("the server has gone (the test's fault)")
        return super().score(contexts, continuations, progress)


class ScriptedLM:
    """A fake LM whose `generate` returns given Generations, one per (flattened) pass, and records the call."""

    name = "scripted"

    def __init__(self, gens):
        self.gens, self.calls = gens, []

    def count_tokens(self, text):
        return len(text.split())

    def generate(self, contexts, log_weights, *, max_new_tokens, stop=("\n",), shared_prefix="", progress=False):
        self.calls.append({"contexts": [list(c) for c in contexts], "log_weights": [list(w) for w in log_weights],
                           "max_new_tokens": max_new_tokens, "stop": tuple(stop), "shared_prefix": shared_prefix})
        assert len(contexts) == len(self.gens)
        return list(self.gens)


def log_softmax64(scores, tau):
    z = np.asarray(scores, np.float64) / tau
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """A tiny random GPT-2 with a byte-level tokenizer (" A" is two tokens), 256 positions."""
    path = str(tmp_path_factory.mktemp("gpt2"))
    hf_tiny.tiny_gpt2(path, positions=256)
    return rj.load_lm(path, batch_size=8)


# ---------------------------------------------------------------- MMLU: option probabilities and accuracy

SHOT = MCExample("s0", "Which planet is known as the Red Planet?", ("Venus", "Mars", "Jupiter", "Saturn"), 1,
                 "astronomy")
SHOT_PASSAGE = "Mars is the fourth planet from the Sun and is often called the Red Planet."
MC = [
    MCExample("q0", "What is the largest planet in the Solar System?", ("Mars", "Earth", "Jupiter", "Mercury"), 2,
              "astronomy"),
    MCExample("q1", "At what temperature in Celsius does water boil at sea level?", ("50", "90", "100", "120"), 2,
              "high_school_chemistry"),
    MCExample("q2", "Who wrote the play Hamlet?", ("Charles Dickens", "William Shakespeare", "Jane Austen",
                                                   "Mark Twain"), 1, "high_school_european_history"),
]
MC_PASSAGES = [
    ["Jupiter is the largest planet in the Solar System, a gas giant.", "Mercury is the smallest planet."],
    ["Water boils at 100 degrees Celsius at sea level.", "Ice melts at 0 degrees Celsius."],
    ["Charles Dickens wrote Oliver Twist.", "Hamlet is a tragedy written by William Shakespeare."],
]


def test_mmlu_prompt_is_table_4():
    prefix = mmlu.shots_block([SHOT], [SHOT_PASSAGE])
    assert prefix == (f"Knowledge: {SHOT_PASSAGE}\nQuestion: Which planet is known as the Red Planet?\n"
                      "A. Venus B. Mars C. Jupiter D. Saturn\nAnswer: B\n\n")
    assert mmlu.lettered_block(MC[0], "P.") == ("Knowledge: P.\nQuestion: What is the largest planet in the Solar "
                                                "System?\nA. Mars B. Earth C. Jupiter D. Mercury\nAnswer:")
    assert mmlu.lettered_block(MC[0], None).startswith("Question: ")
    assert mmlu.retrieval_query(MC[0], False) == MC[0].question
    assert mmlu.retrieval_query(MC[0], True).endswith("A. Mars B. Earth C. Jupiter D. Mercury")


def test_mmlu_option_mixture_equals_hand_computation(smollm2):
    """log Σ_i softmax(s/τ)_i p_i(option) from separate lm.score calls, in float64; a ragged question
    (one pass, the missing pass's score huge) must ignore the missing pass."""
    lm = smollm2
    mmlu.check_option_tokens(lm)  # " A" .. " D" are single SmolLM2 tokens
    prefix = mmlu.shots_block([SHOT], [SHOT_PASSAGE])
    prompts = [[prefix + mmlu.lettered_block(q, p) for p in ps] for q, ps in zip(MC, MC_PASSAGES)]
    prompts.append([prompts[0][0]])  # question 3: question 0 with its first pass only
    tau = 0.5
    scores = np.array([[0.9, 0.2], [0.1, 0.7], [0.5, 0.45], [0.3, 10.0]], np.float32)
    option_lps = mmlu.option_logprobs(lm, prompts)
    assert option_lps.shape == (4, 2, 4)
    assert np.isneginf(option_lps[3, 1]).all() and np.isfinite(option_lps[:3]).all()
    predicted, mixed = mmlu.mixture_predictions(option_lps, scores, tau)
    assert predicted.shape == (4,) and mixed.shape == (4, 4)

    by_prompt = {}  # per pass: log p(" A") .. log p(" D"), from one score call per question
    for ps in prompts[:3]:
        lps = lm.score([p for p in ps for _ in "ABCD"], [f" {x}" for _ in ps for x in "ABCD"])
        assert all(len(x) == 1 for x in lps)
        for i, prompt in enumerate(ps):
            by_prompt[prompt] = np.array([float(x[0]) for x in lps[4 * i: 4 * i + 4]], np.float64)
    for q, ps in enumerate(prompts):
        lp = np.stack([by_prompt[p] for p in ps])  # [n, 4]
        np.testing.assert_allclose(option_lps[q, : len(ps)], lp, atol=1e-4)  # float32 passes of other shapes differ by ~2e-5
        lam = np.exp(log_softmax64(scores[q, : len(ps)], tau))
        hand = np.log((lam[:, None] * np.exp(np.asarray(option_lps[q, : len(ps)], np.float64))).sum(0))
        np.testing.assert_allclose(np.asarray(mixed[q], np.float64), hand, atol=1e-5)
        assert predicted[q] == hand.argmax()
    np.testing.assert_allclose(mixed[3], option_lps[0, 0], atol=1e-5)  # weight 1 on the only pass
    # the mixture is not the mean of the passes' log-probs (the check above could tell them apart)
    assert np.abs(np.asarray(mixed[:3]) - option_lps[:3].mean(1)).max() > 1e-3


def test_option_letters_must_be_single_tokens(tiny_gpt2, smollm2):
    assert tiny_gpt2.count_tokens(" A") == 2  # byte-level, no merges
    with pytest.raises(ValueError, match="single tokens"):
        mmlu.check_option_tokens(tiny_gpt2)
    mmlu.check_option_tokens(smollm2)  # no error
    mmlu.check_option_tokens(smollm2, n=6)


def test_mmlu_accuracy_macro_and_micro():
    """Per subject, per category (macro over its subjects, micro over its questions), overall macro vs micro."""
    subjects = {"astronomy": [1, 1, 1, 0], "college_physics": [0], "philosophy": [1, 1], "my_own_subject": [1]}
    assert MMLU_CATEGORIES["astronomy"] == MMLU_CATEGORIES["college_physics"] == "STEM"
    assert MMLU_CATEGORIES["philosophy"] == "Humanities" and "my_own_subject" not in MMLU_CATEGORIES
    examples, predicted = [], []
    for s, correct in subjects.items():
        for j, ok in enumerate(correct):
            examples.append(MCExample(f"{s}-{j}", "?", ("a", "b", "c", "d"), j % 4, s))
            predicted.append(j % 4 if ok else (j + 1) % 4)
    acc = mmlu.accuracy(examples, np.array(predicted))
    assert acc["per_subject"] == pytest.approx({"astronomy": 75.0, "college_physics": 0.0, "philosophy": 100.0,
                                                "my_own_subject": 100.0})
    stem = acc["per_category"][MMLU_CATEGORIES["astronomy"]]
    assert stem == {"macro": pytest.approx(37.5), "micro": pytest.approx(60.0), "subjects": 2, "questions": 5}
    hum = acc["per_category"]["Humanities"]
    assert hum == {"macro": pytest.approx(100.0), "micro": pytest.approx(100.0), "subjects": 1, "questions": 2}
    assert acc["per_category"]["Other"]["questions"] == 1  # unknown subjects count as "Other"
    assert set(acc["per_category"]) == {"STEM", "Humanities", "Other"}
    assert acc["macro"] == pytest.approx((75 + 0 + 100 + 100) / 4)  # mean over subjects
    assert acc["micro"] == pytest.approx(100 * 6 / 8)  # mean over questions
    assert acc["questions"] == 8


# ---------------------------------------------------------------- QA: prompts, weights, vote, metrics

QA_DEMOS = [QAExample("d0", "Who is the mayor of Velmora?", ("Tobias Grint",))]
QA_DEMO_PASSAGES = ["Velmora is a town whose mayor is Tobias Grint."]
QA_QS = [QAExample("a", "What colour is the flag of Quenland?", ("green",)),
         QAExample("b", "Where was Marisol Fenn born?", ("Lisbon",))]
QA_PASSAGES = [["The flag of Quenland is green with a white star.", "Quenland borders the sea.",
                "Orvik is a fishing village."],
               ["Marisol Fenn is a painter born in Lisbon.", "Lisbon is a city."]]  # ragged: 3 and 2 passes


def test_qa_prompt_is_table_5():
    prefix = qa.demo_block(QA_DEMOS, QA_DEMO_PASSAGES)
    assert prefix == ("Knowledge: Velmora is a town whose mayor is Tobias Grint.\n"
                      "Question: Who is the mayor of Velmora?\nAnswer: Tobias Grint\n\n")
    assert qa.demo_block(QA_DEMOS, [None]) == "Question: Who is the mayor of Velmora?\nAnswer: Tobias Grint\n\n"
    assert qa.passage_text("Velmora", "  a  town\n of note ") == "Velmora a town of note"
    assert qa.passage_text("", "a\ttown") == "a town"


@pytest.mark.parametrize("method", ["replug", "concat", "none"])
def test_answer_questions_calls_generate_as_the_paper(tiny_gpt2, method):
    """replug: one pass per passage, log λ = log softmax(s/τ) over the question's passages; concat: one
    Knowledge line, best passage last; none: no Knowledge line. The shared prefix is the demo block."""
    lm = RecordingLM(tiny_gpt2)
    tau = 0.7
    scores = np.array([[0.9, 0.4, 0.1], [0.6, 0.5, 50.0]], np.float32)  # [1, 2] is padding: never weighted
    prefix = qa.demo_block(QA_DEMOS, [None] if method == "none" else QA_DEMO_PASSAGES)
    preds = qa.answer_questions(lm, QA_QS, QA_PASSAGES, scores, method=method, ensemble="replug",
                                demo_prefix=prefix, temperature=tau, max_new_tokens=3)
    (call,) = lm.generate_calls
    assert call["shared_prefix"] == prefix and call["stop"] == ("\n",) and call["max_new_tokens"] == 3
    q = [f"Question: {x.question}\nAnswer:" for x in QA_QS]
    if method == "replug":
        assert call["contexts"] == [[f"Knowledge: {p}\n{qb}" for p in ps] for qb, ps in zip(q, QA_PASSAGES)]
        for i, ps in enumerate(QA_PASSAGES):
            np.testing.assert_allclose(call["log_weights"][i], log_softmax64(scores[i, : len(ps)], tau), atol=1e-6)
    elif method == "concat":
        assert call["contexts"] == [
            ["Knowledge: Orvik is a fishing village. Quenland borders the sea. The flag of Quenland is green with a "
             f"white star.\n{q[0]}"],
            [f"Knowledge: Lisbon is a city. Marisol Fenn is a painter born in Lisbon.\n{q[1]}"]]
        assert [list(w) for w in call["log_weights"]] == [[0.0], [0.0]]
    else:
        assert call["contexts"] == [[q[0]], [q[1]]]
        assert not any("Knowledge:" in c for ctx in call["contexts"] for c in ctx)
        assert [list(w) for w in call["log_weights"]] == [[0.0], [0.0]]
    assert [p["prediction"] for p in preds] == [g.text.strip() for g in call["gens"]]
    assert [p["finish_reason"] for p in preds] == [g.finish_reason for g in call["gens"]]


def _gen(text, logprobs):
    return Generation(text, list(range(len(logprobs))), list(logprobs), "stop")


def test_vote_weighs_passes_by_lambda_and_confidence():
    """The sequence-level vote: Σ over passes with the same normalised answer of λ_i · exp(mean token log-prob)."""
    tau = 0.5
    lam = [np.array([0.4, 0.3, 0.3]), np.array([0.75, 0.25]), np.array([0.45, 0.35, 0.2]), np.array([0.3, 0.7]),
           np.array([0.5, 0.5])]
    scores = np.full((5, 3), -7.0, np.float32)  # the padding of the 2-pass questions must not matter
    for i, w in enumerate(lam):
        scores[i, : len(w)] = tau * np.log(w)
    passages = [[f"p{i}-{j}" for j in range(len(w))] for i, w in enumerate(lam)]
    gens = [
        # q0: two low-weight passes agree ("Paris" == "paris." normalised) and beat the high-weight one
        _gen("London", [-0.1, -0.3]), _gen(" Paris", [-0.5]), _gen("paris.", [-0.3, -0.7]),
        # q1: a confident low-weight pass beats an unsure high-weight one
        _gen("1887", [-2.0, -2.0]), _gen("1901", [-0.1]),
        # q2: equal confidences; normalisation merges "Porto" and "The Porto" (0.55 > 0.45)
        _gen("Lisbon", [-1.0]), _gen("Porto", [-1.0]), _gen("The Porto", [-1.0, -1.0]),
        # q3: λ decides against a slightly more confident pass
        _gen("Bergen", [-0.9]), _gen("Oslo", [-1.0]),
        # q4: the MEAN token log-prob counts (the sum would prefer Boston)
        _gen("New York City", [-0.2, -0.2, -0.2]), _gen("Boston", [-0.5]),
    ]
    lm = ScriptedLM(gens)
    prefix = qa.demo_block(QA_DEMOS, QA_DEMO_PASSAGES)
    qs = [QAExample(str(i), f"question {i}?", ("x",)) for i in range(len(lam))]
    preds = qa.answer_questions(lm, qs, passages, scores, method="replug", ensemble="vote", demo_prefix=prefix,
                                temperature=tau, max_new_tokens=5)
    (call,) = lm.calls  # every pass decoded alone, in one call
    assert call["contexts"] == [[f"Knowledge: {p}\nQuestion: question {i}?\nAnswer:"]
                                for i, ps in enumerate(passages) for p in ps]
    assert call["log_weights"] == [[0.0]] * len(gens) and call["shared_prefix"] == prefix
    assert call["stop"] == ("\n",) and call["max_new_tokens"] == 5
    # the hand vote
    at, expected = 0, []
    for w in lam:
        votes = {}
        for lam_i, g in zip(w, gens[at: at + len(w)]):
            key = normalize_answer(g.text)
            votes[key] = votes.get(key, 0.0) + lam_i * np.exp(np.mean(g.logprobs))
        at += len(w)
        expected.append(max(votes, key=votes.get))
    assert expected == ["paris", "1901", "porto", "oslo", "new york city"]
    assert 0.6 * np.exp(-0.5) > 0.4 * np.exp(-0.2)  # q0: agreement wins, though London has the top λ
    assert [normalize_answer(p["prediction"]) for p in preds] == expected
    # the first surface form of the winning answer, stripped
    assert [p["prediction"] for p in preds] == ["Paris", "1901", "Porto", "Oslo", "New York City"]
    assert preds[0]["passes"] == ["London", "Paris", "paris."] and [len(p["passes"]) for p in preds] == [3, 2, 3, 2, 2]


def test_score_predictions_exact_match_and_recall_at_k():
    qs = [QAExample("0", "?", ("The Beatles",)), QAExample("1", "?", ("Paris", "City of Light")),
          QAExample("2", "?", ("1887",)), QAExample("3", "?", ("art",))]
    preds = [{"prediction": "beatles"}, {"prediction": "the city of light!"}, {"prediction": "1888"},
             {"prediction": "art"}]
    passages = [["They were the Beatles.", "x"], ["y", "z", "Paris is in France"], ["built in 1887", "w"],
                ["a party", "smart"]]
    scored = qa.score_predictions(qs, preds, passages, k=2)
    assert [p["exact_match"] for p in preds] == [True, True, False, True]
    assert [p["answer_in_passages"] for p in preds] == [True, False, True, False]  # Paris only at rank 3
    assert scored == {"exact_match": 75.0, "answer_recall@2": 50.0, "count": 4}
    assert qa.score_predictions(qs, [{"prediction": "beatles"}] + preds[1:], passages, k=3)["answer_recall@3"] == 75.0
    closed = [{"prediction": p["prediction"]} for p in preds]
    assert qa.score_predictions(qs, closed, None, k=2) == {"exact_match": 75.0, "answer_recall@2": None, "count": 4}
    assert "answer_in_passages" not in closed[0]


def test_bogus_ensemble_is_refused(tiny_gpt2):
    with pytest.raises(ValueError, match="ensemble"):
        qa.answer_questions(tiny_gpt2, QA_QS, QA_PASSAGES, np.zeros((2, 3), np.float32), method="replug",
                            ensemble="bogus", demo_prefix="", temperature=1.0, max_new_tokens=2)


# ---------------------------------------------------------------- the jobs, end to end on a tiny corpus

CORPUS = [
    ("velmora", "Velmora", "Velmora is a town whose mayor is Tobias Grint."),
    ("quenland", "Quenland", "The flag of Quenland is green with a white star."),
    ("darrow", "Darrow Lake", "Darrow Lake is fed by the Ostrel River."),
    ("pellington", "Pellington", "Pellington is famous for its clock tower, built in 1887."),
    ("fenn", "Marisol Fenn", "Marisol Fenn is a painter born in Lisbon."),
    ("jupiter", "Jupiter", "Jupiter is the largest planet of the Solar System."),
]
QUESTIONS = [  # the first is the demo (shots = 1, demos from this file): removed from the scored set
    {"question": "Who is the mayor of Velmora?", "answers": ["Tobias Grint"]},
    {"question": "What color is the flag of Quenland?", "answers": ["green"]},
    {"question": "Which river feeds Darrow Lake?", "answers": ["Ostrel River", "the Ostrel"]},
    {"question": "When was the Pellington clock tower built?", "answers": ["1887"]},
    {"question": "Where was Marisol Fenn born?", "answers": "Lisbon"},
]
MC_TEST = [  # 3 astronomy (STEM) + 1 philosophy (Humanities): macro and micro differ in general
    {"id": "ast-0", "question": "Which is the largest planet?", "choices": ["Mars", "Jupiter", "Venus", "Pluto"],
     "answer": 1, "subject": "astronomy"},
    {"id": "ast-1", "question": "Which planet is closest to the Sun?", "choices": ["Mercury", "Earth", "Mars",
                                                                                   "Neptune"],
     "answer": "A", "subject": "astronomy"},
    {"id": "ast-2", "question": "What is the Sun?", "choices": ["A planet", "A moon", "A comet", "A star"],
     "answer": 3, "subject": "astronomy"},
    {"id": "phi-0", "question": "Who wrote the Republic?", "choices": ["Kant", "Hume", "Plato", "Locke"],
     "answer": 2, "subject": "philosophy"},
]
MC_DEV = [
    {"id": "dev-ast", "question": "Which planet has rings?", "choices": ["Saturn", "Mercury", "Venus", "Mars"],
     "answer": "A", "subject": "astronomy"},
    {"id": "dev-phi", "question": "Who wrote Meditations?", "choices": ["Hume", "Marcus Aurelius", "Plato", "Kant"],
     "answer": "B", "subject": "philosophy"},
]


def _jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("downstream_data")
    return {"corpus": _jsonl(d / "corpus.jsonl", [{"id": i, "title": t, "text": x} for i, t, x in CORPUS]),
            "questions": _jsonl(d / "questions.jsonl", QUESTIONS),
            "mc_test": _jsonl(d / "mc_test.jsonl", MC_TEST), "mc_dev": _jsonl(d / "mc_dev.jsonl", MC_DEV),
            "no_answers": _jsonl(d / "no_answers.jsonl", [{"question": "Who is the mayor of Velmora?"}]),
            "dir": d}


def qa_config(files, **overrides):
    c = sibling_config(os.path.join(CONFIGS, "qa.py"), "qa.py")
    c.update(dict(questions=files["questions"], demos="", corpus=files["corpus"], encoder="minilm", lm="smollm2",
                  k=2, shots=1, max_new_tokens=4, methods=("none", "replug", "concat"), doc_tokens=64,
                  lm_batch_size=8, encoder_batch_size=8))
    c.update(overrides)
    return c


def mmlu_config(files, **overrides):
    c = sibling_config(os.path.join(CONFIGS, "mmlu.py"), "mmlu.py")
    c.update(dict(questions=files["mc_test"], demos=files["mc_dev"], corpus=files["corpus"], encoder="minilm",
                  lm="smollm2", k=2, shots=1, methods=("none", "replug", "concat"), doc_tokens=64, lm_batch_size=8,
                  encoder_batch_size=8))
    c.update(overrides)
    return c


def run_job(config, workdir, lm):
    """run_downstream with `lm` (the session's SmolLM2, the same packaged model the config names, loaded once
    for the whole test session, wrapped) in place of the job's own loading."""
    assert config.lm == "smollm2" and precision.resolve(config.dtype) == jnp.float32
    return job.run_downstream(config, str(workdir), lm=lm)


@pytest.fixture(scope="module")
def qa_run(files, smollm2, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("qa_run")
    lm = RecordingLM(smollm2)
    results = run_job(qa_config(files), workdir, lm)
    return results, str(workdir), lm


def _read_store(workdir):
    with open(os.path.join(workdir, "datastore.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _plain(text: str) -> str:
    """The hand normalisation for QUESTIONS' answers: lowercase, a leading "the " and a final period dropped."""
    text = text.strip().lower().removesuffix(".")
    return text.removeprefix("the ").strip()


def _as_list(answers) -> list:
    return [answers] if isinstance(answers, str) else list(answers)


def test_qa_job_writes_results_per_method(qa_run):
    results, workdir, lm = qa_run
    saved = json.load(open(os.path.join(workdir, "results.json")))
    assert saved["task"] == "qa" and saved["count"] == 4 == len(QUESTIONS) - 1
    assert saved["demos_removed_from_questions"] == 1 and saved["k"] == 2 and saved["shots"] == 1
    assert saved["methods"] == ["none", "replug", "concat"] and saved["ensemble"] == "replug"
    assert saved["datastore_passages"] == len(CORPUS)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "predictions.jsonl"))]
    for m in ("none", "replug", "concat"):  # EM by hand: these answers need only case, "the" and a final period
        hand = [_plain(r[m]["prediction"]) in {_plain(a) for a in _as_list(r["answers"])} for r in rows]
        assert [r[m]["exact_match"] for r in rows] == hand, m
        assert saved["exact_match"][m] == pytest.approx(100 * np.mean(hand))
    assert saved["answer_recall"]["none"] is None  # closed book: no passages
    assert saved["answer_recall"]["replug"] == saved["answer_recall"]["concat"] == 100.0  # the fact is retrieved
    table = open(os.path.join(workdir, "results.md")).read()
    for m in ("none", "replug", "concat"):
        assert sum(line.startswith(f"| {m} |") for line in table.splitlines()) == 1
    assert os.path.getsize(os.path.join(workdir, "exact_match.png")) > 1000

    rows = [json.loads(line) for line in open(os.path.join(workdir, "predictions.jsonl"))]
    assert [r["question"] for r in rows] == [q["question"] for q in QUESTIONS[1:]]  # the demo is not scored
    for m in ("none", "replug", "concat"):
        assert all(m in r and isinstance(r[m]["prediction"], str) for r in rows)
    assert saved["answer_recall"]["replug"] == pytest.approx(100 * np.mean([r["replug"]["answer_in_passages"]
                                                                           for r in rows]))
    assert saved["empty_answers"] == {m: sum(not r[m]["prediction"] for r in rows) for m in ("none", "replug", "concat")}


def test_qa_job_writes_its_retrieval_as_dpr_writes_it(qa_run):
    """retrieval.jsonl: each question with its passages in DPR's and FiD's format (id, title, text, score,
    has_answer), best first; the ids and scores REPLUG mixed; has_answer as DPR decides it; results.json's DPR top-k
    accuracy from those flags, and the line under the table."""
    from replug_jax.evaluate.dpr_answers import has_answer

    _, workdir, _ = qa_run
    saved = json.load(open(os.path.join(workdir, "results.json")))
    predictions = [json.loads(line) for line in open(os.path.join(workdir, "predictions.jsonl"))]
    retrieval = [json.loads(line) for line in open(os.path.join(workdir, "retrieval.jsonl"))]
    assert [r["question"] for r in retrieval] == [p["question"] for p in predictions]
    for got, prediction in zip(retrieval, predictions):
        assert "ctxs" not in prediction and got["answers"] == prediction["answers"]
        assert "id" not in got  # QUESTIONS give none (the prediction's is its line number)
        assert all(set(c) == {"id", "title", "text", "score", "has_answer"} for c in got["ctxs"])
        assert [c["id"] for c in got["ctxs"]] == prediction["replug"]["passage_ids"]
        assert [c["score"] for c in got["ctxs"]] == pytest.approx(prediction["replug"]["passage_scores"], abs=5e-7)
        assert [c["has_answer"] for c in got["ctxs"]] == [has_answer(got["answers"], c["text"]) for c in got["ctxs"]]
    flags = [[c["has_answer"] for c in r["ctxs"]] for r in retrieval]
    assert saved["retrieval"]["depth"] == 2 and saved["retrieval"]["file"] == "retrieval.jsonl"
    for n in (1, 2):
        assert saved["retrieval"]["dpr_top_k_accuracy"][str(n)] == pytest.approx(
            100 * np.mean([any(f[:n]) for f in flags]))
    assert "DPR's top-k accuracy" in open(os.path.join(workdir, "results.md")).read()


def test_predictions_carry_each_question_and_the_evidence_of_every_number(files, smollm2, qa_run, tmp_path):
    """predictions.jsonl: for every method that uses passages, their datastore ids and retrieval scores (best
    first) and, where passes are mixed, log λ (REPLUG's softmax(s / τ); the posterior's own); each question's own id
    and its row's other fields as the file gave them (a line number where it gave no id)."""
    _, workdir, _ = qa_run
    tau = qa_config(files).temperature
    for row in (json.loads(line) for line in open(os.path.join(workdir, "predictions.jsonl"))):
        assert "passage_ids" not in row["none"] and "log_weights" not in row["concat"]
        for method in ("replug", "concat"):
            got = row[method]
            assert len(got["passage_ids"]) == len(got["passage_scores"]) == 2
            assert got["passage_scores"] == sorted(got["passage_scores"], reverse=True)
        scores = np.array(row["replug"]["passage_scores"]) / tau
        np.testing.assert_allclose(row["replug"]["log_weights"], scores - np.logaddexp.reduce(scores),  # float32:
                                   rtol=1e-6, atol=1e-5)  # s / τ reaches ~20 at the config's τ
        assert row["concat"]["passage_ids"] == row["replug"]["passage_ids"]
    questions = _jsonl(tmp_path / "own.jsonl", [QUESTIONS[0],  # the demo
                                                dict(QUESTIONS[1], id="q-7", gold_doc="flags#0", tags=["colour"]),
                                                QUESTIONS[2]])
    own = {"quenland": {"source": "atlas, p. 12", "year": 1998}, "darrow": {"url": "https://example.org/darrow"}}
    corpus = _jsonl(tmp_path / "own_corpus.jsonl",  # a user's own fields, one named as the datastore's "source" column
                    [{"id": i, "title": t, "text": x, **own.get(i, {})} for i, t, x in CORPUS])
    run_job(qa_config(files, questions=questions, corpus=corpus, methods=("replug_posterior", "concat"), rerank_depth=3),
            tmp_path / "run", smollm2)
    first, second = [json.loads(line) for line in open(tmp_path / "run" / "predictions.jsonl")]
    assert first["id"] == "q-7" and first["fields"] == {"gold_doc": "flags#0", "tags": ["colour"]}
    assert second["id"] == "3" and "fields" not in second  # no id given: its line number
    post = first["replug_posterior"]
    assert len(post["passage_ids"]) == len(post["passage_scores"]) == len(post["log_weights"]) == 2
    assert np.exp(post["log_weights"]).sum() == pytest.approx(1, abs=1e-5)
    # issue 69, item 2: each passage's document's own fields beside its id; the datastore keeps them under "fields"
    for row in (first, second):
        for method in ("replug_posterior", "concat"):
            ids, fields = row[method]["passage_ids"], row[method]["passage_fields"]
            assert fields == [own.get(i.split("#")[0], {}) for i in ids]
    assert own["quenland"] in first["replug_posterior"]["passage_fields"]  # the flag question finds its document
    store = {row["id"]: row for row in _read_store(tmp_path / "run")}
    assert store["quenland#0"]["source"] == "quenland" and store["quenland#0"]["fields"] == own["quenland"]
    assert "fields" not in store["velmora#0"]


def test_empty_answers_and_unused_settings_are_said(files, smollm2, tmp_path, capsys):
    """Answers the LM ends at once are counted per method in results.json and named on the console; a setting no
    chosen method reads (rerank_depth without replug_posterior), and fewer demos than shots, are said on the console,
    in results.json and under the table."""
    demos = _jsonl(tmp_path / "demos.jsonl", QUESTIONS[:1])
    config = qa_config(files, methods=("none", "replug"), rerank_depth=4, demos=demos, shots=3)
    results = run_job(config, tmp_path / "run", SpaceStoppingLM(smollm2))
    rows = [json.loads(line) for line in open(tmp_path / "run" / "predictions.jsonl")]
    empty = {m: sum(not r[m]["prediction"] for r in rows) for m in ("none", "replug")}
    assert results["empty_answers"] == empty and empty["replug"] > 0
    out = capsys.readouterr().out
    unused, fewer, said_empty = json.load(open(tmp_path / "run" / "results.json"))["warnings"]
    assert f"replug {empty['replug']} of {len(rows)}" in said_empty
    assert unused.startswith("--config.rerank_depth=4 unused")  # qa.py's own α 0.5 is nobody's setting
    assert fewer == f"--config.shots=3 but {demos!r} gives 1 demo(s): the prompt is 1-shot" and results["shots"] == 1
    for warning in (unused, fewer, said_empty):
        assert f"warning: {warning}" in out and f"Warning: {warning}" in open(tmp_path / "run" / "results.md").read()


def test_qa_job_prompts_and_weights(qa_run):
    """One generate call per method: the demo block (with its own top-1 passage unless closed book) is the
    shared prefix; replug has k passes weighted by a normalised λ; predictions are the generations."""
    results, workdir, lm = qa_run
    calls = dict(zip(("none", "replug", "concat"), lm.generate_calls))
    assert len(lm.generate_calls) == 3
    store = _read_store(workdir)
    velmora = next(r for r in store if "Tobias Grint" in r["text"])
    demo = QAExample("1", QUESTIONS[0]["question"], tuple(QUESTIONS[0]["answers"]))
    assert calls["none"]["shared_prefix"] == qa.demo_block([demo], [None])
    for m in ("replug", "concat"):
        assert calls[m]["shared_prefix"] == qa.demo_block([demo], [qa.passage_text(velmora["title"], velmora["text"])])
    assert all(c["max_new_tokens"] == 4 and c["stop"] == ("\n",) for c in calls.values())
    questions = [q["question"] for q in QUESTIONS[1:]]
    assert calls["none"]["contexts"] == [[f"Question: {q}\nAnswer:"] for q in questions]
    for ctx, w, q in zip(calls["replug"]["contexts"], calls["replug"]["log_weights"], questions):
        assert len(ctx) == 2 and all(c.startswith("Knowledge: ") and c.endswith(f"\nQuestion: {q}\nAnswer:")
                                     for c in ctx)
        assert np.exp(w).sum() == pytest.approx(1.0, abs=1e-5) and w[0] >= w[1]  # best passage first
    for ctx, rctx in zip(calls["concat"]["contexts"], calls["replug"]["contexts"]):
        passages = [c[len("Knowledge: "): c.index("\nQuestion: ")] for c in rctx]
        assert ctx == [f"Knowledge: {passages[1]} {passages[0]}" + rctx[0][rctx[0].index("\nQuestion: "):]]
    rows = [json.loads(line) for line in open(os.path.join(workdir, "predictions.jsonl"))]
    for m, call in calls.items():
        assert [r[m]["prediction"] for r in rows] == [g.text.strip() for g in call["gens"]]


def test_mmlu_job_accuracy_per_category_and_subject(files, smollm2, tmp_path, monkeypatch):
    lm = RecordingLM(smollm2)
    mixtures = []

    def spy(option_lps, scores, temperature, num_choices=None):
        out = real_mixture(option_lps, scores, temperature, num_choices)
        mixtures.append((option_lps, np.asarray(scores), temperature, out[0]))
        return out

    real_mixture = mmlu.mixture_predictions
    monkeypatch.setattr(mmlu, "mixture_predictions", spy)
    results = run_job(mmlu_config(files, temperature=0.3), tmp_path, lm)
    saved = json.load(open(tmp_path / "results.json"))
    assert saved["task"] == "mmlu" and saved["count"] == 4 and saved["demos_removed_from_questions"] == 0
    rows = [json.loads(line) for line in open(tmp_path / "predictions.jsonl")]
    assert [r["id"] for r in rows] == ["ast-0", "phi-0", "ast-1", "ast-2"]  # subjects interleaved
    assert [r["answer"] for r in rows] == [1, 2, 0, 3]
    corpus_ids = {f"{i}#0" for i, _, _ in CORPUS}
    for r in rows:  # each method that retrieved names the passages it mixed, best first
        assert "none_passage_ids" not in r and r["replug_passage_ids"] == r["concat_passage_ids"]
        assert len(r["replug_passage_ids"]) == 2 and set(r["replug_passage_ids"]) <= corpus_ids
    for m in ("none", "replug", "concat"):
        acc = saved["accuracy"][m]
        correct = {s: [r[m] == r["answer"] for r in rows if r["subject"] == s] for s in ("astronomy", "philosophy")}
        assert acc["per_subject"] == pytest.approx({s: 100 * np.mean(v) for s, v in correct.items()})
        assert set(acc["per_category"]) == {MMLU_CATEGORIES["astronomy"], MMLU_CATEGORIES["philosophy"]}
        assert acc["per_category"]["STEM"]["questions"] == 3 and acc["per_category"]["Humanities"]["questions"] == 1
        assert acc["macro"] == pytest.approx(np.mean([100 * np.mean(v) for v in correct.values()]))
        assert acc["micro"] == pytest.approx(100 * np.mean(correct["astronomy"] + correct["philosophy"]))
        assert acc["questions"] == 4 and all(0 <= r[m] < 4 for r in rows)
    table = open(tmp_path / "results.md").read()
    for m in ("none", "replug", "concat"):
        assert sum(line.startswith(f"| {m} |") for line in table.splitlines()) == 1
    assert os.path.getsize(tmp_path / "accuracy.png") > 1000

    # what was scored: " A" .. " D" after the subject's dev shot + the Table 4 question block
    assert len(lm.score_calls) == 3 and all(c["continuations"] == [" A", " B", " C", " D"] * (len(c["contexts"]) // 4)
                                            for c in lm.score_calls)
    none, replug, concat = lm.score_calls
    dev = {r["subject"]: MCExample(r["id"], r["question"], tuple(r["choices"]), ord(r["answer"]) - 65, r["subject"])
           for r in MC_DEV}
    order = [next(q for q in MC_TEST if q["id"] == r["id"]) for r in rows]
    as_mc = lambda q: MCExample(q["id"], q["question"], tuple(q["choices"]), 0, q["subject"])  # noqa: E731
    expected_none = [mmlu.shots_block([dev[q["subject"]]], [None]) + mmlu.lettered_block(as_mc(q), None)
                     for q in order]
    assert none["contexts"] == [c for c in expected_none for _ in range(4)]
    assert len(replug["contexts"]) == 4 * 2 * 4 and len(concat["contexts"]) == 4 * 4
    for calls in (replug, concat):
        for c in calls["contexts"]:
            assert c.startswith("Knowledge: ") and c.count("Knowledge: ") == 2 and c.endswith("\nAnswer:")
    # the method's predictions follow from its scores: "none" is the argmax of its option log-probs; replug
    # mixes its k passes with the retrieval scores (best first) at the configured temperature
    lps = np.array([float(x[0]) for x in none["out"]]).reshape(4, 4)
    assert [r["none"] for r in rows] == list(lps.argmax(1))
    assert len(mixtures) == 3
    for m, call, (option_lps, scores, tau, predicted) in zip(("none", "replug", "concat"), lm.score_calls, mixtures):
        n = len(call["contexts"]) // 16
        np.testing.assert_array_equal(option_lps, np.array([float(x[0]) for x in call["out"]]).reshape(4, n, 4))
        assert [r[m] for r in rows] == [int(p) for p in predicted] and tau == 0.3
        if m == "replug":
            assert scores.shape == (4, 2) and (scores[:, 0] >= scores[:, 1]).all() and (scores[:, 0] > 0).all()
        else:
            assert scores.shape == (4, 1) and (scores == 0).all()
    assert results["accuracy"] == saved["accuracy"]


def test_subject_names_used_are_mmlu_subjects():
    assert {"astronomy", "philosophy"} <= set(MMLU_SUBJECTS)


# ---------------------------------------------------------------- bad input

def test_questions_without_answers_are_refused(files, smollm2, tmp_path):
    with pytest.raises(ValueError, match=r'no_answers\.jsonl, line 1: needs "answers"'):
        run_job(qa_config(files, questions=files["no_answers"]), tmp_path, smollm2)


def test_k_larger_than_the_datastore_is_refused(files, smollm2, tmp_path):
    with pytest.raises(ValueError, match=rf"k={len(CORPUS) + 1} is larger than the datastore \({len(CORPUS)} "):
        run_job(qa_config(files, k=len(CORPUS) + 1), tmp_path, smollm2)


def test_bogus_ensemble_in_the_job_is_refused(files, smollm2, tmp_path):
    with pytest.raises(ValueError, match="ensemble must be one of"):
        run_job(qa_config(files, ensemble="bogus", methods=("replug",)), tmp_path, smollm2)


# ---------------------------------------------------------------- demos, shots and choices (bugs found by these tests)

def test_demos_from_another_file_remove_no_question(files):
    demos = _jsonl(files["dir"] / "other_demos.jsonl", QUESTIONS[:1])  # no ids: "1", as the questions' first line
    questions, chosen, removed = job.load_sets(qa_config(files, demos=demos), "qa")
    assert [d.question for d in chosen] == [QUESTIONS[0]["question"]]
    assert removed == 0 and len(questions) == len(QUESTIONS)


def test_mmlu_shots_from_the_evaluated_file_are_not_scored(files):
    questions, dev, removed = job.load_sets(mmlu_config(files, demos=""), "mmlu")
    shots = {}
    for ex in dev:
        shots.setdefault(ex.subject, []).append(ex)
    used = {ex.id for s in shots.values() for ex in s[:1]}
    assert not used & {q.id for q in questions}


def test_mmlu_with_two_choices_predicts_one_of_them(files, smollm2, tmp_path):
    class PrefersD(RecordingLM):  # prefers " D" (no such option here), then " B"
        def score(self, contexts, continuations, progress=False):
            self.score_calls.append(list(continuations))
            return [np.array([{" D": -0.1, " B": -1.0}.get(c, -3.0)], np.float32) for c in continuations]

    test = _jsonl(tmp_path / "two.jsonl", [{"id": "t", "question": "Is the Sun a star?", "choices": ["yes", "no"],
                                            "answer": 0, "subject": "astronomy", "source": ["quiz", 3]}])
    lm = PrefersD(smollm2)
    run_job(mmlu_config(files, questions=test, methods=("none",)), tmp_path / "run", lm)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "predictions.jsonl")]
    assert rows[0]["none"] == 1  # " B": the better of the two letters offered; " D" was never a choice
    assert rows[0]["id"] == "t" and rows[0]["fields"] == {"source": ["quiz", 3]}  # the row's other fields, untouched
    assert {c for call in lm.score_calls for c in call} <= {" A", " B"}


def test_answer_bearing_demo_passages(files, smollm2, tmp_path):
    """demo_passages "answer": each demo gets its best-ranked passage that holds its gold answer (here not its
    top-1), falling back to the top-1 when none does; "top1" keeps the top-1."""
    config = qa_config(files)
    store = prepare.build_datastore(files["corpus"], smollm2.tokenizer, config.doc_tokens, str(tmp_path))
    encoder = rj.load_encoder("minilm")
    index = prepare.job_index(encoder, store, str(tmp_path), metric="cosine", factory="Flat",
                                embedding_dtype="float32")
    retriever = job.retrievers_for(config, encoder, store, index, str(tmp_path))["replug"]
    demos = [QAExample("d0", "Who is the mayor of Velmora?", ("Lisbon",)),  # only Fenn's passage says Lisbon
             QAExample("d1", "Who is the mayor of Velmora?", ("nobody at all",))]
    passages = lambda choose: [p for p in demo_passages.few_shot_prefix(retriever, store, demos, True, qa.demo_block,
                                                                        choose).split("\n\n") if p]
    top1, answer = passages("top1"), passages("answer")
    assert "Tobias Grint" in top1[0] and "Tobias Grint" in top1[1]
    assert "Lisbon" in answer[0] and "Tobias Grint" in answer[1]
    with pytest.raises(ValueError, match="demo_passages must be one of"):
        demo_passages.few_shot_prefix(retriever, store, demos, True, qa.demo_block, "best")


def test_vote_method_decodes_replugs_passes_and_votes(files, smollm2, tmp_path):
    """Method "vote" (beside "replug" in one job): the same retrieved passes, each decoded alone, and the
    prediction is the pass answer with the largest λ_i · exp(mean log-prob) summed per normalised string."""
    lm = RecordingLM(smollm2)
    results = run_job(qa_config(files, methods=("replug", "vote")), tmp_path, lm)
    replug_call, vote_call = lm.generate_calls
    assert vote_call["contexts"] == [[c] for ctx in replug_call["contexts"] for c in ctx]
    assert vote_call["shared_prefix"] == replug_call["shared_prefix"]
    rows = [json.loads(line) for line in open(tmp_path / "predictions.jsonl")]
    at = 0
    for row, log_w in zip(rows, replug_call["log_weights"]):
        gens = vote_call["gens"][at: at + len(log_w)]
        at += len(log_w)
        assert row["vote"]["passes"] == [g.text.strip() for g in gens]
        votes = {}
        for lw, g in zip(log_w, gens):
            key = normalize_answer(g.text.strip())
            votes[key] = votes.get(key, 0.0) + np.exp(lw + np.mean(g.logprobs))
        assert normalize_answer(row["vote"]["prediction"]) == max(votes, key=votes.get)
    assert set(results["exact_match"]) == {"replug", "vote"}


def test_sciq_corpus_is_support_paragraphs_plus_wikipedia(smollm2, tmp_path):
    from replug_jax.data import question_sets as data
    from replug_jax.data import wiki

    config = sibling_config(os.path.join(CONFIGS, "sciq.py"), "sciq.py")
    assert (config.questions, config.corpus, config.job) == ("sciq", "sciq", "qa")
    store = prepare.build_corpus(config.corpus, smollm2.tokenizer, config.doc_tokens, str(tmp_path))
    sources = set(store.sources)
    support = data.sciq_support_documents()
    assert {d.id for d in support} <= sources and {d.id for d in wiki.load_wiki_articles()} <= sources
    first = [t for t, src in zip(store.texts, store.sources) if src == support[0].id]
    assert "".join(first) == support[0].text  # chunks of a paragraph concatenate back to it


def test_a_multiple_choice_job_keeps_its_finished_methods_when_it_fails_and_resumes(files, smollm2, tmp_path):
    """Issue 60, item 4, for the mmlu job: results.json holds the numbers of the two methods finished before the LM
    failed in the third, marked incomplete; the same command rerun reads their scores back from the workdir's LM
    cache (the default) and gives an uninterrupted run's accuracies."""
    config = mmlu_config(files, methods=("none", "replug", "concat"), lm_cache="workdir")
    with pytest.raises(BlackBoxServerError, match="the server has gone"):
        run_job(config, tmp_path / "run", LMThatDiesInTheThirdMethod(smollm2, tmp_path / "run"))
    partial = json.load(open(tmp_path / "run" / "results.json"))
    assert partial["complete"] is False and partial["methods_finished"] == ["none", "replug"]
    assert set(partial["accuracy"]) == {"none", "replug"}
    resumed = run_job(config, tmp_path / "run", RecordingLM(smollm2))
    assert resumed["complete"] is True and resumed["lm_requests"]["cache_hits"] > 0
    whole = run_job(mmlu_config(files, methods=("none", "replug", "concat"), lm_cache=""), tmp_path / "whole",
                    RecordingLM(smollm2))
    assert {m: a["micro"] for m, a in resumed["accuracy"].items()} == {m: a["micro"] for m, a in whole["accuracy"].items()}
    assert {m: resumed["accuracy"][m] for m in ("none", "replug")} == partial["accuracy"]


def test_subjects_without_shots_are_warned_and_recorded(files, smollm2, tmp_path, capsys):
    """A subject with no demo shots is asked zero-shot: said on the console and listed in results.json."""
    dev = _jsonl(tmp_path / "dev_astronomy.jsonl", [MC_DEV[0]])
    results = run_job(mmlu_config(files, demos=dev, methods=("none",)), tmp_path / "run", RecordingLM(smollm2))
    assert results["zero_shot_subjects"] == ["philosophy"]
    assert json.load(open(tmp_path / "run" / "results.json"))["zero_shot_subjects"] == ["philosophy"]
    assert "no shots for subjects philosophy" in capsys.readouterr().out
    full = run_job(mmlu_config(files, methods=("none",)), tmp_path / "full", RecordingLM(smollm2))
    assert full["zero_shot_subjects"] == []


def test_runs_over_one_corpus_share_the_cache_dir(files, smollm2, tmp_path, capsys):
    """cache_dir holds datastore, embeddings and index: a second run (another task, another workdir) reuses them;
    with a shared lm_cache it decodes no answer either (a killed QA job resumes at the questions it reached)."""
    shared = tmp_path / "shared"
    config = qa_config(files, methods=("none",), cache_dir=str(shared), lm_cache=str(shared / "lm.sqlite"))
    lms, results = [RecordingLM(smollm2), RecordingLM(smollm2)], []
    for name, lm in zip("ab", lms):
        results.append(run_job(config, tmp_path / name, lm))
    out = capsys.readouterr().out
    assert out.count("(embedded and built)") == 1 and out.count("(reused)") == 1
    assert (shared / "index_dense").is_dir() and (shared / "datastore.jsonl").is_file()
    assert not (tmp_path / "a" / "index_dense").exists() and (tmp_path / "b" / "results.json").is_file()
    asked = results[0]["count"]
    assert len(lms[0].generate_calls) == 1 and lms[1].generate_calls == []
    assert results[0]["lm_requests"]["generations_decoded"] == asked
    assert results[1]["lm_requests"]["generations_from_cache"] == asked  # recorded in results.json
    rows = [[json.loads(line)["none"] for line in open(tmp_path / name / "predictions.jsonl")] for name in "ab"]
    assert rows[0] == rows[1]


def test_unknown_methods_are_refused(files, smollm2, tmp_path):
    with pytest.raises(ValueError, match=r"--config.methods='none,vote': unknown method 'vote'; the mmlu job knows"):
        run_job(mmlu_config(files, methods=("none", "vote")), tmp_path, RecordingLM(smollm2))
    with pytest.raises(ValueError, match=r"--config.methods='replgu': unknown method 'replgu'; the qa job knows"):
        run_job(qa_config(files, methods=("replgu",)), tmp_path, RecordingLM(smollm2))


def test_reports_label_what_ran():
    """Multiple choice outside MMLU's subjects is not printed as MMLU; QA tables say τ."""
    from replug_jax.jobs import downstream_report

    acc = {"none": {"micro": 40.0, "macro": 40.0, "per_subject": {"sciq": 40.0}, "per_category": {}}}
    table = downstream_report.mmlu_table({"accuracy": acc, "questions_source": "sciq", "count": 10, "shots": 4,
                                          "k": 4})
    assert table.startswith("Multiple choice (sciq), 10 questions") and "| none | 40.0 |" in table
    assert "MMLU" not in table and "Humanities" not in table
    mmlu = {"none": {"micro": 50.0, "macro": 50.0, "per_subject": {"astronomy": 50.0},
                     "per_category": {"STEM": {"macro": 50.0}}}}
    assert downstream_report.mmlu_table({"accuracy": mmlu, "count": 2, "shots": 5, "k": 4}).startswith("MMLU, 2")
