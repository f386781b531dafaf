"""Multiple choice by every method, one way: requests -> passes -> scores -> mixture -> rows.

A `Requests` says what a set of questions asks of every method: each question's retrieval query, its options'
continuations, how a method's passes are made from the passages found (`passes`), and where x begins in a pass
for the posterior (`posterior_split`). Two kinds build one: MMLU's prompts (`mmlu_requests`: the paper's Table 4
prompt with lettered options, or the cloze prompt of option texts, after each subject's few-shot block) and OLMES's
request files (`olmes_requests`: each passage before the request's own context, shots included). `predictions`
then runs every method the same way:

    retrieve (`retrieve(method, queries)`) -> passes (`Requests.passes`) -> the LM's scores of every option in every
    pass -> the per-token mixture with λ = softmax(s / τ) (the posterior's λ for "replug_posterior") -> one row per
    question: the prediction by `metric`, every option metric, the options' log-likelihoods and the passages mixed.

Scoring by option letters (`letters`: MMLU's Table 4) scores the single-token letters (`mmlu.option_logprobs`) and
mixes them (`mmlu.mixture_predictions`); scoring by option texts goes through `option_text`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from replug_jax.base import console
from replug_jax.data.olmes import split_question_block
from replug_jax.data.records import fields_entry
from replug_jax.evaluate import concat_cuts, mmlu, option_text
from replug_jax.method.passages import knowledge_line, passage_ids, passages_of

PASSAGE_BEFORE_CONTEXT = "{passage}\n\n"  # a passage before a fixed prompt (OLMES's request contexts)


@dataclasses.dataclass
class Requests:
    """What every method scores for a set of questions (module docstring). passes(method, passages): per question
    its pass prompts (one for "none" and "concat", one per passage else); posterior_split(passages): per question
    the passage sides of its passes and its x (what follows each, before the option); phase(method): the console
    line of a method's start."""

    questions: Sequence  # each with .id, .subject, .answer
    queries: list[str]  # [Q] retrieval queries
    continuations: list[list[str]]  # per question, its options' continuations
    passes: Callable[[str, list[list[str]]], list[list[str]]]
    posterior_split: Callable[[list[list[str]]], tuple[list[list[str]], list[str]]]
    phase: Callable[[str], str]
    retrieves_for_none: bool = False  # MMLU retrieved for "none" too (its passages unused): kept, nothing else


def block_for_scoring(scoring: str):
    """MMLU's question block for a scoring: lettered options ("letters", the paper's Table 4) or the cloze prompt
    scored by option texts ("options"); the few-shot blocks use it too."""
    return mmlu.lettered_block if scoring == "letters" else option_text.cloze_block


def mmlu_requests(questions, prefixes: Callable[[str], dict[str, str]], *, scoring: str, query_with_options: bool,
                  k: int) -> Requests:
    """MMLU's prompts: `prefixes(method)` gives each subject's few-shot block for a method (with the shots' own
    passages where the method retrieves), then the `block_for_scoring` of the scoring."""
    block = block_for_scoring(scoring)
    n_options = max(len(q.choices) for q in questions)
    conts = [option_text.continuations(q) if scoring == "options" else mmlu.letter_continuations(n_options)
             for q in questions]
    return Requests(
        questions, [mmlu.retrieval_query(q, query_with_options) for q in questions], conts,
        passes=lambda method, passages: mmlu.method_prompts(method, questions, passages, prefixes(method), block=block),
        posterior_split=lambda passages: option_text.cloze_passes(questions, passages, prefixes("replug_posterior")),
        phase=lambda method: f"mmlu {method}: {len(questions)} questions, k={k}, scoring by {scoring}",
        retrieves_for_none=True)


def olmes_requests(questions, label: str = "") -> Requests:
    """OLMES's requests: each (context, continuation) as the file gives it for "none"; a passage before the whole
    context (its shots included) for REPLUG's passes, all passages joined best last for "concat"; x for the
    posterior is the request's final question block (`data.olmes.split_question_block`), the shots staying on the
    passage's side of the pass."""
    contexts = [q.context for q in questions]

    def posterior_split(passages):
        shots, blocks = zip(*(split_question_block(q.context, q.query) for q in questions))
        return [[PASSAGE_BEFORE_CONTEXT.format(passage=p) + s for p in ps] for s, ps in zip(shots, passages)], \
            list(blocks)

    return Requests(questions, [q.question for q in questions], [list(q.continuations) for q in questions],
                    passes=lambda method, passages: prepended_prompts(method, contexts, passages),
                    posterior_split=posterior_split,
                    phase=lambda method: f"olmes {label} {method}: {len(questions)} questions")


def prepended_prompts(method: str, contexts: Sequence[str], passages: Sequence[Sequence[str]]) -> list[list[str]]:
    """Passes over fixed prompts (OLMES's request contexts, few-shot block included): the context alone ("none"),
    every passage joined best last before it ("concat"), or one pass per passage before it (REPLUG)."""
    if method == "none":
        return [[c] for c in contexts]
    if method == "concat":
        return [[knowledge_line(ps) + "\n\n" + c] for c, ps in zip(contexts, passages)]
    return [[PASSAGE_BEFORE_CONTEXT.format(passage=p) + c for p in ps] for c, ps in zip(contexts, passages)]


def predictions(lm, requests: Requests, methods: Sequence[str], retrieve, store, *, metric: str, temperature: float,
                letters: bool = False, posterior_alpha: float = 1.0, k: int = 0, method_finished=None) -> list[dict]:
    """One row per question: id, subject, answer, "fields" (the input row's others, if any), and per method its
    prediction (by `metric`; `letters`: the lettered options' mixture) with "<method>_options" (every option metric
    and the options' log-likelihoods, option texts only) and "<method>_passage_ids" (the passages it mixed, best
    first). retrieve(method, queries) -> (scores [Q, D], rows [Q, D]); "replug_posterior" keeps the k (0: D)
    passages of highest posterior.
    method_finished(methods finished so far, rows) is called as each method finishes."""
    rows = [{"id": q.id, "subject": q.subject, "answer": q.answer, **fields_entry(q)} for q in requests.questions]
    for done, method in enumerate(methods, 1):
        console.phase(requests.phase(method))
        _predict(lm, requests, method, retrieve, store, rows, metric=metric, temperature=temperature,
                 letters=letters, posterior_alpha=posterior_alpha, k=k)
        if method_finished is not None:
            method_finished(list(methods[:done]), rows)
    return rows


def _predict(lm, requests: Requests, method: str, retrieve, store, rows: list[dict], *, metric: str,
             temperature: float, letters: bool, posterior_alpha: float, k: int) -> None:
    """One method's predictions into `rows` (`predictions`)."""
    conts = requests.continuations
    passages = [[] for _ in requests.questions]
    if method != "none" or requests.retrieves_for_none:
        scores, retrieved = retrieve(method, requests.queries)
        passages = passages_of(store, retrieved)
    if method == "replug_posterior":  # x after each passage: its likelihood weighs the passage
        docs, xs = requests.posterior_split(passages)
        by_metric = option_text.posterior_option_predictions(
            lm, docs, xs, scores, conts, temperature=temperature, alpha=posterior_alpha, k=k or scores.shape[1],
            progress=True)
        record(rows, method, by_metric, metric)
        record_passages(rows, method, store, retrieved, by_metric["kept"])
        return
    if method != "none":
        record_passages(rows, method, store, retrieved)
    prompts = requests.passes(method, passages)  # per question its passes
    if method == "concat":  # the passages a window-cut prompt still held before every option
        concat_cuts.mark_options(lm, rows, prompts, passages, conts)
    mixes = method not in ("none", "concat")
    if letters:
        option_lps = mmlu.option_logprobs(lm, prompts, n_options=len(conts[0]), progress=True)  # [Q, K, n]
        weights = scores[:, : option_lps.shape[1]] if mixes else np.zeros(option_lps.shape[:2])
        predicted, _ = mmlu.mixture_predictions(option_lps, weights.astype(np.float32), temperature,
                                                [len(q.choices) for q in requests.questions])
        for row, p in zip(rows, predicted):
            row[method] = int(p)
        return
    log_w = [option_text.log_lambda(s, len(p), temperature) if mixes else np.zeros(1, np.float32)
             for s, p in zip(scores if mixes else prompts, prompts)]
    record(rows, method, option_text.option_predictions(lm, prompts, log_w, conts, progress=True), metric)


def record(rows: list[dict], method: str, by_metric: dict, metric: str) -> None:
    """Into each question's row: `method`'s prediction by `metric`, and under "<method>_options" every metric's
    prediction and the options' log-likelihoods."""
    for i, row in enumerate(rows):
        row[method] = by_metric[metric][i]
        row[f"{method}_options"] = {m: by_metric[m][i] for m in (*option_text.OPTION_METRICS, "loglik")}


def record_passages(rows: list[dict], method: str, store, retrieved: np.ndarray, kept=None) -> None:
    """Into each question's row: "<method>_passage_ids", the datastore ids of the passages its passes mixed, best
    first (`kept`: per question the positions among the passages found, best posterior first: replug_posterior)."""
    for row, ids in zip(rows, passage_ids(store, retrieved, kept)):
        row[f"{method}_passage_ids"] = ids
