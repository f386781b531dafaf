"""Retrieval given as a file: the field's retrieval results read as a datastore of their passages and a retriever
that answers each question with its own given passages, so REPLUG runs on a retrieval it did not compute (DPR's top-100
of 21M Wikipedia passages, say) without embedding a corpus.

    given = read_given(["nq-test.json"])          # every passage once in given.store (a Datastore)
    given.check_queries(questions, queries)        # each evaluated question has its row (by id or text), or refused
    scores, rows = given.retrieve(queries, k)      # [Q, k] its passages, best first, their given scores

Formats: JSON (a list of rows, as DPR's dense_retriever.py writes them) or JSON Lines, one row per question:

    {"question" (or "query"), "answers"?, "id"?, "ctxs": [{"id"?, "title"?, "text" (or "retrieval text"),
     "score" (or "retrieval score")?, "has_answer"?, ...}, ...]}

DPR's and FiD's files; RulinShao/RAG-evaluation-harnesses' {"query", "ctxs"} with "retrieval text" and
"retrieval score"; and the QA job's own retrieval.jsonl. A passage's score is its s in λ = softmax(s / τ), as the
file gives it (DPR's are unnormalised inner products in the tens: τ divides them as they are, see `score_kind`);
passages are ranked by score, the file's order breaking ties. A file without any score is ranked as given, every s
0 (λ uniform over the k first), and said. A passage's other keys are kept as its own fields (as a document's),
except those that belong to its question ("score", "has_answer"). Two rows naming one passage id with different
texts are refused; passages without an id are named by their row and rank.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import numpy as np

from replug_jax.base.errors import InputError, invalid_json
from replug_jax.retrieval.datastore import Datastore

QUESTION_KEYS = ("question", "query")  # DPR/FiD's, RAG-evaluation-harnesses'
TEXT_KEYS = ("text", "retrieval text")
SCORE_KEYS = ("score", "retrieval score")
PER_QUESTION_KEYS = SCORE_KEYS + ("has_answer",)  # a ctx's keys that belong to its question, not to the passage
PASSAGE_KEYS = ("id", "title") + TEXT_KEYS + PER_QUESTION_KEYS
SHOWN = 3  # questions named in a refusal


def question_key(text: str) -> str:
    """How a query is matched to a file's question: its words, whitespace collapsed."""
    return " ".join(str(text).split())


@dataclasses.dataclass(frozen=True)
class GivenRow:
    """One question of the file: its id (None: not given), text, gold answers, the row's other fields, and its
    passages as datastore rows [D] with their scores [D] float32, best first."""

    id: str | None
    question: str
    answers: tuple
    fields: tuple
    rows: np.ndarray
    scores: np.ndarray
    where: str


class GivenRetrieval:
    """The rows of one or more retrieval files over one datastore of every passage they name (see the module
    docstring); `retrieve(queries, k)` is the retrievers' interface (retrieval/retriever.py)."""

    def __init__(self, paths: Sequence[str], rows: list[GivenRow], store: Datastore, scored: bool):
        self.paths, self.rows, self.datastore, self.scored = list(paths), rows, store, scored
        self.by_text: dict[str, GivenRow] = {}
        self.by_id: dict[str, GivenRow] = {}
        self.conflicting: set[str] = set()  # question texts two rows give different passages
        for row in rows:
            key = question_key(row.question)
            seen = self.by_text.setdefault(key, row)
            if seen is not row and not np.array_equal(seen.rows, row.rows):
                self.conflicting.add(key)
            if row.id is not None:
                self.by_id.setdefault(row.id, row)

    @property
    def store(self) -> Datastore:
        return self.datastore

    def score_kind(self) -> str:
        """What the file's scores are, for results.json and the τ note."""
        if not self.scored:
            return "none given: ranked as given, λ uniform over the k first"
        values = np.concatenate([r.scores for r in self.rows if len(r.scores)])
        low, high = float(values.min()), float(values.max())
        if -1.0 <= low and high <= 1.0:
            return f"given, within [-1, 1] (cosine-like; {low:.3g} to {high:.3g})"
        return f"given, unnormalised ({low:.3g} to {high:.3g}: inner products as DPR's; τ divides them as given)"

    def row_for(self, query: str) -> GivenRow:
        """The file's row of a query (by its text), or InputError."""
        row = self.by_text.get(question_key(query))
        if row is None:
            raise InputError(f"the retrieval file{'s' if len(self.paths) > 1 else ''} {', '.join(self.paths)} "
                             f"hold{'' if len(self.paths) > 1 else 's'} no row for the query {query[:80]!r}")
        return row

    def check_queries(self, examples, queries: Sequence[str], what: str = "questions", fix: str = "") -> None:
        """Refuse, before a model loads, evaluated `examples` (with .id and .question; `queries`: the text each is
        retrieved for) that the files hold no row for (`fix`: what to do, in the refusal), whose id names a row of
        another question, or whose text two rows give different passages."""
        missing, mismatched, ambiguous = [], [], []
        for example, query in zip(examples, queries):
            by_id = self.by_id.get(str(example.id)) if getattr(example, "id_given", True) else None
            key = question_key(query)
            if by_id is not None and question_key(by_id.question) != key:
                mismatched.append(f"id {example.id!r}: {query[:60]!r} here, {by_id.question[:60]!r} in "
                                  f"{by_id.where}")
            elif key not in self.by_text:
                missing.append(repr(query[:60]))
            elif key in self.conflicting:
                ambiguous.append(repr(query[:60]))
        files = ", ".join(self.paths)
        if mismatched:
            raise InputError(f"{len(mismatched)} {what} do not match the retrieval file {files} by id (the file was "
                             f"made for other questions?): {'; '.join(mismatched[:SHOWN])}")
        if missing:
            raise InputError(f"{len(missing)} of {len(examples)} {what} have no row in the retrieval file {files} "
                             f"(matched by question text): {', '.join(missing[:SHOWN])}"
                             + (" and more" if len(missing) > SHOWN else "") + (f": {fix}" if fix else ""))
        if ambiguous:
            raise InputError(f"{len(ambiguous)} {what} appear in {files} twice with different passages: "
                             f"{', '.join(ambiguous[:SHOWN])}: keep one row each")

    def shortest(self, queries: Sequence[str]) -> tuple[int, str]:
        """(fewest passages any of `queries` is given, where that row is)."""
        rows = [self.row_for(q) for q in queries]
        row = min(rows, key=lambda r: len(r.rows))
        return len(row.rows), row.where

    def check_k(self, k: int, queries: Sequence[str] | None = None, key: str = "k") -> None:
        """Refuse a k above the fewest passages the file gives any of `queries` (None: any of its questions),
        naming that row."""
        asked = [r.question for r in self.rows] if queries is None else queries
        fewest, where = self.shortest(asked)
        if k > fewest:
            of = " of the questions asked" if queries is not None else ""
            raise InputError(f"{key}={k} is more than the {fewest} passages {where} gives (the shortest list{of}): "
                             f"lower {key} to at most {fewest}")

    def retrieve(self, query_texts, k, exclude_sources=None):
        """(scores [Q, k] float32, datastore rows [Q, k] int64): each query's first k given passages (-inf / -1
        where it has fewer)."""
        if isinstance(query_texts, str):
            raise TypeError("retrieve takes a list of query texts, not a single string")
        if exclude_sources is not None:
            raise ValueError("a given retrieval excludes nothing: its passages are the file's")
        queries = list(query_texts)
        scores = np.full((len(queries), k), -np.inf, np.float32)
        rows = np.full((len(queries), k), -1, np.int64)
        for i, query in enumerate(queries):
            row = self.row_for(query)
            n = min(k, len(row.rows))
            scores[i, :n], rows[i, :n] = row.scores[:n], row.rows[:n]
        return scores, rows


def read_rows(path: str) -> list[tuple[dict, str]]:
    """(row, where) of a JSON file (a list of rows) or a JSON Lines file."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such retrieval file")
    with open(path, encoding="utf-8") as f:
        try:
            text = f.read()
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: not UTF-8 text ({e.reason})") from None
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise invalid_json(path, e) from None
        return [(row, f"{path}, row {i + 1}") for i, row in enumerate(rows)]
    out = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                out.append((json.loads(line), f"{path}, line {line_no}"))
            except json.JSONDecodeError as e:
                raise invalid_json(f"{path}, line {line_no}", e) from None
    return out


def is_retrieval_file(path: str) -> bool:
    """Whether `path` is a retrieval file: a .json file, or JSON Lines whose first row has "ctxs"."""
    if not os.path.isfile(path):
        return False
    if path.endswith(".json"):
        return True
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    first = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(first, dict) and "ctxs" in first
    return False


def _first(record: dict, keys: Sequence[str]):
    return next((record[key] for key in keys if key in record), None)


def read_given(paths: Sequence[str] | str) -> GivenRetrieval:
    """The rows of the retrieval files `paths` (a comma-separated string or a list) over one datastore of their
    passages (see the module docstring); malformed rows refused naming file and row."""
    paths = [p for p in (paths.split(",") if isinstance(paths, str) else paths) if p]
    if not paths:
        raise InputError("no retrieval file given")
    ids, titles, texts, fields = [], [], [], {}
    row_of_id: dict[str, int] = {}
    parsed = []  # (record, where, [(datastore row, score or None)])
    for path in paths:
        for number, (record, where) in enumerate(read_rows(path), start=1):
            question = _first(record, QUESTION_KEYS) if isinstance(record, dict) else None
            if not isinstance(question, str) or not question.strip():
                raise InputError(f"{where}: expected an object with a non-empty string \"question\" (or \"query\")")
            ctxs = record.get("ctxs")
            if not isinstance(ctxs, list):
                raise InputError(f"{where}: needs \"ctxs\", a list of passages ({{\"id\", \"title\", \"text\", "
                                 "\"score\"}}); a questions file without retrieval is --config.questions")
            passages = []
            for rank, ctx in enumerate(ctxs):
                text = _first(ctx, TEXT_KEYS) if isinstance(ctx, dict) else None
                if not isinstance(text, str):
                    raise InputError(f"{where}, ctxs[{rank}]: expected an object with a string \"text\" (or "
                                     "\"retrieval text\")")
                if not text.strip():
                    raise InputError(f"{where}, ctxs[{rank}]: a passage without text")
                title = str(ctx.get("title") or "")
                pid = str(ctx["id"]) if ctx.get("id") is not None else f"{os.path.basename(path)}:{number}:{rank}"
                if pid in row_of_id:
                    r = row_of_id[pid]
                    if (texts[r], titles[r]) != (text, title):
                        raise InputError(f"{where}, ctxs[{rank}]: passage id {pid!r} is given another text or title "
                                         "than before: one id, one passage")
                else:
                    row_of_id[pid] = r = len(ids)
                    ids.append(pid), titles.append(title), texts.append(text)
                    own = {key: value for key, value in ctx.items() if key not in PASSAGE_KEYS}
                    if own:
                        fields[pid] = own
                score = _first(ctx, SCORE_KEYS)
                if score is not None:
                    try:
                        score = float(score)
                    except (TypeError, ValueError):
                        raise InputError(f"{where}, ctxs[{rank}]: score {score!r} is not a number") from None
                    if not np.isfinite(score):
                        raise InputError(f"{where}, ctxs[{rank}]: score {score!r} is not finite")
                passages.append((r, score))
            parsed.append((record, where, question, passages))
    if not parsed:
        raise InputError(f"{', '.join(paths)}: no rows (empty file)")
    if not ids:
        raise InputError(f"{', '.join(paths)}: no row gives any passage (every \"ctxs\" is empty)")
    given = [s is not None for *_, passages in parsed for _, s in passages]
    scored = any(given)
    if scored and not all(given):
        record, where, _, passages = next(p for p in parsed if any(s is None for _, s in p[3]))
        rank = next(i for i, (_, s) in enumerate(passages) if s is None)
        raise InputError(f"{where}, ctxs[{rank}]: no \"score\" where other passages have one: give every passage "
                         "its score, or none (then ranked as given)")
    rows = [_given_row(record, where, question, passages, scored) for record, where, question, passages in parsed]
    store = Datastore(ids, titles, texts, list(ids), fields)
    return GivenRetrieval(paths, rows, store, scored)


def _given_row(record: dict, where: str, question: str, passages, scored: bool) -> GivenRow:
    """One file row: its passages ranked by score (stable: the file's order breaks ties; unscored: as given)."""
    rows = np.asarray([r for r, _ in passages], np.int64)
    scores = np.asarray([s if scored else 0.0 for _, s in passages], np.float32)
    order = np.argsort(-scores, kind="stable")
    answers = record.get("answers", record.get("answer", ()))
    answers = (answers,) if isinstance(answers, str) else tuple(str(a) for a in answers or ())
    kept = tuple((key, value) for key, value in record.items()
                 if key not in (*QUESTION_KEYS, "answers", "answer", "id", "ctxs"))
    rid = str(record["id"]) if record.get("id") is not None else None
    return GivenRow(rid, question, answers, kept, rows[order], scores[order], where)
