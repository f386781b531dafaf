"""The QA and multiple-choice jobs' retrieval as DPR's and FiD's retrieval files write it: WORKDIR/retrieval.jsonl, one
question a line,

    {"id", "question", "answers", "ctxs": [{"id", "title", "text", "score", "has_answer", <own fields>}, ...]}

its passages best first, at the depth the job retrieved (k, or the posterior's re-ranking depth), `score` the
retriever's s exactly (the one λ = softmax(s/τ) mixes: the dense retriever's, or the given file's), `has_answer` as
DPR decides it (evaluate/dpr_answers.py; multiple choice: of the correct option's text), a passage's document's own
fields beside. "question" is the text retrieved for (multiple choice with query_with_options: the question and its
options). Where demos were shown with passages, WORKDIR/retrieval_demos.jsonl holds theirs: the two read back as
--config.retrieval_file=retrieval.jsonl,retrieval_demos.jsonl rerun the run's numbers (retrieval/given.py). The job's
results hold DPR's top-k accuracy of it (results.json "retrieval", under the table in results.md)."""
from __future__ import annotations

import json
import os

import numpy as np

from replug_jax.base.atomic_files import atomic_open
from replug_jax.evaluate.dpr_answers import has_answer, top_k_accuracy

FILE = "retrieval.jsonl"
DEMOS_FILE = "retrieval_demos.jsonl"  # the few-shot demos' passages, beside it where demos were shown with passages


def contexts(store, answers: list, scores: np.ndarray, rows: np.ndarray) -> list[list[dict]]:
    """Per question, its retrieved passages [Q, D] of `store` as DPR's ctxs (rows < 0: none), each with its
    document's own fields; the score exact (a float32 read back as itself: the file reruns the run)."""
    return [[{**store.fields.get(store.sources[r], {}), "id": store.ids[r], "title": store.titles[r],
              "text": store.texts[r], "score": float(s),
              "has_answer": has_answer(golds, store.texts[r])}  # the text alone, as DPR's check_answer reads it
             for r, s in zip(row, row_scores) if r >= 0]
            for golds, row, row_scores in zip(answers, rows, scores)]


def summary(ctxs: list[list[dict]], k: int, score: str, given: list[str] | None = None) -> dict:
    """results.json's "retrieval": the file, its depth, what a score is (`score`), the retrieval files it was `given`
    by (None: the job's own), and DPR's top-k accuracy at 1, k and the depth."""
    depth = max((len(c) for c in ctxs), default=0)
    flags = [[c["has_answer"] for c in row] for row in ctxs]
    accuracy = top_k_accuracy(flags, sorted({1, k, depth} - {0}))
    return {"file": FILE, "depth": depth, "score": score, **({"given_by": list(given)} if given else {}),
            "dpr_top_k_accuracy": {str(n): value for n, value in accuracy.items()}}


def write(rows: list[dict], workdir: str, name: str = FILE) -> str:
    """WORKDIR/`name` (retrieval.jsonl) of `rows` ({"id", "question", "answers", "ctxs"}); returns its path."""
    path = os.path.join(workdir, name)
    with atomic_open(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def table_line(retrieval: dict) -> str:
    """The line under results.md's table."""
    accuracy = ", ".join(f"top-{n} {value:.1f}" for n, value in retrieval["dpr_top_k_accuracy"].items())
    given = f"given by {', '.join(retrieval['given_by'])}, scores {retrieval['score']}; " if "given_by" in retrieval else ""
    return (f"\nRetrieval ({given}{retrieval['file']}, DPR's format, {retrieval['depth']} passages a question): DPR's "
            f"top-k accuracy (a passage holding an answer, DPR's has_answer) {accuracy}.\n")
