"""The paper's downstream effects per LM: none / REPLUG / concat / vote on open QA and SciQ multiple choice.

    python experiments/reader_effects.py --lms qwen2.5-coder-0.5b --tasks sciq,sciq_mc --questions 10   # `make demo-readers`
    python experiments/reader_effects.py --lms smollm2,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b --questions 100

Runs, for every LM, the tasks' configs (experiments/configs: demo_qa.py, the NQ/TriviaQA questions the
offline Wikipedia answers; sciq.py, SciQ open QA over its support paragraphs plus Wikipedia; sciq_mc.py,
SciQ 4-way multiple choice; demo_mmlu.py, four MMLU subjects over the Wikipedia datastore; olmes:<task>:<form>,
OLMES's own request files through olmes.py, e.g. olmes:arc_easy:rc_5shot) on the first `--questions` questions
each, in WORKDIR/<lm>/<task> (":" as "_"; a finished
run's results.json is reused unless --rerun). Writes WORKDIR/effects.json, effects.md and effects.png over
every finished run in WORKDIR (earlier runs of other LMs too) and prints the table: exact match (QA) or accuracy (MC) per method, answer recall@k, question count and time.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from replug_jax.jobs.config_files import sibling_config

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
TASKS = {"qa_demo": "demo_qa.py", "sciq": "sciq.py", "sciq_mc": "sciq_mc.py", "mmlu": "demo_mmlu.py"}
MULTIPLE_CHOICE = ("sciq_mc", "mmlu")  # accuracy, 4 options
METHODS = ("none", "replug", "concat", "vote")


def is_olmes(task: str) -> bool:
    return task.startswith("olmes:")


def task_dir(task: str) -> str:
    return task.replace(":", "_")


def task_config(task: str, lm: str, questions: int, root: str):
    name = "olmes.py" if is_olmes(task) else TASKS[task]
    config = sibling_config(os.path.join(CONFIGS, name), name)
    config.lm, config.max_questions = lm, questions
    if is_olmes(task):
        config.questions = task
    config.cache_dir = os.path.join(root, lm, f"corpus_{config.corpus}")  # sciq and sciq_mc share one index
    if config.job == "qa":
        config.methods = METHODS
        config.k, config.shots, config.max_new_tokens = 4, 4, 10
        config.temperature = 1.0  # its tables' τ (sciq.py's default became the dev-chosen 0.03 on 2026-11-25)
    return config


def run_task(task: str, lm: str, questions: int, workdir: str, rerun: bool, loaded: dict, methods: str = "") -> dict:
    """results.json of one (LM, task) run, running it when absent (or asked to); `loaded` keeps the LM."""
    from replug_jax.base import console
    from replug_jax.jobs import results_file
    from replug_jax.main import run_job

    path = os.path.join(workdir, "results.json")
    config = task_config(task, lm, questions, os.path.dirname(os.path.dirname(workdir)))
    if methods:
        config.methods = tuple(methods.split(","))
    results = None if rerun else results_file.finished_run(workdir, config)  # another config's run: refused
    if results is not None and results.get("count") is not None:
        return results
    console.setup(workdir, -1)
    console.phase(f"{lm} on {task}: up to {questions} questions in {workdir}")
    if lm not in loaded:
        from replug_jax.jobs.prepare import load_job_lm
        from replug_jax.models import precision

        loaded.clear()  # one LM in memory at a time
        loaded[lm] = load_job_lm(config, precision.resolve(config.dtype))
    results = run_job(config, workdir, lm=loaded[lm])
    results["max_questions"] = questions
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    return results


def row(lm: str, task: str, results: dict) -> dict:
    """One table row: the task's score per method (EM or micro accuracy, %), recall, count, minutes."""
    if results["task"] == "mmlu":
        scores = {m: v["micro"] for m, v in results["accuracy"].items()}
        recall, metric = None, results.get("option_metric", "acc (letters)")
    else:
        scores = dict(results["exact_match"])
        recall, metric = results["answer_recall"].get("replug"), "EM"
    return {"lm": lm, "task": task, "count": results["count"], "minutes": results["seconds"] / 60, "metric": metric,
            "scores": scores, "answer_recall": recall, "k": results["k"], "shots": results["shots"]}


def finished_rows(workdir: str, first: list[str]) -> list[dict]:
    """A row for every finished LM × task run in `workdir` (earlier runs of other LMs included), the LMs in
    `first` first, then by name; tasks in TASKS order."""
    lms = [d for d in sorted(os.listdir(workdir)) if os.path.isdir(os.path.join(workdir, d))]
    lms = [m for m in first if m in lms] + [m for m in lms if m not in first]
    out = []
    for lm in lms:
        dirs = list(TASKS) + sorted(d for d in os.listdir(os.path.join(workdir, lm)) if d.startswith("olmes_"))
        for name in dirs:
            if os.path.isfile(path := os.path.join(workdir, lm, name, "results.json")):
                results = json.load(open(path))
                out.append(row(lm, results["questions_source"] if name.startswith("olmes_") else name, results))
    return out


def table(rows: list[dict]) -> str:
    lines = ["| LM | task | questions | metric | none | REPLUG | concat | vote | answer recall@k | minutes |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = [f"{r['scores'][m]:.1f}" if m in r["scores"] else "—" for m in METHODS]
        recall = f"{r['answer_recall']:.1f}" if r["answer_recall"] is not None else "—"
        lines.append(f"| {r['lm']} | {r['task']} | {r['count']} | {r.get('metric', '')} | " + " | ".join(cells)
                     + f" | {recall} | {r['minutes']:.1f} |")
    return "\n".join(lines) + ("\n\nQA tasks: exact match (%); sciq_mc, mmlu: accuracy (%, 4 options, chance 25); olmes "
                               "tasks: accuracy (%) by the metric named (3-5 options).\n")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.6), dpi=120, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        these = [r for r in rows if r["task"] == task]
        width = 0.8 / len(METHODS)
        for i, m in enumerate(METHODS):
            ax.bar(np.arange(len(these)) + i * width, [r["scores"].get(m, 0.0) for r in these], width, label=m)
        ax.set_xticks(np.arange(len(these)) + width * (len(METHODS) - 1) / 2, [r["lm"] for r in these], fontsize=7)
        ax.set_title(f"{task} ({these[0]['count']} questions)")
        ax.set_ylabel("accuracy (%)" if task in MULTIPLE_CHOICE or is_olmes(task) else "exact match (%)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lms", default="qwen2.5-coder-0.5b", help="comma-separated LM names")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    ap.add_argument("--questions", type=int, default=30, help="questions per task (after the demos)")
    ap.add_argument("--workdir", default="runs/reader_effects")
    ap.add_argument("--rerun", action="store_true", help="run again even where results.json exists")
    ap.add_argument("--methods", default="", help="comma-separated methods (default: each task config's own)")
    args = ap.parse_args()
    unknown = [t for t in args.tasks.split(",") if t not in TASKS and not is_olmes(t)]
    if unknown:  # every name checked before the first task runs
        ap.error(f"unknown task(s) {', '.join(map(repr, unknown))}; known: {', '.join(TASKS)}")
    from replug_jax.jobs.input_checks import InputError, check_model

    for lm in args.lms.split(","):
        try:
            check_model("lm", lm)
        except InputError as e:
            ap.error(f"--lms: {e}")
    started = time.time()
    loaded = {}
    for lm in args.lms.split(","):
        for task in args.tasks.split(","):
            run_task(task, lm, args.questions, os.path.join(args.workdir, lm, task_dir(task)), args.rerun, loaded,
                     args.methods)
    rows = finished_rows(args.workdir, args.lms.split(","))
    with open(os.path.join(args.workdir, "effects.json"), "w") as f:
        json.dump(rows, f, indent=1)
    text = table(rows)
    with open(os.path.join(args.workdir, "effects.md"), "w") as f:
        f.write(text)
    plot(rows, os.path.join(args.workdir, "effects.png"))
    print(text)
    print(f"{time.time() - started:.0f} s; written to {args.workdir}/effects.json, effects.md, effects.png")


if __name__ == "__main__":
    from replug_jax.jobs.command_line import script_entry

    script_entry(main)  # a mistake in a setting: one line, exit 2
