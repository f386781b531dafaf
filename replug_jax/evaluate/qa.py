"""Open-domain QA with REPLUG (§6.3, Table 5): few-shot prompts, retrieved knowledge, ensembled generation.

The prompt of pass i for a question (the paper's Table 5):

    <demo block: per demo "Knowledge: <its own top-1 passage>\\nQuestion: ...\\nAnswer: <answer>\\n\\n">
    Knowledge: <passage i>
    Question: <question>
    Answer:

The demo block is the same for every pass (and, with fixed demos, every question): it is the
`shared_prefix` of `lm.generate`, computed once. Ensembles:
  * "replug": the paper's per-token mixture (`lm.generate`: mix the k next-token distributions with
    λ = softmax(s/τ), greedy, the token fed to every pass), stopped at a newline;
  * "vote": the official code's sequence-level vote: each pass decoded greedily alone, weight
    λ_i · exp(mean token log-prob), summed per normalised answer;
  * "concat": all k passages in one Knowledge line (the best closest to the question), one pass;
  * "none": closed book, demos without knowledge.
Exact match uses the SQuAD normalisation (`qa_metrics`); answer recall@k says whether a gold answer
occurs in a retrieved passage, so retrieval and reading can be told apart.
"""
from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

from replug_jax.base.progress import progress_keyword
from replug_jax.evaluate.qa_metrics import answer_recall, exact_match, normalize_answer
from replug_jax.method import mixture
from replug_jax.method.passages import knowledge_line, passage_text, question_block  # noqa: F401 (passage_text re-exported)

ENSEMBLES = ("replug", "vote")
# "vote": REPLUG's passes with the "vote" ensemble; "replug_posterior": λ ∝ exp(s/τ + α log p(x | d)) (qa_posterior.py)
METHODS = ("none", "replug", "concat", "vote", "replug_lsr", "replug_posterior")


def demo_block(demos, demo_passages: Sequence[str | None]) -> str:
    """The few-shot prefix: each demo with its own passage (None: closed book) and its first gold answer."""
    return "".join(question_block(d.question, p, d.answers[0]) for d, p in zip(demos, demo_passages))


def method_passes(questions, passages: list[list[str]], scores: np.ndarray, *, method: str,
                  temperature: float) -> tuple[list[list[str]], list[np.ndarray]]:
    """Each question's passes under `method` (none: closed book; concat: all passages in one Knowledge line, the
    best closest to the question; otherwise one pass per passage) and their log λ = log softmax(s / τ)."""
    if method == "none":
        return [[question_block(q.question, None)] for q in questions], [np.zeros(1, np.float32)] * len(questions)
    if method == "concat":
        contexts = [[question_block(q.question, knowledge_line(p))] for q, p in zip(questions, passages)]
        return contexts, [np.zeros(1, np.float32)] * len(questions)
    contexts = [[question_block(q.question, p) for p in ps] for q, ps in zip(questions, passages)]
    valid = np.asarray([[j < len(ps) for j in range(scores.shape[1])] for ps in passages])
    log_w = np.asarray(mixture.log_weights_jax(scores, valid, temperature))  # [Q, K]
    return contexts, [log_w[i, : len(ps)] for i, ps in enumerate(passages)]


def answer_questions(lm, questions, passages: list[list[str]], scores: np.ndarray, *, method: str, ensemble: str,
                     demo_prefix: str, temperature: float, max_new_tokens: int, progress: bool = False) -> list[dict]:
    """Predictions for every question: [{"prediction", "passes": [...]?}].

    passages[q]: the question's top-k passage texts, best first; scores: [Q, K] retrieval scores."""
    if ensemble not in ENSEMBLES:
        raise ValueError(f"ensemble must be one of {ENSEMBLES}, got {ensemble!r}")
    contexts, weights = method_passes(questions, passages, scores, method=method, temperature=temperature)
    return generate_answers(lm, contexts, weights, ensemble=ensemble if method not in ("none", "concat") else "replug",
                            demo_prefix=demo_prefix, max_new_tokens=max_new_tokens, progress=progress)


def generate_answers(lm, contexts: list[list[str]], weights: list[np.ndarray], *, ensemble: str, demo_prefix: str,
                     max_new_tokens: int, progress: bool = False) -> list[dict]:
    """Each question's answer from its passes `contexts[q]` with log λ `weights[q]` by `ensemble`, after the
    few-shot block: [{"prediction", "finish_reason" or "passes"}]."""
    if ensemble not in ENSEMBLES:
        raise ValueError(f"ensemble must be one of {ENSEMBLES}, got {ensemble!r}")
    stop = ("\n",)
    if ensemble == "vote":
        return _vote(lm, contexts, weights, demo_prefix, max_new_tokens, stop, progress)
    gens = lm.generate(contexts, weights, max_new_tokens=max_new_tokens, stop=stop, shared_prefix=demo_prefix,
                       **progress_keyword(lm.generate, progress))
    return [{"prediction": g.text.strip(), "finish_reason": g.finish_reason} for g in gens]


def _vote(lm, contexts, weights, demo_prefix, max_new_tokens, stop, progress) -> list[dict]:
    """The official REPLUG code's sequence-level vote over passes decoded one by one."""
    flat = [[c] for ctx in contexts for c in ctx]
    gens = lm.generate(flat, [[0.0]] * len(flat), max_new_tokens=max_new_tokens, stop=stop, shared_prefix=demo_prefix,
                       **progress_keyword(lm.generate, progress))
    out, at = [], 0
    for ctx, w in zip(contexts, weights):
        votes: dict[str, float] = collections.defaultdict(float)
        texts: dict[str, str] = {}
        passes = []
        for lam_log, g in zip(w, gens[at : at + len(ctx)]):
            text = g.text.strip()
            mean_lp = float(np.mean(g.logprobs)) if g.logprobs else -np.inf
            key = normalize_answer(text)
            votes[key] += float(np.exp(lam_log + mean_lp))
            texts.setdefault(key, text)
            passes.append(text)
        at += len(ctx)
        best = max(votes, key=votes.get)
        out.append({"prediction": texts[best], "passes": passes})
    return out


def score_predictions(questions, predictions: list[dict], passages: list[list[str]] | None, k: int) -> dict:
    """{"exact_match": %, "answer_recall@k": % or None, "count"} and per-question flags added to `predictions`."""
    flag_predictions(questions, predictions, passages, k)
    return summarize(predictions, k)


def flag_predictions(questions, predictions: list[dict], passages: list[list[str]] | None, k: int) -> None:
    """Adds "exact_match" and (with passages) "answer_in_passages" (a gold answer in the top-k) to each prediction."""
    for i, (q, p) in enumerate(zip(questions, predictions)):
        p["exact_match"] = bool(exact_match(p["prediction"], q.answers))
        if passages is not None:
            p["answer_in_passages"] = bool(answer_recall(q.answers, passages[i][:k]))


def summarize(predictions: list[dict], k: int) -> dict:
    """{"exact_match": %, "answer_recall@k": % or None, "count"} of flagged predictions (any process's, gathered)."""
    em = [p["exact_match"] for p in predictions]
    recall = [p["answer_in_passages"] for p in predictions if "answer_in_passages" in p]
    return {"exact_match": 100.0 * float(np.mean(em)) if em else 0.0,
            f"answer_recall@{k}": 100.0 * float(np.mean(recall)) if recall else None, "count": len(em)}


def empty_answers_warning(empty: dict[str, int], count: int, shots: int) -> str | None:
    """Which methods' answers came back empty (the LM ended at once: an exact match of 0 that is no wrong answer),
    or None; the counts are in results.json's "empty_answers"."""
    said = [f"{method} {n} of {count}" for method, n in empty.items() if n]
    hint = "; few-shot demos (--config.shots) usually fix it" if not shots else ""
    return f"empty answers (the LM ended its answer at once): {', '.join(said)}{hint}" if said else None
