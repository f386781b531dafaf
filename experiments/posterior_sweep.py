"""The answer likelihood of REPLUG, the posterior, re-ranking and concatenation from ONE scoring of the passes:
τ, α and depth chosen on a dev split, reported on the held-out one (issue 37, items 4 and 5; SciQ open QA).

    python experiments/posterior_sweep.py --lm smollm2 --workdir runs/posterior_sweep/smollm2
    python experiments/posterior_sweep.py --lm qwen2.5-coder-0.5b --workdir runs/posterior_sweep/qwen05b \
        --heldout 120 --dev 60 --depth 8

Questions: sciq.py's (the SciQ validation set after its 4 demos): the held-out split is the first --heldout (the
QA tables' questions), the dev split the next --dev (before the QA-LSR training rows, which start at 300). Each
question's top --depth passages are scored once, zero-shot, as the QA job's answer NLL scores them:
`Knowledge: d / Question: q / Answer:` ∘ ` gold`, with log p(question block | d) from the same pass. Then, with
no further LM call: REPLUG (λ = softmax(s/τ)) and the posterior (λ ∝ exp(s/τ + α log p(x | d)), the k of highest
weight among the top `depth`) for every τ, α, depth and k; concat (the top k passages in one Knowledge line, cut
from the left to the LM's window) costs one pass per k (dev: k = 4 only); the oracle is the best single passage.
Answer NLL: nats per answer, the best gold answer, per-token mixture (the QA job's definition). WORKDIR/sweep.json,
table.md.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import numpy as np

from replug_jax.base import console
from replug_jax.method import mixture, posterior
from replug_jax.jobs import prepare
from replug_jax.jobs.config_files import sibling_config
from replug_jax.jobs.input_checks import check_job_inputs
from replug_jax.data import evaluation_sets
from replug_jax.evaluate.answer_nll import answer_nll, query_and_continuation_scores
from replug_jax.method.mixture import mixed_loglik
from replug_jax.models import precision
from replug_jax.method.passages import QA_DOC_TEMPLATE, passages_of, question_block
from replug_jax.retrieval.retriever import DenseRetriever

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
TAUS, ALPHAS, KS = (1.0, 0.3, 0.1, 0.03), (0.25, 0.5, 1.0, 2.0), (1, 2, 4, 8, 16)


def scored_split(lm, retriever, store, questions, depth: int) -> dict:
    """One question set's retrieval scores [Q, D], log p(x | d) [Q, D] and per gold answer the passes' token
    log-probs (the one LM call of the sweep for this split)."""
    scores, rows = retriever.retrieve([q.question for q in questions], depth)
    passages = passages_of(store, rows)
    docs = [[QA_DOC_TEMPLATE.format(passage=p) for p in ps] for ps in passages]
    golds = [[f" {a.strip()}" for a in q.answers] for q in questions]
    blocks = [question_block(q.question, None) for q in questions]
    started = time.time()
    query_ll, cont = query_and_continuation_scores(lm, docs, blocks, golds)
    tokens = np.array([[lm.count_tokens(d + x) + sum(lm.count_tokens(g) for g in gs) for d in ds]
                       for ds, x, gs in zip(docs, blocks, golds)])  # [Q, D]: LM tokens of each passage's passes
    return {"scores": scores, "query_ll": np.stack(query_ll), "cont": cont, "passages": passages, "tokens": tokens,
            "seconds": time.time() - started}


def nll_of(split: dict, log_w: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """[Q] answer NLL of the mixture of the `kept` passes [Q, k] with log weights [Q, k]."""
    return np.array([-max(mixed_loglik(log_w[i], [per_gold[j] for j in kept[i]]) for per_gold in golds)
                     for i, golds in enumerate(split["cont"])])


def replug_nll(split: dict, tau: float, k: int) -> np.ndarray:
    s = split["scores"][:, :k]
    log_w = np.asarray(mixture.log_weights_jax(s, np.ones(s.shape, bool), tau))
    return nll_of(split, log_w, np.tile(np.arange(k), (len(s), 1)))


def posterior_nll(split: dict, tau: float, alpha: float, depth: int, k: int) -> np.ndarray:
    s, ll = split["scores"][:, :depth], split["query_ll"][:, :depth]
    order, log_w = posterior.rerank(posterior.posterior_log_weights(s, np.ones(s.shape, bool), ll, tau, alpha), k)
    return nll_of(split, log_w, order)


def concat_nll(lm, split: dict, questions, k: int) -> np.ndarray:
    """One pass per question with its top k passages in one Knowledge line (the best closest to the question),
    cut from the left to the LM's window by the black-box contract, as a user of concatenation must."""
    contexts = [[question_block(q.question, " ".join(reversed(ps[:k])))] for q, ps in zip(questions, split["passages"])]
    return answer_nll(lm, contexts, [np.zeros(1)] * len(questions), [q.answers for q in questions])


def bootstrap(diff: np.ndarray, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean of `diff` over questions resampled with replacement."""
    means = diff[np.random.default_rng(seed).integers(0, len(diff), (draws, len(diff)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lm", default="smollm2")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--dev", type=int, default=100)
    ap.add_argument("--depth", type=int, default=16, help="passages scored per question (at least the table's k, 4)")
    args = ap.parse_args()
    if args.depth < 4:
        ap.error(f"--depth {args.depth}: the table compares every method at k = 4, so at least 4")
    started = time.time()
    config = sibling_config(os.path.join(CONFIGS, "sciq.py"), "sciq.py")
    config.update(dict(lm=args.lm, lm_cache=os.path.join(args.workdir, "lm_cache.sqlite")))
    check_job_inputs(config)  # before any model loads (every setting's range: base/settings.py)
    shared = os.path.join(args.workdir, "shared")
    console.setup(args.workdir, -1)
    dtype = precision.resolve(config.dtype)
    encoder, lm = prepare.load_job_encoder(config, dtype), prepare.load_job_lm(config, dtype)
    tokenizer, lm = prepare.lm_tokenizer(lm, config), prepare.cached_lm(lm, config)
    store = prepare.build_corpus(config.corpus, tokenizer, config.doc_tokens, shared)
    index = prepare.job_index(encoder, store, shared, metric=config.metric, factory=config.index_factory,
                                embedding_dtype=config.embedding_dtype)
    retriever = DenseRetriever(encoder, index, store)
    sets = {name: evaluation_sets.load_sets("qa", "sciq", shots=config.shots, max_questions=n, question_offset=off)[0]
            for name, n, off in (("heldout", args.heldout, 0), ("dev", args.dev, args.heldout))}
    splits = {name: scored_split(lm, retriever, store, qs, args.depth) for name, qs in sets.items()}
    ks = [k for k in KS if k <= args.depth]
    rows = {}  # (method, τ, α, depth, k) -> {split: per-question NLL}
    for name, split in splits.items():
        for tau, k in itertools.product(TAUS, ks):
            rows.setdefault(("replug", tau, 0.0, k, k), {})[name] = replug_nll(split, tau, k)
            depths = sorted(d for d in {k, 2 * k, args.depth} if k <= d <= args.depth)
            for alpha, depth in itertools.product(ALPHAS, depths):
                key = ("posterior", tau, alpha, depth, k)
                rows.setdefault(key, {})[name] = posterior_nll(split, tau, alpha, depth, k)
        for k in ks if name == "heldout" else [4]:  # dev: only the table's k (long concat passes are slow)
            rows.setdefault(("concat", None, None, k, k), {})[name] = concat_nll(lm, split, sets[name], k)
        rows.setdefault(("none", None, None, 0, 0), {})[name] = answer_nll(
            lm, [[question_block(q.question, None)] for q in sets[name]], [np.zeros(1)] * len(sets[name]),
            [q.answers for q in sets[name]])
        rows.setdefault(("oracle", None, None, args.depth, 1), {})[name] = np.array(
            [min(-max(np.sum(per_gold[j]) for per_gold in golds) for j in range(args.depth))
             for golds in split["cont"]])
    summary = [{"method": m, "tau": t, "alpha": a, "depth": d, "k": k,
                **{f"{s}_nll": float(v.mean()) for s, v in by_split.items()}}
               for (m, t, a, d, k), by_split in rows.items()]
    pick = lambda method, k: min((r for r in summary if r["method"] == method and r["k"] == k),
                                 key=lambda r: r["dev_nll"])
    chosen = {"replug": pick("replug", 4), "posterior": pick("posterior", 4)}
    base = rows[("replug", chosen["replug"]["tau"], 0.0, 4, 4)]["heldout"]
    lines = [f"SciQ open QA, LM {args.lm}: {args.heldout} held-out / {args.dev} dev questions, zero-shot passes, "
             f"top {args.depth} retrieved; answer NLL (nats per answer); {(time.time() - started) / 60:.1f} min", "",
             "| method | τ | α | depth → k | dev NLL | held-out NLL | vs REPLUG (dev τ) | 95% CI of the diff. |",
             "|---|---|---|---|---:|---:|---:|---|"]
    tau_p, alpha_p = chosen["posterior"]["tau"], chosen["posterior"]["alpha"]
    shown = [("none", None, None, 0, 0)]
    shown += [("replug", t, 0.0, 4, 4) for t in sorted({1.0, 0.1, chosen["replug"]["tau"]}, reverse=True)]
    shown += [("posterior", t, a, d, 4) for t in sorted({0.1, tau_p}, reverse=True) for a in sorted({0.5, 1.0, alpha_p})
              for d in sorted({4, args.depth, chosen["posterior"]["depth"]})]
    shown += [("concat", None, None, 4, 4), ("oracle", None, None, args.depth, 1)]
    for key in dict.fromkeys(shown):
        held, dev = rows[key]["heldout"], rows[key]["dev"]
        lo, hi = bootstrap(held - base)
        method, tau, alpha, depth, k = key
        mark = " (dev's best)" if any(key == tuple(c[x] for x in ("method", "tau", "alpha", "depth", "k"))
                                      for c in chosen.values()) else ""
        lines.append(f"| {method}{mark} | {tau or ''} | {'' if alpha is None else alpha} | {depth} → {k} | "
                     f"{dev.mean():.3f} | {held.mean():.3f} | {100 * (held.mean() / base.mean() - 1):+.1f}% | "
                     f"({lo:+.3f}, {hi:+.3f}) |")
    lines += ["", "Ensemble against concatenation by k (held-out NLL; REPLUG and posterior at the dev-chosen τ, α):",
              "", f"| k | REPLUG | posterior (depth = k) | posterior (depth {args.depth} → k) | concat |",
              "|---:|---:|---:|---:|---:|"]
    for k in ks:
        get = lambda key: rows[key]["heldout"].mean() if key in rows else float("nan")
        lines.append(f"| {k} | {get(('replug', chosen['replug']['tau'], 0.0, k, k)):.3f} | "
                     f"{get(('posterior', tau_p, alpha_p, k, k)):.3f} | "
                     f"{get(('posterior', tau_p, alpha_p, args.depth, k)):.3f}"
                     f" | {get(('concat', None, None, k, k)):.3f} |")
    held = splits["heldout"]
    per_token = held["seconds"] / held["tokens"].sum()  # LM seconds per token (a run that found passes cached: less)
    lines += ["", f"Cost of re-ranking (held-out, LM tokens per question; seconds at this run's "
              f"{1e3 * per_token:.2f} ms per token):", "", "| depth | LM tokens | seconds | posterior NLL at k = 4 |",
              "|---:|---:|---:|---:|"]
    for depth in sorted({4, 8, args.depth} & set(range(4, args.depth + 1))):
        n = held["tokens"][:, :depth].sum(axis=1).mean()
        nll = rows[("posterior", tau_p, alpha_p, depth, 4)]["heldout"].mean()
        lines.append(f"| {depth} | {n:.0f} | {n * per_token:.2f} | {nll:.3f} |")
    text = "\n".join(lines)
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "sweep.json"), "w") as f:
        json.dump({"lm": args.lm, "chosen": chosen, "rows": summary,
                   "lm_requests": lm.stats() if hasattr(lm, "stats") else None}, f, indent=1)
    with open(os.path.join(args.workdir, "table.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    from replug_jax.jobs.command_line import script_entry

    script_entry(main)  # a mistake in a setting: one line, exit 2
