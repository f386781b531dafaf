"""How much could LSR gain on QA? The LM's signal and oracle choices among the dense top-N, on held-out SciQ.

    python experiments/qa_headroom.py --lm smollm2 --cache_dir runs/qa_lsr/smollm2/shared \
        --lm_cache runs/qa_lsr/smollm2/lm_cache.sqlite --out runs/qa_lsr/smollm2/headroom.json
    python experiments/qa_headroom.py ... --trained runs/qa_lsr/smollm2/lsr    # also the LSR retriever's ranking

For the held-out questions that sciq.py evaluates (after its demos), the LM scores the gold answer after each
of the dense retriever's top-`depth` passages, zero-shot, exactly as LSR training and the QA job's answer NLL
do ("Knowledge: <passage>\\nQuestion: ...\\nAnswer:" then " <answer>"; scores through the shared LM cache).
Reported, in nats per answer (mean over questions): REPLUG's top-k mixture at τ = 1 and τ = 0.1, the top-1
passage alone, the oracle best k of the top-`depth` (by ℓ) and the best single passage; and how strong and how
learnable the signal is: the spread of ℓ across the top-`depth`, the rank correlation of retrieval score and ℓ,
and how often the retriever's top-1 is the LM's best passage (top-1 accuracy of P_R against argmax Q).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import replug_jax as rj
from replug_jax.method import mixture
from replug_jax.jobs import prepare
from replug_jax.jobs.config_files import sibling_config
from replug_jax.jobs.input_checks import check_job_inputs
from replug_jax.data import question_sets as data
from replug_jax.evaluate import qa
from replug_jax.lm.cache import CachedLM
from replug_jax.method.passages import passage_text
from replug_jax.retrieval.retriever import DenseRetriever

from lsr_headroom import report, spearman  # experiments/: the script's own folder


def mixture_nll(per_pass: list[np.ndarray], chosen, log_w=None) -> float:
    """−log p(answer) under the per-token mixture of the chosen passes (uniform weights unless `log_w`)."""
    lps = np.stack([per_pass[i] for i in chosen])[None].astype(np.float32)  # [1, k, T]
    w = np.zeros((1, len(chosen)), np.float32) if log_w is None else np.asarray(log_w, np.float32)[None]
    return -float(np.sum(mixture.mixed_logprobs_jax(lps, w, np.ones_like(w, bool), 1.0)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lm", default="smollm2")
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--cache_dir", required=True, help="where sciq's datastore and index live (built if absent)")
    ap.add_argument("--lm_cache", required=True)
    ap.add_argument("--trained", default="", help="an LSR workdir: also the trained retriever's ranking")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    config = sibling_config(os.path.join("experiments", "configs", "sciq.py"), "sciq.py")
    config.update(dict(lm=args.lm, k=args.k, rerank_depth=max(args.depth, args.k)))
    check_job_inputs(config)  # before any model loads (every setting's range: base/settings.py)
    encoder = rj.load_encoder(config.encoder)
    lm = CachedLM(rj.load_lm(args.lm, batch_size=config.lm_batch_size), args.lm_cache)
    store = prepare.build_corpus(config.corpus, lm.tokenizer, config.doc_tokens, args.cache_dir)
    index = prepare.job_index(encoder, store, args.cache_dir, metric=config.metric,
                                factory=config.index_factory, embedding_dtype=config.embedding_dtype)
    questions = data.load_qa("sciq", config.split)[config.shots :][: args.questions]  # sciq.py's evaluated set
    retrievers = {"replug": DenseRetriever(encoder, index, store)}
    if args.trained:
        trained, documents = prepare.load_trained_encoder(encoder, args.trained)
        retrievers["replug_lsr"] = prepare.trained_retriever(
            encoder, trained, documents, store, index, args.cache_dir, metric=config.metric,
            factory=config.index_factory, embedding_dtype=config.embedding_dtype)
    out = {"lm": args.lm, "questions": len(questions), "depth": args.depth, "k": args.k}
    for name, retriever in retrievers.items():
        scores, rows = retriever.retrieve([q.question for q in questions], args.depth)
        passages = [[passage_text(store.titles[r], store.texts[r]) for r in row if r >= 0] for row in rows]
        contexts, _ = qa.method_passes(questions, passages, scores, method="replug", temperature=1.0)
        flat = lm.score([c for ctx in contexts for c in ctx],
                        [f" {q.answers[0]}" for q, ctx in zip(questions, contexts) for _ in ctx], progress=True)
        per_q, at = [], 0
        for ctx in contexts:
            per_q.append([np.asarray(x, np.float64) for x in flat[at : at + len(ctx)]])
            at += len(ctx)
        ell = [np.array([x.sum() for x in p]) for p in per_q]  # [Q][depth] ℓ = Σ_t log p(y_t | d ∘ x, y_<t)
        k = args.k
        tau = lambda t: [np.asarray(mixture.log_weights_jax(s[None, :k], np.ones((1, k), bool), t))[0]
                         for s in scores]
        stats = {
            "replug_top_k_tau1": np.mean([mixture_nll(p, range(k), w) for p, w in zip(per_q, tau(1.0))]),
            "replug_top_k_tau0.1": np.mean([mixture_nll(p, range(k), w) for p, w in zip(per_q, tau(0.1))]),
            "top_1": np.mean([-e[0] for e in ell]),
            "all_depth_uniform": np.mean([mixture_nll(p, range(len(p))) for p in per_q]),
            "oracle_best_k_of_depth": np.mean([mixture_nll(p, np.argsort(-e)[:k]) for p, e in zip(per_q, ell)]),
            "oracle_best_1": np.mean([-e.max() for e in ell]),
            "ell_range": np.mean([e.max() - e.min() for e in ell]),
            "ell_std": np.mean([e.std() for e in ell]),
            "spearman_score_vs_ell": np.mean([spearman(s[: len(e)], e) for s, e in zip(scores, ell)]),
            "top1_accuracy_pr_vs_q": np.mean([int(np.argmax(e) == 0) for e in ell]),
            "best_passage_in_top_k": np.mean([int(np.argmax(e) < k) for e in ell]),
        }
        out[name] = {key: float(v) for key, v in stats.items()}
    out["lm_cache"] = lm.cache_stats()
    report(out, args.out)


if __name__ == "__main__":
    from replug_jax.jobs.command_line import script_entry

    script_entry(main)  # a mistake in a setting: one line, exit 2
