"""The QA method "replug_posterior": REPLUG's passes weighted by the LM's posterior over passages (method/posterior.py).

For each question the top `depth` passages are retrieved; each zero-shot pass `Knowledge: d_i\\n` ∘
`Question: q\\nAnswer:` is scored (`lm.score_with_query`) for log p(x | d_i) (x: the question block, as it follows
the passage). Then

    log λ_i = log softmax_i(s_i / τ + α · log p(x | d_i)),   the k highest kept (re-ranking when depth > k),

and the generation after the few-shot block mixes the kept passes with those fixed weights. The job's ℓ is
log p(x | d_i) from zero-shot passes (`posterior_passes`), whether or not the answer NLL is reported
(`posterior.EVIDENCE`); `generate_at_prefill` reads log p(x | demos, d_i) in the generation's own prefill instead
(evidence "demos").
"""
from __future__ import annotations

import dataclasses

import numpy as np

from replug_jax.evaluate.answer_nll import answer_nll, query_and_continuation_scores
from replug_jax.evaluate.qa import generate_answers, method_passes
from replug_jax.method import posterior
from replug_jax.method.mixture import mixed_loglik
from replug_jax.method.passages import knowledge, question_block


@dataclasses.dataclass
class PosteriorPasses:
    """Per question: the kept passes' prompts, their log λ [k], log p(x | d) of the kept passes [k], the kept
    positions among the retrieved (best posterior first), and the gold answer's NLL (None without answers)."""

    contexts: list[list[str]]
    log_weights: list[np.ndarray]
    query_logliks: list[np.ndarray]
    kept: list[np.ndarray]
    answer_nll: np.ndarray | None


def posterior_passes(lm, questions, passages: list[list[str]], scores: np.ndarray, *, temperature: float,
                     alpha: float, k: int, prefix: str = "", with_answers: bool = True,
                     progress: bool = False) -> PosteriorPasses:
    """REPLUG-posterior passes of `questions` over their retrieved `passages` (best first, [Q][D]) with retrieval
    `scores` [Q, D]; `prefix` before every pass (the demo block, or "" for zero-shot scoring)."""
    posterior.check_alpha(alpha)
    empty = [i for i, ps in enumerate(passages) if not ps]
    if empty:
        raise ValueError(f"questions {empty[:5]} have no retrieved passage: replug_posterior has nothing to weigh")
    docs = [[prefix + knowledge(p) for p in ps] for ps in passages]
    queries = [question_block(q.question, None) for q in questions]
    golds = [[f" {a.strip()}" for a in q.answers] if with_answers else [] for q in questions]
    query_ll, cont_scores = query_and_continuation_scores(lm, docs, queries, golds, progress)
    order, kept_w = posterior.kept_passes(scores, query_ll, temperature, alpha, k)  # [Q, k]
    contexts, weights, kept_ll, kept, nll = [], [], [], [], []
    for i, (q, ps) in enumerate(zip(questions, passages)):
        pos = order[i][order[i] >= 0]
        contexts.append([question_block(q.question, ps[j]) for j in pos])
        weights.append(kept_w[i][: len(pos)])
        kept_ll.append(query_ll[i][pos])
        kept.append(pos)
        if with_answers:  # a question without gold answers: inf, as answer_nll.answer_nll
            nll.append(-max((mixed_loglik(weights[-1], [per_pass[j] for j in pos]) for per_pass in cont_scores[i]),
                            default=-np.inf))
    return PosteriorPasses(contexts, weights, kept_ll, kept, np.array(nll) if with_answers else None)




def predict(lm, questions, retrieved: list[list[str]], scores: np.ndarray, *, demo_prefix: str, k: int,
            temperature: float, alpha: float, ensemble: str, max_new_tokens: int, with_answers: bool = True,
            nll_with_demos: bool = False, evidence: str = posterior.EVIDENCE,
            progress: bool = True) -> tuple[list[dict], list[list[str]]]:
    """The QA job's rows for "replug_posterior": each question's generated answer from its kept passes, the kept
    ranks, their log λ and log p(x | d), and the answer NLL; and the kept passages per question (answer recall).

    ONE definition of ℓ, whatever the answer NLL does: `evidence` "question" (the default) scores log p(x | d)
    zero-shot (UPR's) in passes of its own before generating; "demos" reads log p(x | demos, d) where the generation
    reads x (with the "replug" ensemble in its own prefill: no other pass). The answer NLL (`with_answers`) is then
    the QA job's for every method: `answer_nll.answer_nll` over the kept passes with their weights (zero-shot unless
    `nll_with_demos`)."""
    if evidence not in posterior.EVIDENCES:
        raise ValueError(f"evidence must be one of {posterior.EVIDENCES}, got {evidence!r}")
    if evidence == "demos" and ensemble == "replug":
        preds, kept, weights = generate_at_prefill(lm, questions, retrieved, scores, demo_prefix=demo_prefix, k=k,
                                                   temperature=temperature, alpha=alpha,
                                                   max_new_tokens=max_new_tokens, progress=progress)
    else:
        scored = posterior_passes(lm, questions, retrieved, scores, temperature=temperature, alpha=alpha, k=k,
                                  with_answers=False, prefix=demo_prefix if evidence == "demos" else "",
                                  progress=progress)
        preds = generate_answers(lm, scored.contexts, scored.log_weights, ensemble=ensemble, demo_prefix=demo_prefix,
                                 max_new_tokens=max_new_tokens, progress=progress)
        kept, weights = scored.kept, scored.log_weights
        for p, pos, w, ll in zip(preds, kept, weights, scored.query_logliks):
            _record_weights(p, pos, w, ll)
    if with_answers:
        contexts = [[question_block(q.question, ps[j]) for j in pos] for q, ps, pos in zip(questions, retrieved, kept)]
        nll = answer_nll(lm, contexts, weights, [q.answers for q in questions],
                         prefix=demo_prefix if nll_with_demos else "", progress=progress)
        for p, value in zip(preds, nll):
            p["answer_nll"] = float(value)
    return preds, [[ps[j] for j in pos] for ps, pos in zip(retrieved, kept)]


def generate_at_prefill(lm, questions, retrieved: list[list[str]], scores: np.ndarray, *, demo_prefix: str, k: int,
                        temperature: float, alpha: float, max_new_tokens: int,
                        progress: bool = True) -> tuple[list[dict], list[np.ndarray], list[np.ndarray]]:
    """`predict`'s rows (without answer NLL) with ℓ read in the generation's own prefill: REPLUG's passes over all
    retrieved passages, weighted by the posterior (`posterior.generate`; x = the question block after the demos and
    the passage), the k best of each question mixed. -> (rows, kept positions per question best first [k'], their
    log λ [k'])."""
    contexts, retrieval_w = method_passes(questions, retrieved, scores, method="replug", temperature=temperature)
    queries = [question_block(q.question, None) for q in questions]
    gens = posterior.generate(lm, contexts, queries, retrieval_w, alpha=alpha, keep=k, max_new_tokens=max_new_tokens,
                              stop=("\n",), shared_prefix=demo_prefix, progress=progress)
    preds, kept_positions, kept_weights = [], [], []
    for g in gens:
        w = np.asarray(g.log_weights)  # [D], -inf: dropped
        kept = np.argsort(-w, kind="stable")[: int(np.isfinite(w).sum())]  # best posterior first
        p = {"prediction": g.text.strip(), "finish_reason": g.finish_reason}
        _record_weights(p, kept, w[kept], np.asarray(g.query_logliks)[kept])
        preds.append(p)
        kept_positions.append(kept)
        kept_weights.append(w[kept])
    return preds, kept_positions, kept_weights


def _record_weights(row: dict, kept, log_weights, query_logliks) -> None:
    """A prediction row's kept ranks among the retrieved, their log λ and log p(x | d)."""
    row.update(kept_ranks=[int(j) for j in kept], log_weights=[round(float(w), 6) for w in log_weights],
               question_logliks=[round(float(x), 4) for x in query_logliks])
