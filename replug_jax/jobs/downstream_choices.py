"""The multiple-choice job ("mmlu": MMLU's Table 4 prompt by option letters or option texts, and OLMES's request
files): each method's predictions and their accuracy. `jobs/downstream.py` runs it (`run`, `metrics`)."""
from __future__ import annotations

import functools

from replug_jax.base import console
from replug_jax.data import olmes
from replug_jax.evaluate import demo_passages, mmlu, multiple_choice as flow, option_text
from replug_jax.jobs.input_checks import retrieval_depth


def retrieval_queries(config, questions) -> list[str]:
    """The text each question is retrieved for: OLMES's question, or MMLU's query (with its options where
    config.query_with_options)."""
    if olmes.parse_source(config.questions):
        return [q.question for q in questions]
    return [mmlu.retrieval_query(q, config.get("query_with_options", False)) for q in questions]


def metrics(config, questions, demos, predictions: list[dict], methods=None) -> dict:
    """Accuracy per method of `methods` (None: config.methods) with the subjects asked zero-shot, every option
    metric where option texts were scored, and the question count, from all prediction rows."""
    methods = list(config.methods if methods is None else methods)
    shots_from_demos = config.shots and not olmes.parse_source(config.questions)  # OLMES: shots inside each request
    zero_shot = sorted({q.subject for q in questions} - set(mmlu.shots_by_subject(demos))) if shots_from_demos else []
    out = {"accuracy": {m: mmlu.accuracy(questions, [row[m] for row in predictions]) for m in methods},
           "count": len(questions), "zero_shot_subjects": zero_shot}
    if f"{methods[0]}_options" in predictions[0]:  # option texts scored: every option metric, micro (%)
        out["option_accuracy"] = {
            metric: {m: mmlu.accuracy(questions, [row[f"{m}_options"][metric] for row in predictions])["micro"]
                     for m in methods} for metric in option_text.OPTION_METRICS}
    return out


def run(config, lm, store, retrievers, questions, dev, method_finished=None):
    """(settings for results, prediction rows) of `questions` (this process's share) by every method, through the
    one multiple-choice flow (evaluate/multiple_choice.py): MMLU's prompts by option letters (scoring "letters",
    the paper's Table 4 prompt) or option texts ("options"), or OLMES's request files when config.questions names
    one (the file's primary metric decides unless config.option_metric names another). method_finished(methods
    finished so far, rows) is called as each method finishes."""
    retriever_for = lambda method: retrievers["replug_lsr" if method == "replug_lsr" else "replug"]
    retrieve = lambda method, queries: retriever_for(method).retrieve(queries, min(retrieval_depth(config, method),
                                                                                    len(store)))
    common = dict(temperature=config.temperature, posterior_alpha=config.get("posterior_alpha", 1.0), k=config.k)
    task = olmes.parse_source(config.questions)
    if task:
        info = olmes.task_info(*task)
        metric = config.get("option_metric") or info["primary_metric"]
        option_text.check_scoring("options", metric)
        results = {"olmes": info, "scoring": "options", "option_metric": metric, "shots": info["num_shots"]}
        requests = flow.olmes_requests(questions, label=":".join(task))
        return results, flow.predictions(lm, requests, config.methods, retrieve, store, metric=metric,
                                         method_finished=method_finished, **common)
    scoring, option_metric = config.get("scoring", "letters"), config.get("option_metric") or "acc_per_char"
    option_text.check_scoring(scoring, option_metric)
    if scoring == "letters":
        mmlu.check_option_tokens(lm, max(len(q.choices) for q in questions))
    shots_by_subject = mmlu.shots_by_subject(dev)
    zero_shot = sorted({q.subject for q in questions} - set(shots_by_subject)) if config.shots else []
    if zero_shot:
        console.phase(f"warning: no shots for subjects {', '.join(zero_shot)}: their questions are asked zero-shot")
    results = {"query_with_options": bool(config.query_with_options), "scoring": scoring}
    if scoring == "options":
        results["option_metric"] = option_metric
    shots_block = functools.partial(mmlu.shots_block, block=flow.block_for_scoring(scoring))

    @functools.cache
    def prefixes(method: str) -> dict[str, str]:  # each subject's few-shot block, the shots' passages by `method`
        return {s: demo_passages.few_shot_prefix(retriever_for(method), store, shots[: config.shots], method != "none",
                                                 shots_block) for s, shots in shots_by_subject.items()}

    requests = flow.mmlu_requests(questions, prefixes, scoring=scoring, query_with_options=config.query_with_options,
                                  k=config.k)
    return results, flow.predictions(lm, requests, config.methods, retrieve, store, metric=option_metric,
                                     letters=scoring == "letters", method_finished=method_finished, **common)
