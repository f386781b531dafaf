"""The files a trained LSR retriever leaves in its workdir, written in one place (`save`: the LSR job and the pools
experiment) and read in one place (`load_trained_encoder`, `retriever_folder`: the QA job):

    retriever.safetensors   the trained encoder's parameters; metadata: encoder, train_documents ("false": the
                            query side alone, searching the original index), how it was trained
    train_questions.json    (QA pairs) the training questions' texts and given ids, never evaluated
"""
from __future__ import annotations

import json
import os

import jax

from replug_jax.base.errors import InputError, MissingInput

TRAINED_RETRIEVER = "retriever.safetensors"  # in an LSR workdir: the trained retriever's parameters
TRAIN_QUESTIONS = "train_questions.json"  # in a QA-LSR workdir: the training questions' texts and given ids


def save(folder: str, params, *, encoder: str, train_documents: bool, questions: dict | None = None,
         **meta: str) -> str:
    """Write the trained parameters (and, for QA pairs, the `questions` record of `train.queries.
    trained_questions_record`) into `folder`, atomically; returns the parameters' path."""
    from replug_jax.models.weights import save_params
    from replug_jax.base.atomic_files import atomic_open

    if questions is not None:
        with atomic_open(os.path.join(folder, TRAIN_QUESTIONS)) as f:
            json.dump(questions, f)
        meta["train_questions"] = TRAIN_QUESTIONS
    path = os.path.join(folder, TRAINED_RETRIEVER)
    save_params(params, path, {"encoder": encoder, "train_documents": str(bool(train_documents)).lower(), **meta})
    return path


def retriever_folder(lsr_workdir: str) -> str:
    """An LSR job's workdir as a local folder: from a bucket (gs://), its trained retriever files staged."""
    from replug_jax.jobs import bucket_workdirs

    return bucket_workdirs.local_folder(lsr_workdir or "", (TRAINED_RETRIEVER, TRAIN_QUESTIONS))


def load_trained_encoder(encoder, lsr_workdir: str):
    """(`encoder` with the parameters an LSR job trained (WORKDIR/retriever.safetensors), named "+lsr",
    whether the documents were trained too: False means the trained encoder embeds queries only and
    searches an index built by the original `encoder`)."""
    path = os.path.join(lsr_workdir, TRAINED_RETRIEVER)
    if not os.path.isfile(path):
        raise MissingInput(f"{path}: no trained retriever (run the LSR job with --workdir {lsr_workdir} first)")
    from replug_jax.models.weights import load_params

    params, meta = load_params(path, jax.device_get(encoder.params))
    if meta.get("encoder") not in (None, encoder.name):
        raise InputError(f"{path} was trained from encoder {meta['encoder']!r}, not {encoder.name!r}")
    return encoder.with_params(params, name=f"{encoder.name}+lsr"), meta.get("train_documents", "true") == "true"
