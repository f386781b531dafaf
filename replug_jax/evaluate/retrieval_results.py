"""The QA job's retrieval as DPR's and FiD's retrieval files write it: WORKDIR/retrieval.jsonl, one question a line,

    {"id", "question", "answers", "ctxs": [{"id", "title", "text", "score", "has_answer"}, ...]}

its passages best first, at the depth the job retrieved (k, or the posterior's re-ranking depth), `score` the dense
retriever's s (the one λ = softmax(s/τ) mixes), `has_answer` as DPR decides it (evaluate/dpr_answers.py). The job's
results hold DPR's top-k accuracy of it (results.json "retrieval", under the table in results.md)."""
from __future__ import annotations

import json
import os

import numpy as np

from replug_jax.base.atomic_files import atomic_open
from replug_jax.evaluate.dpr_answers import has_answer, top_k_accuracy

FILE = "retrieval.jsonl"


def contexts(store, answers: list, scores: np.ndarray, rows: np.ndarray) -> list[list[dict]]:
    """Per question, its retrieved passages [Q, D] of `store` as DPR's ctxs (rows < 0: none)."""
    return [[{"id": store.ids[r], "title": store.titles[r], "text": store.texts[r], "score": round(float(s), 6),
              "has_answer": has_answer(golds, store.texts[r])}  # the text alone, as DPR's check_answer reads it
             for r, s in zip(row, row_scores) if r >= 0]
            for golds, row, row_scores in zip(answers, rows, scores)]


def summary(ctxs: list[list[dict]], k: int, metric: str) -> dict:
    """results.json's "retrieval": the file, its depth, what a score is, and DPR's top-k accuracy at 1, k and the
    depth."""
    depth = max((len(c) for c in ctxs), default=0)
    flags = [[c["has_answer"] for c in row] for row in ctxs]
    accuracy = top_k_accuracy(flags, sorted({1, k, depth} - {0}))
    return {"file": FILE, "depth": depth, "score": f"the dense retriever's s ({metric})",
            "dpr_top_k_accuracy": {str(n): value for n, value in accuracy.items()}}


def write(rows: list[dict], workdir: str) -> str:
    """retrieval.jsonl of `rows` ({"id", "question", "answers", "ctxs"}); returns its path."""
    path = os.path.join(workdir, FILE)
    with atomic_open(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def table_line(retrieval: dict) -> str:
    """The line under results.md's table."""
    accuracy = ", ".join(f"top-{n} {value:.1f}" for n, value in retrieval["dpr_top_k_accuracy"].items())
    return (f"\nRetrieval ({retrieval['file']}, DPR's format, {retrieval['depth']} passages a question): DPR's "
            f"top-k accuracy (a passage holding an answer, DPR's has_answer) {accuracy}.\n")
