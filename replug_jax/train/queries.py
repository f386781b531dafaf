"""REPLUG LSR training queries: text windows of training documents (§5.2), or question–answer pairs.

Text windows: each example is a window of `query_tokens + continuation_tokens` LM tokens of a training
document: the first part is the query x (what is retrieved for), the second the continuation y (what the
LM scores). Training documents must be disjoint from the datastore's, or retrieval becomes trivial (the
passage that contains y is retrieved).

Question–answer pairs (`qa_training_examples`): the retriever embeds the question (as the QA evaluation
retrieves), x is the question as the QA prompt presents it without demos ("Question: ...\nAnswer:"), after
the document as `passages.QA_DOC_TEMPLATE` writes it, and y is the gold answer with its leading space. So
ℓ_k = log p(y | d_k ∘ x) is the score of exactly the pass the QA evaluation builds; no passage is excluded
from a question's retrieval (a question is not a datastore document). Training questions must be disjoint
from the evaluated ones (`check_disjoint_questions`: by normalised text, and by the ids the data gave).
With LSR's question target (ℓ_k = log p(x | d_k)) y is never read, and questions need no answers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os

import numpy as np

from replug_jax.base.errors import InputError
from replug_jax.data.answers import normalize_answer
from replug_jax.method.passages import question_block
from replug_jax.models.tokenizer import TextTokenizer, token_starts


@dataclasses.dataclass(frozen=True)
class TrainExample:
    query: str  # what the retriever embeds (text windows: also x, query_tokens tokens)
    continuation: str  # y: what the LM scores (the next continuation_tokens tokens, or the gold answer)
    prompt: str | None = None  # x as the LM reads it after the document, when it is not the query itself
    excluded_sources: tuple[str, ...] = ()  # datastore sources never retrieved for it (text windows: its document)
    question_id: str | None = None  # question-answer pairs: the id the data gave the question (None: none given)

    @property
    def lm_prefix(self) -> str:
        """x: the text between the document and y in the LM's pass."""
        return self.query if self.prompt is None else self.prompt


QA_SOURCES = ("nq_open", "trivia_qa", "sciq")  # packaged question-answer sets LSR can train on
SCIQ_TRAIN_OFFSET = 300  # "sciq" trains from this row on: the rows before are sciq.py's demos and evaluated questions


def first_training_row(train_data: str, train_offset: int | None) -> int:
    """The first row of `train_data` that LSR trains on: `train_offset` when set, else SCIQ_TRAIN_OFFSET for the
    packaged "sciq" and 0 for any other source (a user's file trains on all its rows)."""
    if train_offset is None:
        return SCIQ_TRAIN_OFFSET if train_data == "sciq" else 0
    if isinstance(train_offset, bool) or not isinstance(train_offset, int) or train_offset < 0:
        raise InputError(f"{train_offset!r} is not a row count: give 0 or more (rows of train_data skipped)")
    return train_offset


def trains_on_questions(train_data: str) -> bool:
    """Whether `train_data` names question–answer pairs (a packaged QA set, or a JSONL whose first row has a
    "question") rather than documents."""
    if train_data in QA_SOURCES or train_data.startswith("tfds:") and train_data.count(":") == 4:
        return True
    if train_data.endswith(".jsonl") and os.path.isfile(train_data):
        with open(train_data, encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "{}")
        try:
            return "question" in json.loads(first)
        except json.JSONDecodeError:
            return False
    return False


def qa_training_examples(questions, *, seed: int = 0, max_examples: int | None = None,
                         target: str = "answer") -> list[TrainExample]:
    """One example per question (`QAExample`s, in the order given, then shuffled with `seed`): query the
    question, x its closed-book QA block, y its first gold answer with a leading space. `target="answer"` keeps
    the questions with a gold answer; "question" (LSR scores x itself) keeps every question, y "" where none."""
    answered = lambda q: bool(q.answers) and bool(q.answers[0].strip())  # noqa: E731
    examples = [TrainExample(q.question, f" {q.answers[0]}" if answered(q) else "",
                             prompt=question_block(q.question, None), question_id=q.id if q.id_given else None)
                for q in questions if target == "question" or answered(q)]
    if not examples:
        raise InputError("no training question" if target == "question" else
                         "no training question with a gold answer (questions alone train with lsr_target='question')")
    order = np.random.default_rng(seed).permutation(len(examples))
    examples = [examples[i] for i in order]
    return examples[:max_examples] if max_examples else examples


def question_key(question: str) -> str:
    """A question's identity across sources and ids: its normalised text."""
    return normalize_answer(question)


def trained_questions_record(source: str, examples: list[TrainExample]) -> dict:
    """What WORKDIR/train_questions.json holds: the training questions' texts and the ids their data gave."""
    return {"source": source, "ids": [e.question_id for e in examples if e.question_id is not None],
            "questions": [e.query for e in examples]}


def check_disjoint_questions(trained_on, evaluated) -> None:
    """Refuse evaluated questions that training saw: by normalised question text, or by an id both data gave
    (a JSONL row's line number, the id of a row without one, is no identity across files).

    trained_on: `trained_questions_record`'s dict; evaluated: `QAExample`s, or multiple-choice questions (by text
    alone: their ids come from other files' schemes)."""
    ids, texts = set(trained_on.get("ids", ())), {question_key(q) for q in trained_on.get("questions", ())}
    seen = [q.id for q in evaluated
            if (getattr(q, "id_given", False) and q.id in ids) or question_key(q.question) in texts]
    if seen:
        raise InputError(f"{len(seen)} evaluated questions were LSR training questions (e.g. {seen[:3]}; same "
                         "normalised text or same given id): evaluate on questions the retriever was not trained on")


def training_examples(documents, tokenizer: TextTokenizer, *, query_tokens: int = 128, continuation_tokens: int = 128,
                      seed: int = 0, max_examples: int | None = None) -> list[TrainExample]:
    """Non-overlapping (x, y) windows of every document, shuffled with `seed` (deterministic); `continuation_tokens`
    0: windows of x alone (y = "", what LSR's question target reads)."""
    span = query_tokens + continuation_tokens
    examples, too_short = [], []
    for doc in documents:
        starts = token_starts(tokenizer, doc.text)
        n = len(starts) - 1
        if n < span:
            too_short.append(doc.id)
        for a in range(0, n - span + 1, span):
            x = doc.text[starts[a] : starts[a + query_tokens]]
            y = doc.text[starts[a + query_tokens] : starts[a + span]]
            if x.strip() and (y.strip() or continuation_tokens == 0):  # no y at all: the question target's windows
                examples.append(TrainExample(x, y, excluded_sources=(doc.id,)))
    if not examples:
        raise InputError(f"no training example of {span} tokens: documents are too short "
                         "(lower train_query_tokens / train_continuation_tokens)")
    if too_short:  # said, not skipped in silence: these documents supervise nothing
        logging.warning(f"{len(too_short)} of {len(documents)} training documents are shorter than one window of "
                        f"{span} tokens and give no training example (e.g. {too_short[:3]}); lower "
                        "train_query_tokens / train_continuation_tokens to use them")
    order = np.random.default_rng(seed).permutation(len(examples))
    examples = [examples[i] for i in order]
    return examples[:max_examples] if max_examples else examples


def check_disjoint(train_documents, datastore) -> None:
    """Refuse training documents that are also datastore documents (by id or by identical chunk text)."""
    shared = sorted({d.id for d in train_documents} & set(datastore.sources))
    if shared:
        raise InputError(f"{len(shared)} training documents are also in the datastore (e.g. {shared[:3]}): "
                         "training queries must come from documents disjoint from the retrieval corpus")
    digest = lambda text: hashlib.sha1(text.strip().encode()).hexdigest()
    chunk_hashes = {digest(t) for t in datastore.texts if len(t.strip()) > 64}
    overlapping = [d.id for d in train_documents if any(digest(p) in chunk_hashes for p in d.text.split("\n\n") if len(p.strip()) > 64)]
    if overlapping:
        raise InputError(f"training documents {overlapping[:3]} contain passages identical to datastore chunks")
