"""REPLUG weights that know what the LM knows: the LM's posterior over the retrieved passages.

REPLUG's mixture p(y | x) = Σ_i λ_i p(y | d_i ∘ x) is a Bayesian model average over the top-k passages, and the
paper's λ = softmax(s / τ) is the retriever's prior alone. The posterior multiplies in the LM's likelihood of the
input after each passage (UPR, Sachan et al. 2022, re-ranks by the same quantity):

    log λ_i = log softmax_i( s_i / τ + α · log p(x | d_i) )        α = 0: the paper's REPLUG

x is the query the passage was retrieved for as it follows the passage in the pass (the QA question block, OLMES's
final question block, an LM window's context; never the scored continuation), so log p(x | d_i) can come from the
very pass that scores the continuation (`BlackBoxLM.score_with_query`: LM evaluation, multiple choice) or that
generates (`generate`); the QA job's default reads it from zero-shot passes of its own (`EVIDENCE`). Re-ranking
(`rerank`): of the top `depth` passages, the k with the highest posterior weight are kept and their weights
renormalised.

Here, in one module: the weights (`posterior_log_weights`, numpy float64: the one host form every caller uses) and
the re-ranking, their JAX form for a jitted prefill (`prefill_log_weights`, held equal to `kept_passes`), a pass's
passage part (`passage_part`), the request a generation carries (`PrefillPosterior`) and ensembled generation with
the posterior's weights through any black box (`generate`). The QA method on top of it is evaluate/qa_posterior.py;
its settings are checked in jobs/input_checks.py. JAX is imported at the JAX form's first call alone: a
`replug_posterior` run through the HTTP client imports no JAX (tests/test_architecture.py).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from replug_jax.base import settings
from replug_jax.base.progress import progress_keyword
from replug_jax.method import mixture

EVIDENCES = ("question", "demos")  # the QA posterior's ℓ: log p(x | d) zero-shot, or log p(x | demos, d)
EVIDENCE = "question"  # the dev sweep's (posterior_sweep.py) and every table's (docs/posterior.md)


def check_alpha(alpha: float) -> None:
    """α must be a finite number >= 0 (0: the paper's weights; its range: base/settings.py)."""
    settings.check_value("posterior_alpha", alpha, prefix="")


def combined_scores(scores, doc_mask, query_logliks, temperature: float, alpha: float,
                    dtype=np.float32) -> np.ndarray:
    """s + τ·α·log p(x | d), [B, K] in `dtype`, so that softmax(combined / τ) = softmax(s/τ + α·ℓ): the retrieval
    softmax's own stable centring serves both terms, and α 0 gives the scores back unchanged (REPLUG's weights; the
    LM evaluation mixes float32 scores in JAX, bit for bit REPLUG's). scores, query_logliks: [B, K] (query_logliks:
    Σ_t log p(x_t | d_k, x_<t)); doc_mask: [B, K] bool."""
    check_alpha(alpha)
    mask = np.asarray(doc_mask, bool)
    evidence = np.where(mask, np.asarray(query_logliks, np.float64), 0.0)  # never read where masked
    return (np.asarray(scores, np.float64) + temperature * alpha * evidence).astype(dtype)  # [B, K]


def posterior_log_weights(scores, doc_mask, query_logliks, temperature: float, alpha: float) -> np.ndarray:
    """log λ = log softmax(s / τ + α · log p(x | d)) over the valid passages of each row: float64 [B, K], -inf for
    masked passages (`mixture.log_weights`' conventions). Every host caller's posterior weights."""
    combined = combined_scores(scores, doc_mask, query_logliks, temperature, alpha, dtype=np.float64)
    return mixture.log_weights(combined, doc_mask, temperature)


def kept_mask(log_weights: np.ndarray, k: int) -> np.ndarray:
    """bool [B, D]: each row's k highest weights (`rerank`'s choice and tie rule), missing passages never kept."""
    order, _ = rerank(log_weights, k)  # [B, k']
    mask = np.zeros(np.shape(log_weights), bool)
    for b, row in enumerate(order):
        mask[b, row[row >= 0]] = True
    return mask


def rerank(log_weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions [B, k'] of each row's k highest weights, best first; their log weights renormalised [B, k']),
    k' = min(k, row width); positions of missing passages (-inf weight) are -1 with weight -inf."""
    log_weights = np.asarray(log_weights, np.float64)  # [B, D]
    kept = min(k, log_weights.shape[1])
    order = np.argsort(-log_weights, axis=1, kind="stable")[:, :kept]  # [B, k']
    top = np.take_along_axis(log_weights, order, axis=1)  # [B, k']
    return np.where(np.isfinite(top), order, -1), mixture.renormalised(top).astype(np.float32)


def kept_passes(scores: np.ndarray, query_logliks, temperature: float, alpha: float,
                k: int) -> tuple[np.ndarray, np.ndarray]:
    """`rerank(posterior_log_weights(...), k)` for rows whose first len(query_logliks[b]) passages are retrieved
    (scores [B, D], -inf: no passage; query_logliks: per row [D_b] Σ log p(x | d)): (positions [B, k'],
    renormalised log λ [B, k']). With temperature 1 and scores = log λ, it re-weighs given weights."""
    scores = np.asarray(scores)
    valid = np.zeros(scores.shape, bool)  # [B, D]
    evidence = np.zeros(scores.shape, np.float64)
    for b, ll in enumerate(query_logliks):
        valid[b, : len(ll)], evidence[b, : len(ll)] = np.isfinite(scores[b, : len(ll)]), ll
    return rerank(posterior_log_weights(scores, valid, evidence, temperature, alpha), k)


def prefill_log_weights(log_weights, query_logliks, alpha, keep: int):
    """log λ = log softmax(log_weights + α · log p(x | d)) over each row's `keep` highest (the rest -inf), in the jit:
    `kept_passes` (τ 1) with the passes left in place, in jnp so that LocalLM's jitted prefill
    (lm/local_generate.py) needs no host round trip (tests/test_generate.py holds the two equal, ties included).
    [B, K] each -> [B, K]."""
    import jax  # at the first call: the rest of the module serves the HTTP client, which imports no JAX
    import jax.numpy as jnp
    valid = log_weights > -jnp.inf
    combined = jnp.where(valid, log_weights + alpha * query_logliks, -jnp.inf)
    if keep < combined.shape[1]:
        _, top = jax.lax.top_k(combined, keep)  # [B, keep]; ties: the lower position first, as `rerank`
        chosen = jnp.zeros(combined.shape, bool).at[jnp.arange(combined.shape[0])[:, None], top].set(True)
        combined = jnp.where(chosen, combined, -jnp.inf)
    return mixture.log_weights_jax(combined, combined > -jnp.inf, 1.0)  # renormalised: softmax at τ 1


@dataclasses.dataclass(frozen=True)
class PrefillPosterior:
    """Weights fixed at prefill from the LM's posterior over passages (method/posterior.py), for `generate`: every pass
    context of question b ends with `queries[b]` (x); the generator adds α · log p(x | shared prefix, passage),
    read from the prefill's own logits, to the given log λ (the retrieval weights), keeps each question's `keep`
    highest, renormalises them and decodes with those: no pass beyond the generation's own."""

    queries: Sequence[str]
    alpha: float
    keep: int


def check_ends_with_query(context: str, query: str, where: str = "a pass context") -> None:
    """The posterior reads x at the end of each pass: refuse a pass that does not end with its (non-empty) query."""
    if not query or not context.endswith(query):
        raise ValueError(f"{where} does not end with its query {query[:40]!r}: the posterior needs x last")


def passage_part(context: str, query: str, where: str = "a pass context") -> str:
    """A pass context's text before its query x (checked to end with it): the passage and whatever precedes x."""
    check_ends_with_query(context, query, where)
    return context[: len(context) - len(query)]


def generate(lm, contexts, queries, log_weights, *, alpha: float, keep: int, max_new_tokens: int, stop=("\n",),
             shared_prefix: str = "", progress: bool = False) -> list:
    """Ensembled generation with the weights fixed at prefill by the posterior: question b's passes `contexts[b]`
    (each ending with its query x = `queries[b]`), log λ ∝ log_weights[b] + α · log p(x | shared_prefix ∘ passage),
    the `keep` best of each question mixed. An LM that reads x in its own prefill (`weights_at_prefill`: LocalLM)
    does it in the generation's pass; any other black box (HTTP) first scores x in each pass's own prompt tokens
    with `score_with_query` (one echoed request per pass), then generates with the kept passes. -> `Generation`s with
    `.log_weights` [K] (-inf: dropped) and `.query_logliks` [K], in the passes' given order."""
    check_alpha(alpha)
    if getattr(lm, "weights_at_prefill", False):
        return lm.generate(contexts, log_weights, max_new_tokens=max_new_tokens, stop=stop, shared_prefix=shared_prefix,
                           progress=progress, posterior=PrefillPosterior(list(queries), alpha, keep))
    flat = [(b, c) for b, ctx in enumerate(contexts) for c in ctx]  # x scored in the generation's own tokens
    docs = [passage_part(c, queries[b], f"a pass context of question {b}") for b, c in flat]
    scored = lm.score_with_query(docs, [queries[b] for b, _ in flat],
                                 [""] * len(flat), **({"prefix": shared_prefix} if shared_prefix else {}))
    base = np.full((len(contexts), max(len(c) for c in contexts)), -np.inf, np.float32)  # [B, K]
    query_ll, at = [], 0  # [B][K_b]
    for b, ctx in enumerate(contexts):
        base[b, : len(ctx)] = log_weights[b][: len(ctx)]
        query_ll.append([float(np.sum(q, dtype=np.float64)) for q, _ in scored[at : at + len(ctx)]])
        at += len(ctx)
    order, kept = kept_passes(base, query_ll, 1.0, alpha, keep)  # log softmax(log λ + αℓ) over the best `keep`
    positions = [o[o >= 0] for o in order]
    gens = lm.generate([[ctx[j] for j in pos] for ctx, pos in zip(contexts, positions)],
                       [w[: len(pos)] for w, pos in zip(kept, positions)], max_new_tokens=max_new_tokens, stop=stop,
                       shared_prefix=shared_prefix, **progress_keyword(lm.generate, progress))
    for b, (g, pos) in enumerate(zip(gens, positions)):
        full = np.full(len(contexts[b]), -np.inf)
        full[pos] = kept[b][: len(pos)]
        g.log_weights, g.query_logliks = full.tolist(), query_ll[b]
    return gens
