"""Downstream results on disk: results.json, results.md shaped like the paper's Tables 2 (MMLU) and 3 (QA),
a bar plot, and predictions.jsonl (one line per question, every method's answer) so errors can be read."""
from __future__ import annotations

import json
import os

from replug_jax.data.question_sets import MMLU_CATEGORIES
from replug_jax.evaluate import retrieval_results
from replug_jax.jobs import results_file
from replug_jax.jobs.report import METHOD_ORDER, method_label

CATEGORIES = ("Humanities", "Social Sciences", "STEM", "Other")


def _ordered(methods):
    return [m for m in METHOD_ORDER if m in methods] + sorted(m for m in methods if m not in METHOD_ORDER)


def mmlu_table(results: dict) -> str:
    acc = results["accuracy"]
    subjects = {s for m in acc for s in acc[m].get("per_subject", {})}
    scoring = (f", options scored by their text ({results['option_metric']} decides)"
               if results.get("scoring") == "options" else "")
    if not subjects & set(MMLU_CATEGORIES):  # not MMLU's subjects (SciQ's "sciq", ...): one accuracy per method
        lines = [f"Multiple choice ({results.get('questions_source')}), {results['count']} questions, "
                 f"{results['shots']}-shot, k = {results['k']}{scoring}", ""]
        if "option_accuracy" not in results:
            return "\n".join(lines + ["| method | accuracy |", "|---|---:|"]
                             + [f"| {m} | {acc[m]['micro']:.1f} |" for m in _ordered(acc)]) + "\n"
        return "\n".join(lines) + "\n" + option_table(results)
    lines = [f"MMLU, {results['count']} questions, {results['shots']}-shot, k = {results['k']}{scoring} "
             "(category columns: macro-average over their subjects; All (macro): over subjects, as the paper's "
             "Table 2; All (micro): over questions)", "",
             "| method | " + " | ".join(CATEGORIES) + " | All (macro) | All (micro) |", "|---|" + "---:|" * 6]
    for m in _ordered(acc):
        cats = acc[m]["per_category"]
        cells = [f"{cats[c]['macro']:.1f}" if c in cats else "" for c in CATEGORIES]
        lines.append(f"| {method_label(m, results)} | " + " | ".join(cells)
                     + f" | {acc[m]['macro']:.1f} | {acc[m]['micro']:.1f} |")
    table = "\n".join(lines) + "\n"
    return table + ("\n" + option_table(results) if "option_accuracy" in results else "")


def option_table(results: dict) -> str:
    """Accuracy (%, over questions) by each option metric: acc, acc_per_char, acc_per_token."""
    by = results["option_accuracy"]
    metrics = list(by)
    lines = ["| method | " + " | ".join(metrics) + " |", "|---|" + "---:|" * len(metrics)]
    lines += [f"| {m} | " + " | ".join(f"{by[x][m]:.1f}" for x in metrics) + " |" for m in _ordered(by[metrics[0]])]
    return "\n".join(lines) + "\n"


def qa_table(results: dict) -> str:
    em, recall, nll = results["exact_match"], results["answer_recall"], results.get("answer_nll", {})
    lines = [f"Open-domain QA ({results['questions_source']}), {results['count']} questions, {results['shots']}-shot, "
             f"k = {results['k']}, τ = {results['temperature']:g}, ensemble = {results['ensemble']}"
             + (f", posterior α = {results['posterior_alpha']:g} over the top {results['rerank_depth']}"
                if "posterior_alpha" in results else ""), "",
             f"| method | exact match | answer NLL (nats) | answer recall@{results['k']} |", "|---|---:|---:|---:|"]
    for m in _ordered(em):
        r = f"{recall[m]:.1f}" if recall.get(m) is not None else "—"
        n = f"{nll[m]:.3f}" if nll.get(m) is not None else "—"
        lines.append(f"| {method_label(m, results)} | {em[m]:.1f} | {n} | {r} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 3.8), dpi=120)
    if results["task"] == "mmlu":
        methods, groups = _ordered(results["accuracy"]), list(CATEGORIES) + ["All"]
        width = 0.8 / max(1, len(methods))
        for i, m in enumerate(methods):
            cats = results["accuracy"][m]["per_category"]
            values = [cats[c]["macro"] if c in cats else 0.0 for c in CATEGORIES] + [results["accuracy"][m]["macro"]]
            ax.bar(np.arange(len(groups)) + i * width, values, width, label=m)
        ax.set_xticks(np.arange(len(groups)) + width * (len(methods) - 1) / 2, groups)
        ax.set_ylabel("accuracy (%)")
        ax.set_title("MMLU accuracy per category")
    else:
        methods = _ordered(results["exact_match"])
        ax.bar(methods, [results["exact_match"][m] for m in methods], label="exact match")
        ax.set_ylabel("exact match (%)")
        ax.set_title(f"Open-domain QA ({results['questions_source']})")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write(results: dict, predictions: list[dict], workdir: str) -> str:
    """results.json (and its copy under history/), results.md, the plot and predictions.jsonl in `workdir`; returns the table."""
    results_file.save(results, workdir)  # results.json, and the run's copy under history/
    with open(os.path.join(workdir, "predictions.jsonl"), "w", encoding="utf-8") as f:
        for row in predictions:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    table = mmlu_table(results) if results["task"] == "mmlu" else qa_table(results)
    table += retrieval_results.table_line(results["retrieval"]) if "retrieval" in results else ""
    table += "".join(f"\nWarning: {w}\n" for w in results.get("warnings", ()))
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(table)
    plot(results, os.path.join(workdir, "accuracy.png" if results["task"] == "mmlu" else "exact_match.png"))
    return table
