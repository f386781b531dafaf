"""Retrieval given as a file (retrieval/given.py; issue 83): DPR's / FiD's retrieval results in, the jobs' own
retrieval.jsonl out, and the one read back as the other.

A job's retrieval.jsonl (with retrieval_demos.jsonl) read back with --config.retrieval_file gives the very predictions
and numbers of the run that wrote it, for every QA method and the multiple-choice job, and the REPLUG object over it
answers as the job did; a hand-made DPR file's scores give λ = a numpy softmax(s / τ), its passages ranked by score;
a file without scores ranks as given, λ uniform, said; non-ASCII passages come back byte for byte; and the mistakes
(k above the shortest list, a questions file the retrieval was not made for, half-scored files, one id for two
passages) are refused naming them before any model loads.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import replug_jax as rj
from replug_jax.base.errors import InputError
from replug_jax.jobs import downstream as job
from replug_jax.jobs.input_checks import check_job_inputs
from replug_jax.retrieval.given import read_given
from tests.test_downstream import CORPUS, MC_DEV, MC_TEST, QUESTIONS, _jsonl, mmlu_config, qa_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("replug", "replug_posterior")  # the core suite's; every method: the slow test below
# what must come back the same for each method (the answer NLL and the posterior's weights among them)
SAME = ("prediction", "exact_match", "answer_nll", "passage_ids", "passage_scores", "log_weights", "kept_ranks")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("given_data")
    return {"corpus": _jsonl(d / "corpus.jsonl", [{"id": i, "title": t, "text": x} for i, t, x in CORPUS]),
            "questions": _jsonl(d / "questions.jsonl", QUESTIONS),
            "mc_test": _jsonl(d / "mc_test.jsonl", MC_TEST), "mc_dev": _jsonl(d / "mc_dev.jsonl", MC_DEV), "dir": d}


def _rows(workdir, name="predictions.jsonl"):
    with open(os.path.join(workdir, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _given_files(workdir) -> str:
    return ",".join(os.path.join(workdir, n) for n in ("retrieval.jsonl", "retrieval_demos.jsonl"))




def _same_predictions(first, second, methods, same_ids: bool = True):
    """same_ids False: the questions of two files without ids, whose ids are their line numbers in each."""
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert (a["id"] if same_ids else None, a["question"]) == (b["id"] if same_ids else None, b["question"])
        for m in methods:
            for key in SAME:
                assert a[m].get(key) == b[m].get(key), (m, key, a["question"])


@pytest.mark.parametrize("methods", [METHODS, pytest.param(("none",) + METHODS + ("concat", "vote"),
                                                             marks=pytest.mark.slow, id="every_method")])
def test_a_qa_run_read_back_from_its_retrieval_file_gives_its_numbers(files, smollm2, tmp_path, methods):
    """The posterior re-ranks 3 for k 2, within the given passages when read back."""
    own_dir = str(tmp_path / "own")
    own = job.run_downstream(qa_config(files, methods=methods, rerank_depth=3, lm_cache=""), own_dir, lm=smollm2)
    config = qa_config(files, methods=methods, rerank_depth=3, lm_cache="", corpus="",
                       retrieval_file=_given_files(own_dir))
    given = job.run_downstream(config, str(tmp_path / "given"), lm=smollm2)
    for key in ("exact_match", "answer_recall", "answer_nll", "empty_answers", "count"):
        assert given[key] == own[key], key
    assert {**given["retrieval"], "score": None, "given_by": None} == {**own["retrieval"], "score": None,
                                                                       "given_by": None}  # what a score is: below
    assert given["retrieval"]["given_by"] == _given_files(own_dir).split(",")
    assert f"Retrieval (given by {_given_files(own_dir).replace(',', ', ')}, scores given, within" in open(
        os.path.join(tmp_path, "given", "results.md"), encoding="utf-8").read()
    _same_predictions(_rows(own_dir), _rows(tmp_path / "given"), methods)
    assert _rows(own_dir, "retrieval.jsonl") == _rows(tmp_path / "given", "retrieval.jsonl")  # it writes the same
    assert given["encoder"] is None and given["corpus"] is None and given["compute_dtypes"]["encoder"] is None
    record = given["retrieval_given"]
    assert record["files"] == _given_files(own_dir).split(",") and record["scored"]
    assert record["score_kind"].startswith("given, within [-1, 1]")  # MiniLM's cosine scores
    scores = [r["ctxs"] for r in _rows(own_dir, "retrieval.jsonl")]
    gap = np.median([c[0]["score"] - c[1]["score"] for c in scores])  # k = 2
    assert record["median_top_to_kth_score_gap"] == pytest.approx(gap, abs=1e-6)
    assert record["median_top_to_kth_weight_ratio"] == pytest.approx(np.exp(gap / config.temperature), rel=1e-5)

    # the REPLUG object over the same file answers as the job, after the same demo with its given passage
    rag = rj.REPLUG.from_retrieval_file(_given_files(own_dir), lm=smollm2, k=2, temperature=config.temperature,
                                        weights="replug")
    demo = (QUESTIONS[0]["question"], QUESTIONS[0]["answers"][0])
    for row in _rows(own_dir)[:2]:
        assert rag.answer(row["question"], max_new_tokens=config.max_new_tokens, demos=[demo]) == \
            row["replug"]["prediction"]
    if "none" not in methods:
        return
    # the questions and answers from the retrieval file itself (the demo from the questions file), same numbers
    alone = job.run_downstream(qa_config(files, methods=("replug",), lm_cache="", corpus="", demos=files["questions"],
                                         questions="", retrieval_file=_given_files(own_dir)),
                               str(tmp_path / "alone"), lm=smollm2)
    assert alone["exact_match"]["replug"] == own["exact_match"]["replug"]
    assert alone["answer_nll"]["replug"] == own["answer_nll"]["replug"]
    # the questions file gives no ids: its rows are numbered by their lines there (the demo first), and the retrieval
    # file's by theirs (a line number is no id in another file, so retrieval.jsonl writes none)
    _same_predictions(_rows(own_dir), _rows(tmp_path / "alone"), ("replug",), same_ids=False)


@pytest.mark.slow
def test_a_multiple_choice_run_read_back_from_its_retrieval_file_gives_its_numbers(files, smollm2, tmp_path):
    methods = ("none", "replug", "concat")
    own = job.run_downstream(mmlu_config(files, methods=methods, lm_cache=""), str(tmp_path / "own"), lm=smollm2)
    gold = {q["id"]: q["choices"][q["answer"] if isinstance(q["answer"], int) else "ABCD".index(q["answer"])]
            for q in MC_TEST}  # has_answer of the correct option's text
    assert {r["id"]: r["answers"] for r in _rows(tmp_path / "own", "retrieval.jsonl")} == {
        i: [g] for i, g in gold.items()}
    given = job.run_downstream(mmlu_config(files, methods=methods, lm_cache="", corpus="",
                                           retrieval_file=_given_files(tmp_path / "own")),
                               str(tmp_path / "given"), lm=smollm2)
    assert given["accuracy"] == own["accuracy"]
    assert given["retrieval"]["dpr_top_k_accuracy"] == own["retrieval"]["dpr_top_k_accuracy"]
    for a, b in zip(_rows(tmp_path / "own"), _rows(tmp_path / "given")):
        for m in methods:
            assert a[m] == b[m], m


# ---------------------------------------------------------------- a hand-made DPR file

HAND = [  # DPR's format, the passages NOT in score order; a Cyrillic, CJK, emoji and accented passage among them
    {"id": "q1", "question": "Who is the mayor of Velmora?", "answers": ["Tobias Grint"], "source": "hand",
     "ctxs": [{"id": "p-fenn", "title": "Marisol Fenn", "text": "Marisol Fenn is a painter born in Lisbon.",
               "score": 71.5, "has_answer": False, "url": "https://example.org/fenn"},
              {"id": "p-velmora", "title": "Velmora", "text": "Velmora is a town whose mayor is Tobias Grint.",
               "score": 74.25, "has_answer": True},
              {"id": "p-ru", "title": "Велмора", "text": "Мэр города Велмора — Тобиас Гринт. 🏛️", "score": 72.0}]},
    {"id": "q2", "question": "What color is the flag of Quenland?", "answers": ["green"],
     "ctxs": [{"id": "p-quen", "title": "Quenland", "text": "The flag of Quenland is green with a white star.",
               "score": 80.0},
              {"id": "p-zh", "title": "昆兰", "text": "昆兰的国旗是绿色的，上面有一颗白星。Drapeau vert, étoile blanche.",
               "score": 79.0},
              {"id": "p-velmora", "title": "Velmora", "text": "Velmora is a town whose mayor is Tobias Grint.",
               "score": 60.5}]},
]


def _hand_file(path, rows=HAND, as_json=False):
    with open(path, "w", encoding="utf-8") as f:
        if as_json:
            json.dump(rows, f, ensure_ascii=False)
        else:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return str(path)


def _hand_config(files, path, **overrides):
    return qa_config(files, **{**dict(questions="", demos="", corpus="", shots=0, retrieval_file=path,
                                      methods=("replug",), k=3, temperature=2.0, max_new_tokens=2, lm_cache=""),
                               **overrides})


def test_a_hand_made_dpr_file_mixes_with_a_numpy_softmax_of_its_scores(files, smollm2, tmp_path):
    path = _hand_file(tmp_path / "hand.json", as_json=True)  # DPR's retriever writes one JSON list
    results = job.run_downstream(_hand_config(files, path), str(tmp_path / "run"), lm=smollm2)
    rows = _rows(tmp_path / "run")
    assert [r["id"] for r in rows] == ["q1", "q2"] and rows[0]["fields"] == {"source": "hand"}
    for row, hand in zip(rows, HAND):
        ranked = sorted(hand["ctxs"], key=lambda c: -c["score"])  # best first, as DPR ranks them
        s = np.array([c["score"] for c in ranked], np.float64) / 2.0
        log_softmax = s - np.log(np.sum(np.exp(s - s.max()))) - s.max()
        assert row["replug"]["passage_ids"] == [c["id"] for c in ranked]
        np.testing.assert_allclose(row["replug"]["log_weights"], log_softmax, atol=2e-6)
    assert "unnormalised" in results["retrieval_given"]["score_kind"]  # DPR's inner products, said
    written = _rows(tmp_path / "run", "retrieval.jsonl")
    for got, hand in zip(written, HAND):  # texts byte for byte, ids, titles and a passage's own fields kept
        by_id = {c["id"]: c for c in hand["ctxs"]}
        for c in got["ctxs"]:
            assert (c["text"], c["title"]) == (by_id[c["id"]]["text"], by_id[c["id"]]["title"])
        assert got["ctxs"][-1 if hand["id"] == "q1" else 0].get("url") == (
            "https://example.org/fenn" if hand["id"] == "q1" else None)


def test_a_file_without_scores_is_ranked_as_given_with_uniform_weights_and_said(files, smollm2, tmp_path, capsys):
    rows = [{**row, "ctxs": [{k: v for k, v in c.items() if k != "score"} for c in row["ctxs"]]} for row in HAND]
    rows = [{"query": r["question"], "answers": r["answers"], "ctxs": [{"retrieval text": c["text"],
                                                                          "title": c["title"], "id": c["id"]}
                                                                         for c in r["ctxs"]]} for r in rows]
    path = _hand_file(tmp_path / "unscored.jsonl", rows)  # RAG-evaluation-harnesses' {"query", "ctxs"} keys
    results = job.run_downstream(_hand_config(files, path), str(tmp_path / "run"), lm=smollm2)
    assert "ranked as given" in capsys.readouterr().out and not results["retrieval_given"]["scored"]
    for row, hand in zip(_rows(tmp_path / "run"), HAND):
        assert row["replug"]["passage_ids"] == [c["id"] for c in hand["ctxs"]]  # the file's order
        np.testing.assert_allclose(row["replug"]["log_weights"], np.log(np.full(3, 1 / 3)), atol=1e-6)


# ---------------------------------------------------------------- refused, before a model loads

def test_k_above_the_shortest_list_is_refused_before_a_model_loads(files, tmp_path):
    short = [HAND[0], {**HAND[1], "ctxs": HAND[1]["ctxs"][:2]}]
    path = _hand_file(tmp_path / "short.jsonl", short)
    run = subprocess.run(
        [sys.executable, "-m", "replug_jax.main", "--config", os.path.join(ROOT, "experiments", "configs", "qa.py"),
         "--workdir", str(tmp_path / "run"), f"--config.retrieval_file={path}", "--config.shots=0",
         "--config.k=3"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"--config.k=3 is more than the 2 passages {path}, line 2 gives" in run.stderr
    assert "models:" not in run.stdout  # refused before any model loaded


def test_mistaken_files_are_refused_naming_the_problem(files, tmp_path):
    def refused(rows, match, **overrides):
        path = _hand_file(tmp_path / f"bad{len(os.listdir(tmp_path))}.jsonl", rows)
        with pytest.raises(InputError, match=match):
            job.run_downstream(_hand_config(files, path, **overrides), str(tmp_path / "run"), lm=None)

    # questions the file was not made for: by text, and by id
    refused(HAND, r"3 of 4 questions have no row in the retrieval file .* \(matched by question text\): "
                  r"'Which river feeds Darrow Lake\?'", questions=files["questions"], demos=files["questions"], shots=1)
    renamed = [{**HAND[0], "question": "Who was the first mayor of Velmora?"}, HAND[1]]
    refused(renamed, r"1 questions do not match the retrieval file .* by id", questions=_hand_file(
        tmp_path / "questions_by_id.jsonl", [{"id": "q1", "question": HAND[0]["question"], "answers": ["x"]}]))
    # half-scored, one id for two texts, a passage without text
    half = [HAND[0], {**HAND[1], "ctxs": [{k: v for k, v in c.items() if k != "score"} for c in HAND[1]["ctxs"]]}]
    refused(half, r"line 2, ctxs\[0\]: no \"score\" where other passages have one")
    twice = [HAND[0], {**HAND[1], "ctxs": [{**HAND[1]["ctxs"][0], "id": "p-fenn"}] + HAND[1]["ctxs"][1:]}]
    refused(twice, r"passage id 'p-fenn' is given another text or title than before")
    empty = [{**HAND[0], "ctxs": [{**HAND[0]["ctxs"][0], "text": " "}] + HAND[0]["ctxs"][1:]}]
    refused(empty, r"line 1, ctxs\[0\]: a passage without text")
    with pytest.raises(InputError, match="replug_lsr"):  # an LSR retriever cannot read a given retrieval
        check_job_inputs(_hand_config(files, _hand_file(tmp_path / "ok.jsonl"), methods=("replug", "replug_lsr"),
                                      retriever_workdir=str(tmp_path)))


def test_dprs_json_list_is_taken_as_the_questions_file_and_a_plain_json_list_refused(files, tmp_path):
    """Questions and answers may come from the retrieval file itself, named as --config.questions too: DPR's
    retriever writes one JSON list, which the questions check refused as "a JSON array" the job does not read."""
    path = _hand_file(tmp_path / "hand.json", as_json=True)
    check_job_inputs(_hand_config(files, path, questions=path, demos=path))
    assert [q.id for q in job.load_sets(_hand_config(files, path, questions=path), "qa")[0]] == ["q1", "q2"]
    plain = _hand_file(tmp_path / "plain.json", [{"question": r["question"], "answers": r["answers"]} for r in HAND],
                       as_json=True)
    with pytest.raises(InputError, match=r"is a JSON array file, which the job does not read: give JSON Lines .*, "
                                         r"or a DPR/FiD retrieval file"):
        check_job_inputs(_hand_config(files, path, questions=plain))


def test_the_reader_keeps_every_passage_once_and_its_own_fields(tmp_path):
    given = read_given(_hand_file(tmp_path / "hand.jsonl"))
    assert len(given.store) == 5  # p-velmora once, though two questions are given it
    assert given.store.fields == {"p-fenn": {"url": "https://example.org/fenn"}}  # score, has_answer: the question's
    scores, rows = given.retrieve(["  Who is the mayor\nof Velmora? "], 4)  # whitespace aside, the question's text
    assert [given.store.ids[r] for r in rows[0][:3]] == ["p-velmora", "p-ru", "p-fenn"] and rows[0][3] == -1
    assert scores[0].tolist()[:3] == [74.25, 72.0, 71.5] and scores[0][3] == -np.inf
    with pytest.raises(InputError, match="no row for the query 'Who painted'"):
        given.retrieve(["Who painted"], 1)
