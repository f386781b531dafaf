"""The files a trained LSR retriever leaves in its workdir, written in one place (the LSR job and the pools
experiment) and read by `workspace.load_trained_encoder` and the QA job:

    retriever.safetensors   the trained encoder's parameters; metadata: encoder, train_documents ("false": the
                            query side alone, searching the original index), how it was trained
    train_questions.json    (QA pairs) the training questions' texts and given ids, never evaluated
"""
from __future__ import annotations

import json
import os

TRAINED_RETRIEVER = "retriever.safetensors"  # in an LSR workdir: the trained retriever's parameters
TRAIN_QUESTIONS = "train_questions.json"  # in a QA-LSR workdir: the training questions' texts and given ids


def save(folder: str, params, *, encoder: str, train_documents: bool, questions: dict | None = None,
         **meta: str) -> str:
    """Write the trained parameters (and, for QA pairs, the `questions` record of `train.data.
    trained_questions_record`) into `folder`, atomically; returns the parameters' path."""
    from replug_jax.models.weights import save_params
    from replug_jax.retrieval.datastore import atomic_open

    if questions is not None:
        with atomic_open(os.path.join(folder, TRAIN_QUESTIONS)) as f:
            json.dump(questions, f)
        meta["train_questions"] = TRAIN_QUESTIONS
    path = os.path.join(folder, TRAINED_RETRIEVER)
    save_params(params, path, {"encoder": encoder, "train_documents": str(bool(train_documents)).lower(), **meta})
    return path
