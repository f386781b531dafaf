"""OLMES's request files scored by every method (the mmlu job's `olmes:<task>:<form>` questions).

Closed book ("none") scores each request's (context, continuation) exactly as the file gives them; REPLUG
retrieves for the question and prepends each passage to the request's context (few-shot block included), the
options' continuations mixed per token with λ = softmax(s / τ); "concat" prepends all k passages joined;
"replug_posterior" weighs REPLUG's passes by log p(question block | passage, shots) (rc forms only: an mc form's
block lists the options, which x must not hold). Every
option metric is kept per question (`option_text.OPTION_METRICS` and the log-likelihoods).
"""
from __future__ import annotations

import numpy as np

from replug_jax.base import console
from replug_jax.data.olmes import split_question_block
from replug_jax.evaluate import concat_cuts, option_text
from replug_jax.method.passages import passages_of


def predictions(lm, questions, methods, retrieve, store, metric: str, temperature: float, label: str = "", *,
                posterior_alpha: float = 1.0, k: int = 0) -> list[dict]:
    """One row per question: id, subject, answer, and per method its prediction by `metric` and
    "<method>_options" (every metric's prediction and the options' log-likelihoods).
    retrieve(method, queries) -> (scores [Q, D], rows [Q, D]) from that method's retriever; "replug_posterior" keeps
    the k (0: D) passages of highest posterior, x being the request's final question block
    (`data.olmes.split_question_block`: what follows the last "\n\n"), the shots before it part of the passage's
    side; the pass itself is REPLUG's (passage, shots, question block, option)."""
    rows = [{"id": q.id, "subject": q.subject, "answer": q.answer} for q in questions]
    for method in methods:
        console.phase(f"olmes {label} {method}: {len(questions)} questions")
        passages, log_w = [[] for _ in questions], [np.zeros(1, np.float32) for _ in questions]
        if method != "none":
            scores, retrieved = retrieve(method, [q.question for q in questions])
            passages = passages_of(store, retrieved)
            if method == "replug_posterior":  # x: the final question block; the shots stay in d's side of the pass
                shots, blocks = zip(*(split_question_block(q.context, q.query) for q in questions))
                by_metric = option_text.posterior_option_predictions(
                    lm, [[option_text.PASSAGE_BEFORE_CONTEXT.format(passage=p) + s for p in ps]
                         for s, ps in zip(shots, passages)],
                    list(blocks), scores, [q.continuations for q in questions],
                    temperature=temperature, alpha=posterior_alpha, k=k or scores.shape[1], progress=True)
                option_text.record(rows, method, by_metric, metric)
                option_text.record_passages(rows, method, store, retrieved, by_metric["kept"])
                continue
            option_text.record_passages(rows, method, store, retrieved)
            if method != "concat":
                log_w = [option_text.log_lambda(s, len(p), temperature) for s, p in zip(scores, passages)]
        prompts = option_text.prepended_prompts(method, [q.context for q in questions], passages)
        if method == "concat":  # the passages a window-cut prompt still held before every option
            concat_cuts.mark_options(lm, rows, prompts, passages, [q.continuations for q in questions])
        by_metric = option_text.option_predictions(lm, prompts, log_w, [q.continuations for q in questions],
                                                   progress=True)
        option_text.record(rows, method, by_metric, metric)
    return rows
