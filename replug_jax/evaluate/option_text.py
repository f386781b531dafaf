"""Multiple choice by each option's text (`scoring = "options"`), the convention of lm-eval-harness ("acc",
"acc_norm") and OLMES ("rc", acc_per_char) for LMs too small to have learnt the letter format.

The prompt asks the question without listing options ("Knowledge: <passage>\\nQuestion: ..\\nAnswer:"; each
shot ends with its correct option's text); each option " <text>" is the continuation. REPLUG mixes the passes
per token, as everywhere (`answer_nll.continuation_logliks`):

    ℓ(option) = Σ_t logsumexp_i( log λ_i + log p(y_t | prefix ∘ pass_i, y_<t) )

and the prediction is the argmax over options of ℓ ("acc"), ℓ / characters of " <text>" ("acc_per_char", as
OLMES counts them, the leading space included; lm-eval-harness's acc_norm divides by the option's text without
it) or ℓ / its tokens ("acc_per_token").
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from replug_jax.evaluate.answer_nll import continuation_logliks, query_and_continuation_scores
from replug_jax.method import mixture, posterior
from replug_jax.method.mixture import mixed_loglik
from replug_jax.method.passages import knowledge, question_block

SCORINGS = ("letters", "options")
OPTION_METRICS = ("acc", "acc_per_char", "acc_per_token")


def check_scoring(scoring: str, option_metric: str) -> None:
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if option_metric not in OPTION_METRICS:
        raise ValueError(f"option_metric must be one of {OPTION_METRICS}, got {option_metric!r}")


def cloze_block(example, passage: str | None, with_answer: bool = False) -> str:
    """The question without its options (QA's Table 5 block, `question_block`); a shot's ends with its correct
    option's text."""
    return question_block(example.question, passage, example.choices[example.answer] if with_answer else None)


def cloze_passes(questions, passages: Sequence[Sequence[str]], prefixes: dict[str, str]):
    """("replug_posterior"'s passes) per question: [subject prefix ∘ "Knowledge: <passage>\\n"] and the question
    block that follows each (`cloze_block` without a passage): cloze_block's prompt split where x begins."""
    docs = [[prefixes.get(q.subject, "") + knowledge(p) for p in ps]
            for q, ps in zip(questions, passages)]
    return docs, [cloze_block(q, None) for q in questions]


def continuations(example) -> list[str]:
    return [f" {choice}" for choice in example.choices]


def option_predictions(lm, prompts: Sequence[Sequence[str]], log_weights: Sequence[np.ndarray],
                       conts: Sequence[Sequence[str]], progress: bool = False) -> dict:
    """{metric: [Q] predicted option} for "acc", "acc_per_char" and "acc_per_token", and "loglik": per question
    the options' mixture log-likelihoods. prompts[q]: the question's passes; log_weights[q]: their log λ;
    conts[q]: its options' continuations (`continuations`)."""
    return predictions_by_metric(continuation_logliks(lm, prompts, log_weights, conts, progress=progress), conts)


def posterior_option_predictions(lm, doc_contexts: Sequence[Sequence[str]], queries: Sequence[str], scores: np.ndarray,
                                 conts: Sequence[Sequence[str]], *, temperature: float, alpha: float, k: int,
                                 progress: bool = False) -> dict:
    """`option_predictions` for "replug_posterior": pass i of question q is doc_contexts[q][i] ∘ queries[q] ∘
    option,
    scored once (`lm.score_with_query`); λ ∝ exp(s/τ + α log p(query | doc)) over the retrieved passes (scores
    [Q, D]), the k highest kept (method/posterior.py). Adds per question "kept" (positions), "log_weights" and
    "query_logliks" (ℓ = log p(query | passage) of each kept pass)."""
    query_ll, cont_scores = query_and_continuation_scores(lm, doc_contexts, queries, conts, progress)
    order, log_w = posterior.kept_passes(scores, query_ll, temperature, alpha, k)  # [Q, k]
    logliks = []
    for i, per_option in enumerate(cont_scores):  # per_option[o][j]: option o's token log-probs in pass j
        pos = order[i][order[i] >= 0]
        logliks.append([(mixed_loglik(log_w[i][: len(pos)], [passes[j] for j in pos]), len(passes[0]))
                        for passes in per_option])
    out = predictions_by_metric(logliks, conts)
    out["kept"] = [[int(j) for j in row if j >= 0] for row in order]
    out["log_weights"] = [[float(w) for w in row if np.isfinite(w)] for row in log_w]
    out["query_logliks"] = [[float(query_ll[i][j]) for j in kept] for i, kept in enumerate(out["kept"])]
    return out


def predictions_by_metric(logliks: Sequence[Sequence[tuple[float, int]]], conts: Sequence[Sequence[str]]) -> dict:
    """{metric: [Q] predicted option, "loglik": per question the options' log-likelihoods} from each option's
    (mixture log-likelihood, token count)."""
    out = {metric: [] for metric in OPTION_METRICS}
    out["loglik"] = []
    for row, texts in zip(logliks, conts):
        ll = np.array([v for v, _ in row])  # [n options]
        tokens = np.array([n for _, n in row], np.float64)
        chars = np.array([len(t) for t in texts], np.float64)
        out["acc"].append(int(np.argmax(ll)))
        out["acc_per_char"].append(int(np.argmax(ll / chars)))
        out["acc_per_token"].append(int(np.argmax(ll / tokens)))
        out["loglik"].append([float(v) for v in ll])
    return out


def log_lambda(scores: np.ndarray, passes: int, temperature: float) -> np.ndarray:
    """log softmax(scores[:passes] / τ): REPLUG's normalised log weights of one question's passes."""
    s = np.asarray(scores[:passes], np.float32)[None]  # [1, passes]
    return np.asarray(mixture.log_weights_jax(s, np.ones_like(s, bool), temperature))[0]
