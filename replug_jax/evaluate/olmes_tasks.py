"""OLMES's request files scored by every method (the mmlu job's `olmes:<task>:<form>` questions).

Closed book ("none") scores each request's (context, continuation) exactly as the file gives them; REPLUG
retrieves for the question and prepends each passage to the request's context (few-shot block included), the
options' continuations mixed per token with λ = softmax(s / τ); "concat" prepends all k passages joined. Every
option metric is kept per question (`option_text.OPTION_METRICS` and the log-likelihoods).
"""
from __future__ import annotations

import numpy as np

from replug_jax import console
from replug_jax.evaluate import option_text
from replug_jax.passages import passages_of


def predictions(lm, questions, methods, retrieve, store, metric: str, temperature: float, label: str = "") -> list[dict]:
    """One row per question: id, subject, answer, and per method its prediction by `metric` and
    "<method>_options" (every metric's prediction and the options' log-likelihoods).
    retrieve(method, queries) -> (scores [Q, k], rows [Q, k]) from that method's retriever."""
    rows = [{"id": q.id, "subject": q.subject, "answer": q.answer} for q in questions]
    for method in methods:
        console.phase(f"olmes {label} {method}: {len(questions)} questions")
        passages, log_w = [[] for _ in questions], [np.zeros(1, np.float32) for _ in questions]
        if method != "none":
            scores, retrieved = retrieve(method, [q.question for q in questions])
            passages = passages_of(store, retrieved)
            if method != "concat":
                log_w = [option_text.log_lambda(s, len(p), temperature) for s, p in zip(scores, passages)]
        prompts = option_text.prepended_prompts(method, [q.context for q in questions], passages)
        by_metric = option_text.option_predictions(lm, prompts, log_w, [q.continuations for q in questions])
        option_text.record(rows, method, by_metric, metric)
    return rows
