"""The multiple-choice job ("mmlu": MMLU's Table 4 prompt by option letters or option texts, and OLMES's request
files): each method's predictions and their accuracy. `jobs/downstream.py` runs it (`run`, `metrics`)."""
from __future__ import annotations

import functools

import numpy as np

from replug_jax.base import console
from replug_jax.data import olmes
from replug_jax.evaluate import concat_cuts, demo_passages, mmlu, olmes_tasks, option_text
from replug_jax.jobs.input_checks import retrieval_depth
from replug_jax.method.passages import passages_of


def metrics(config, questions, demos, predictions: list[dict]) -> dict:
    """Accuracy per method (with the subjects asked zero-shot), every option metric where option texts were scored,
    and the question count, from all prediction rows."""
    shots_from_demos = config.shots and not olmes.parse_source(config.questions)  # OLMES: shots inside each request
    zero_shot = sorted({q.subject for q in questions} - set(mmlu.shots_by_subject(demos))) if shots_from_demos else []
    out = {"accuracy": {m: mmlu.accuracy(questions, [row[m] for row in predictions]) for m in config.methods},
           "count": len(questions), "zero_shot_subjects": zero_shot}
    if f"{config.methods[0]}_options" in predictions[0]:  # option texts scored: every option metric, micro (%)
        out["option_accuracy"] = {
            metric: {m: mmlu.accuracy(questions, [row[f"{m}_options"][metric] for row in predictions])["micro"]
                     for m in config.methods} for metric in option_text.OPTION_METRICS}
    return out


def run(config, lm, store, retrievers, questions, dev):
    """(settings for results, prediction rows) of `questions` (this process's share) by every method: the option
    letters' mixture (scoring "letters", the paper's Table 4 prompt) or each option's text (scoring "options",
    evaluate/option_text.py); OLMES's request files when config.questions names one."""
    task = olmes.parse_source(config.questions)
    if task:
        return _run_olmes(config, lm, store, retrievers, questions, task)
    scoring, option_metric = config.get("scoring", "letters"), config.get("option_metric", "acc_per_char")
    option_text.check_scoring(scoring, option_metric)
    n_options = max(len(q.choices) for q in questions)
    if scoring == "letters":
        mmlu.check_option_tokens(lm, n_options)
    block = mmlu.question_block if scoring == "letters" else option_text.cloze_block
    conts = [option_text.continuations(q) if scoring == "options" else mmlu.letter_continuations(n_options)
             for q in questions]  # what each question's prompts are scored with
    shots_by_subject = mmlu.shots_by_subject(dev)
    zero_shot = sorted({q.subject for q in questions} - set(shots_by_subject)) if config.shots else []
    if zero_shot:
        console.phase(f"warning: no shots for subjects {', '.join(zero_shot)}: their questions are asked zero-shot")
    results = {"query_with_options": bool(config.query_with_options), "scoring": scoring}
    if scoring == "options":
        results["option_metric"] = option_metric
    predictions = [{"id": q.id, "subject": q.subject, "answer": q.answer} for q in questions]
    for method in config.methods:
        console.phase(f"mmlu {method}: {len(questions)} questions, k={config.k}, scoring by {scoring}")
        retriever = retrievers["replug_lsr" if method == "replug_lsr" else "replug"]
        queries = [mmlu.retrieval_query(q, config.query_with_options) for q in questions]
        scores, rows = retriever.retrieve(queries, min(retrieval_depth(config, method), len(store)))
        passages = passages_of(store, rows)
        shots_block = functools.partial(mmlu.shots_block, block=block)
        prefixes = {s: demo_passages.few_shot_prefix(retriever, store, shots[: config.shots], method != "none",
                                                     shots_block) for s, shots in shots_by_subject.items()}
        if method == "replug_posterior":  # the question block (no options) after each passage: its likelihood
            docs, blocks = option_text.cloze_passes(questions, passages, prefixes)
            by_metric = option_text.posterior_option_predictions(
                lm, docs, blocks, scores, conts,
                temperature=config.temperature, alpha=config.posterior_alpha, k=config.k, progress=True)
            option_text.record(predictions, method, by_metric, option_metric)
            option_text.record_passages(predictions, method, store, rows, by_metric["kept"])
            continue
        if method != "none":
            option_text.record_passages(predictions, method, store, rows)
        prompts = mmlu.method_prompts(method, questions, passages, prefixes, block=block)
        if method == "concat":  # the passages a window-cut prompt still held before every option
            concat_cuts.mark_options(lm, predictions, prompts, passages, conts)
        passes = method not in ("none", "concat")
        if scoring == "options":
            log_w = [option_text.log_lambda(s, len(p), config.temperature) if passes else np.zeros(1, np.float32)
                     for s, p in zip(scores, prompts)]
            by_metric = option_text.option_predictions(lm, prompts, log_w, conts, progress=True)
            option_text.record(predictions, method, by_metric, option_metric)
            continue
        option_lps = mmlu.option_logprobs(lm, prompts, n_options=n_options, progress=True)
        weights = scores[:, : option_lps.shape[1]] if passes else np.zeros(option_lps.shape[:2])
        predicted, _ = mmlu.mixture_predictions(option_lps, weights.astype(np.float32), config.temperature,
                                                [len(q.choices) for q in questions])
        for row, p in zip(predictions, predicted):
            row[method] = int(p)
    return results, predictions


def _run_olmes(config, lm, store, retrievers, questions, task: tuple[str, str]):
    """OLMES requests by every method (evaluate/olmes_tasks.py); the file's primary metric decides unless
    config.option_metric names another."""
    info = olmes.task_info(*task)
    metric = config.get("option_metric") or info["primary_metric"]
    option_text.check_scoring("options", metric)
    results = {"olmes": info, "scoring": "options", "option_metric": metric, "shots": info["num_shots"]}
    retrieve = lambda method, queries: retrievers["replug_lsr" if method == "replug_lsr" else "replug"].retrieve(
        queries, min(retrieval_depth(config, method), len(store)))
    predictions = olmes_tasks.predictions(lm, questions, config.methods, retrieve, store, metric, config.temperature,
                                          label=":".join(task), posterior_alpha=config.get("posterior_alpha", 1.0),
                                          k=config.k)
    return results, predictions
