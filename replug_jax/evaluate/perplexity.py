"""Language-modelling evaluation: perplexity and bits per byte with and without retrieval.

Methods, all scored on the same continuations through the black-box `lm.score`:
  none     the LM alone, context = the previous tokens of the document;
  <name>   a REPLUG ensemble over the top-k documents of retriever <name> (dense, BM25,
           random, a trained retriever), each document prepended separately;
  concat   the top-k dense documents concatenated into one prompt (as far as they fit);
  replug_posterior  the dense passes weighted by λ ∝ exp(s/τ + α log p(prefix | d)), the window's LM context
           after each document, read from the same passes (`score_with_query`); with `rerank_depth` the
           prefix is scored after the top rerank_depth documents and the k best kept.
A k sweep reuses the passes of the largest k: the top-k' documents of a top-k search are
its first k' rows. Windows without a retrieval query (a document's first) use `none`.

With several processes each scores its contiguous share of the windows (retrieval and LM calls
for those only) and the summed log-probabilities, tokens and bytes are gathered: the results equal
the one-process run's (up to the order of float64 sums).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from replug_jax.base import console
from replug_jax.base.progress import progress_keyword
from replug_jax.evaluate.windows import Window
from replug_jax.method import mixture, posterior
from replug_jax.method.passages import DOC_TEMPLATE, document_passes, format_docs
from replug_jax.parallel import distributed

# what the LM-evaluation job's --config.methods may name ("none" and "replug" always run; the LSR job adds
# "replug_lsr"): add a method here
METHODS = ("none", "replug", "random", "concat", "bm25", "replug_posterior")
POSTERIOR = "replug_posterior"  # REPLUG's dense passes weighted by the LM's posterior (method/posterior.py), no extra pass


@dataclasses.dataclass
class Totals:
    """Summed log-probability of a method over all continuations."""

    logprob: float = 0.0
    tokens: int = 0
    num_bytes: int = 0

    def add(self, lps: np.ndarray, num_bytes: int) -> None:
        self.logprob += float(np.sum(lps, dtype=np.float64))
        self.tokens += int(lps.shape[0])
        self.num_bytes += num_bytes

    def as_list(self) -> list:
        return [self.logprob, self.tokens, self.num_bytes]

    def metrics(self) -> dict:
        return {"perplexity": math.exp(-self.logprob / self.tokens),
                "bits_per_byte": -self.logprob / (math.log(2) * self.num_bytes)}


def mix_windows(doc_lps: list[list[np.ndarray]], lengths: list[int], scores: np.ndarray, mask: np.ndarray,
                temperature: float) -> dict[int, np.ndarray]:
    """REPLUG mixture of the masked-in documents' token log-probs, for windows that have any document.

    doc_lps[w][i]: [T_w] log-probs with document i prepended; lengths[w] = T_w; scores, mask: [W, K].
    """
    k = mask.shape[1]
    stacked = np.zeros((len(doc_lps), k, max(lengths, default=1)), np.float32)  # [W, K, T]
    for w, per_doc in enumerate(doc_lps):
        for i in range(min(k, len(per_doc))):
            stacked[w, i, : lengths[w]] = per_doc[i]
    mixed = np.asarray(mixture.mixed_logprobs_jax(stacked, scores[:, :k].astype(np.float32), mask, temperature))
    return {w: mixed[w, : lengths[w]] for w in range(len(doc_lps)) if mask[w].any()}


def posterior_choice(scores: np.ndarray, rows: np.ndarray, query_logliks: np.ndarray, k: int, depth: int,
                     temperature: float, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """The posterior's choice (method/posterior.py): of each window's first `depth` documents, the k highest by
    softmax(s/τ + α·query_logliks): (the combined scores s + τ·α·ℓ [W, D], the kept documents [W, D] bool),
    which `ensemble` mixes with those weights renormalised; depth k: REPLUG's own passes and mixture with the
    scores shifted by τ·α·ℓ (α 0: REPLUG bit for bit)."""
    valid = rows[:, :depth] >= 0  # [W, D]
    combined = posterior.combined_scores(scores[:, :depth], valid, query_logliks[:, :depth], temperature, alpha)
    weights = posterior.posterior_log_weights(scores[:, :depth], valid, query_logliks[:, :depth], temperature, alpha)
    return combined, valid & posterior.kept_mask(weights, k)  # [W, D] each


def evaluate_lm(lm, windows: list[Window], datastore, retrievers: dict, *, k: int, k_sweep: Sequence[int] = (),
                sweep_retrievers: Sequence[str] = ("replug", "random"), concat_retriever: str | None = "replug",
                temperature: float = 1.0, temperatures: dict | None = None, temperature_sweep: Sequence[float] = (),
                doc_template: str = DOC_TEMPLATE, progress: bool = True, posterior_alpha: float | None = None,
                rerank_depth: int = 0, evidence: list | None = None, method_finished=None) -> dict:
    """Perplexity and bits per byte of every method; see the module docstring.

    retrievers: name -> object with `retrieve(queries, k, exclude_sources) -> (scores [Q,k], rows [Q,k])`.
    temperatures: per-retriever softmax temperature (default `temperature`).
    temperature_sweep: τ values also reported for the sweep retrievers at k (the same passes, re-weighted).
    posterior_alpha: also report "replug_posterior" (None: not), from the "replug" retriever's passes, which then
    go to the top max(k, rerank_depth) documents; the posterior re-ranks the top rerank_depth (0: k) to k, whatever
    the k sweep retrieved.
    evidence: a list that gets one row per window (all processes' windows, in order): its document, tokens and
    bytes, and per method its summed log-probability and the passages mixed at k (datastore ids, retrieval scores,
    log λ; the posterior's kept ones with log p(context | d)).
    method_finished: called with {"perplexity", "bits_per_byte"} of the methods finished so far (over every
    process's windows) after "none" and after each retriever's methods, so a run that fails later keeps them.
    """
    temperatures = temperatures or {}
    say = console.phases(progress)
    split = distributed.lm_work_split(lm)  # this process's windows (all of them: one process, or an LM in lockstep)
    mine = split.share(len(windows))
    all_windows, windows = windows, windows[mine.start : mine.stop]
    say(f"scoring none: {len(windows)} windows without retrieval")
    base = lm.score([w.prefix for w in windows], [w.continuation for w in windows],
                    **progress_keyword(lm.score, progress))
    queried = [i for i, w in enumerate(windows) if w.query]
    queries = [windows[i].query for i in queried]
    lengths = [len(base[i]) for i in queried]  # continuation tokens of each queried window
    exclude = [[windows[i].doc_id] for i in queried]
    rows_out = [{"window": mine.start + i, "document": w.doc_id, "tokens": len(lps), "bytes": w.num_bytes,
                 "logprob": {"none": float(np.sum(lps, dtype=np.float64))}}
                for i, (w, lps) in enumerate(zip(windows, base))]  # each window's evidence (`evidence`)

    totals: dict[str, Totals] = {"none": Totals()}
    sweep: dict[str, dict[int, Totals]] = {}
    tau_sweep: dict[str, dict[float, Totals]] = {}
    for w, lps in zip(windows, base):
        totals["none"].add(lps, w.num_bytes)
    _tell_finished(method_finished, split, totals)
    for name, retriever in retrievers.items():
        posterior_here = name == "replug" and posterior_alpha is not None
        depth = max([k, *k_sweep]) if name in sweep_retrievers else k
        depth = max(depth, rerank_depth) if posterior_here else depth
        chosen = f"{depth} random" if name == "random" else f"top-{depth}"
        say(f"scoring {name}: {chosen} documents for {len(queries)} windows, each prepended separately")
        scores, rows = retriever.retrieve(queries, depth, exclude_sources=exclude)
        doc_lps, query_ll = _score_with_docs(lm, [windows[i] for i in queried], datastore, rows, doc_template,
                                             progress, with_query=posterior_here)
        tau = temperatures.get(name, temperature)
        if posterior_here and queried:
            combined, kept = posterior_choice(scores, rows, query_ll, k, rerank_depth or k, tau, posterior_alpha)
            mixed = mix_windows(doc_lps, lengths, combined, kept, tau)
            totals[POSTERIOR] = _totals(windows, base, {queried[w]: lps for w, lps in mixed.items()})
            if evidence is not None:
                _record(rows_out, queried, mixed, POSTERIOR, datastore, rows, scores, combined, kept, tau, query_ll)
        elif posterior_here:
            totals[POSTERIOR] = _totals(windows, base, {})

        mixed_at: dict[tuple[int, float], dict] = {}  # (kk, t) -> each window's mixture, for its evidence row

        def mixture_totals(kk: int, t: float) -> Totals:  # the first kk documents mixed with λ = softmax(s / t)
            mixed = mixed_at[kk, t] = mix_windows(doc_lps, lengths, scores, rows[:, :kk] >= 0, t) if queried else {}
            return _totals(windows, base, {queried[w]: lps for w, lps in mixed.items()})

        for kk in sorted({k, *(k_sweep if name in sweep_retrievers else ())}):
            sweep.setdefault(name, {})[kk] = mixture_totals(kk, tau)
        totals[name] = sweep[name][k]
        if queried and evidence is not None:  # each window's row: the mixture at k
            _record(rows_out, queried, mixed_at[k, tau], name, datastore, rows[:, :k], scores[:, :k], scores[:, :k],
                    rows[:, :k] >= 0, tau)
        for t2 in temperature_sweep if name in sweep_retrievers else ():
            tau_sweep.setdefault(name, {})[t2] = mixture_totals(k, t2)
        if name == concat_retriever:
            say(f"scoring concat: the top-{k} {name} documents in one prompt")
            concat = _score_concat(lm, [windows[i] for i in queried], queried, datastore, rows[:, :k], doc_template,
                                   progress)
            totals["concat"] = _totals(windows, base, concat)
            if evidence is not None:
                _record(rows_out, queried, {j: concat[i] for j, i in enumerate(queried) if i in concat}, "concat",
                        datastore, rows[:, :k], scores[:, :k])
        _tell_finished(method_finished, split, totals)
    _sum_over_shares(split, totals, sweep, tau_sweep)
    if evidence is not None:
        evidence.extend(row for part in (split.gather(rows_out) if split.count > 1 else [rows_out]) for row in part)

    results = {
        "perplexity": {m: t.metrics()["perplexity"] for m, t in totals.items()},
        "bits_per_byte": {m: t.metrics()["bits_per_byte"] for m, t in totals.items()},
        "tokens": totals["none"].tokens,
        "bytes": totals["none"].num_bytes,
        "windows": len(all_windows),
        "windows_with_retrieval": sum(bool(w.query) for w in all_windows),
        "k": k,
        **({"posterior": {"alpha": posterior_alpha, "rerank_depth": rerank_depth or k}}
           if posterior_alpha is not None else {}),
        "temperature": {name: temperatures.get(name, temperature) for name in retrievers},
        "k_sweep": {name: {str(kk): t.metrics() for kk, t in by_k.items()} for name, by_k in sweep.items()
                    if name in sweep_retrievers},
    }
    if tau_sweep:
        results["temperature_sweep"] = {name: {str(t): x.metrics() for t, x in by_t.items()}
                                        for name, by_t in tau_sweep.items()}
    return results


def _tell_finished(method_finished, split: distributed.WorkSplit, totals: dict[str, Totals]) -> None:
    """method_finished(metrics of the methods in `totals`, summed over the processes' shares), if given."""
    if method_finished is None:
        return
    summed = {m: dataclasses.replace(t) for m, t in totals.items()}  # copies: the running totals stay per share
    _sum_over_shares(split, summed)
    method_finished({metric: {m: t.metrics()[metric] for m, t in summed.items()}
                     for metric in ("perplexity", "bits_per_byte")})


def _sum_over_shares(split: distributed.WorkSplit, *trees) -> None:
    """Add every share's sums into the Totals of `trees` (dicts, possibly nested), in place."""
    if split.count == 1:
        return
    leaves = list({id(t): t for t in _totals_in(trees)}.values())  # one object may sit in two dicts
    parts = split.gather([t.as_list() for t in leaves])  # [share][leaf] = [logprob, tokens, bytes]
    for i, t in enumerate(leaves):
        t.logprob, t.tokens, t.num_bytes = (sum(part[i][j] for part in parts) for j in range(3))


def _totals_in(tree):
    """The Totals in a tree of tuples and dicts, in key order (the same order in every process)."""
    if isinstance(tree, Totals):
        yield tree
    else:
        for value in (tree if isinstance(tree, tuple) else (tree[key] for key in sorted(tree, key=str))):
            yield from _totals_in(value)


def _score_with_docs(lm, windows, datastore, rows, template, progress, with_query: bool = False):
    """(doc_lps[w][i]: log-probs of window w's continuation with its i-th document prepended; with_query: [W, D]
    Σ log p(prefix | document) from the same passes, `lm.score_with_query` (None without))."""
    contexts, continuations, where = document_passes(datastore, rows, [w.prefix for w in windows],
                                                     [w.continuation for w in windows], template)
    query_ll = np.zeros(rows.shape, np.float64) if with_query else None  # [W, D]
    if with_query and contexts:  # the pass is document ∘ prefix ∘ continuation, as REPLUG's: split where x begins
        docs = [c[: len(c) - len(windows[w].prefix)] for c, (w, _) in zip(contexts, where)]
        pairs = lm.score_with_query(docs, [windows[w].prefix for w, _ in where], continuations,
                                    **progress_keyword(lm.score_with_query, progress))
        flat = [c for _, c in pairs]
        for (w, rank), (q, _) in zip(where, pairs):
            query_ll[w, rank] = np.sum(q, dtype=np.float64)
    else:
        flat = lm.score(contexts, continuations, **progress_keyword(lm.score, progress)) if contexts else []
    out: list[list[np.ndarray]] = [[] for _ in windows]
    for (w, _), lps in zip(where, flat):
        out[w].append(lps)
    return out, query_ll


def _score_concat(lm, windows, window_ids, datastore, rows, template, progress) -> dict[int, np.ndarray]:
    """All top-k documents in one prompt, the best closest to the input; the LM cuts from the left to fit."""
    keep = [j for j, row in enumerate(rows) if (row >= 0).any()]
    contexts = ["".join(format_docs(datastore, [r for r in rows[j][::-1] if r >= 0], template)) + windows[j].prefix
                for j in keep]
    lps = (lm.score(contexts, [windows[j].continuation for j in keep], **progress_keyword(lm.score, progress))
           if keep else [])
    return {window_ids[j]: x for j, x in zip(keep, lps)}


def _record(rows_out: list[dict], queried: list[int], mixed: dict[int, np.ndarray], method: str, datastore,
            rows: np.ndarray, scores: np.ndarray, mixing_scores: np.ndarray | None = None,
            kept: np.ndarray | None = None, temperature: float = 1.0, query_logliks: np.ndarray | None = None) -> None:
    """Each queried window's evidence for `method` into its row of `rows_out`: the summed log-probability and the
    passages (datastore ids, retrieval scores, and where passes are mixed log λ = log softmax(mixing score / τ) over
    `kept` [W, D], with log p(context | d) for the posterior). rows, scores: [W, D]; `mixed`: by queried position."""
    log_w = None if kept is None else np.asarray(mixture.log_weights_jax(mixing_scores, kept, temperature))
    for j, i in enumerate(queried):
        if j not in mixed:  # no document found for this window: `none`'s numbers stand
            continue
        take = np.flatnonzero(rows[j] >= 0 if kept is None else kept[j])
        take = take[np.argsort(-log_w[j, take], kind="stable")] if kept is not None else take  # best weight first
        got = {"passage_ids": [datastore.ids[int(r)] for r in rows[j, take]],
               "passage_scores": [round(float(s), 6) for s in scores[j, take]]}
        if log_w is not None:
            got["log_weights"] = [round(float(w), 6) for w in log_w[j, take]]
        if query_logliks is not None:
            got["log_p_context"] = [round(float(x), 4) for x in query_logliks[j, take]]
        rows_out[i][method] = got
        rows_out[i]["logprob"][method] = float(np.sum(mixed[j], dtype=np.float64))


def _totals(windows: list[Window], base: list[np.ndarray], retrieved: dict[int, np.ndarray]) -> Totals:
    t = Totals()
    for i, w in enumerate(windows):
        t.add(retrieved.get(i, base[i]), w.num_bytes)
    return t
