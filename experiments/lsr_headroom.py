"""How much could a better retriever gain? Oracle re-rankings of the dense top-N on held-out windows.

    python experiments/lsr_headroom.py --cache_dir runs/lsr_grid/shared --lm_cache runs/lsr_grid/lm_cache.sqlite \
        --depth 12 --k 4 --every 4
    python experiments/lsr_headroom.py --lm qwen2.5-coder-0.5b --cache_dir runs/headroom_05b/shared \
        --lm_cache runs/headroom_05b/lm_cache.sqlite --out runs/headroom_05b/headroom.json

For every `every`-th evaluation window of the demo split in CACHE_DIR (as a demo_lsr.py run left it, or built
there now: demo_lsr.py's split, datastore and index, passages cut with the --lm's own tokenizer), the LM
scores the window's continuation with each of the dense retriever's top-`depth` documents (through the shared LM
cache). Then perplexity of: REPLUG (top-k, uniform weights), random k of the top-depth, all depth documents,
and the oracle that keeps the k documents with the highest ℓ = log P_LM(y | d ∘ x). The gap between REPLUG
and the oracle bounds what LSR can gain by re-ranking the top-depth; the rank correlation between retrieval
score and ℓ says how much the retriever already knows about it, and the per-token spread of ℓ across the
top-`depth` (max − min and standard deviation, averaged over windows) says how strong a signal LSR gets.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from replug_jax.method import mixture
from replug_jax.jobs.config_files import sibling_config
from replug_jax.jobs.input_checks import check_job_inputs
from replug_jax.jobs import prepare
from replug_jax.lm.cache import CachedLM
from replug_jax.method.passages import DOC_TEMPLATE, document_passes
from replug_jax.retrieval.retriever import excluded_rows


def mixture_perplexity(logprobs: np.ndarray, lengths: list[int], pick) -> float:
    """Perplexity of REPLUG mixtures with equal weights: logprobs [W, N, T], pick(w) -> document indices."""
    total, tokens = 0.0, 0
    for w, n in enumerate(lengths):
        chosen = logprobs[w, pick(w), :n][None].astype(np.float32)  # [1, k, T]
        equal = np.zeros(chosen.shape[:2], np.float32)  # equal scores: λ = 1/k
        total += float(np.sum(mixture.mixed_logprobs_jax(chosen, equal, equal == 0, 1.0)))
        tokens += n
    return float(np.exp(-total / tokens))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (0 where either side has no spread)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if np.std(ra) and np.std(rb) else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache_dir", required=True)
    ap.add_argument("--lm_cache", required=True)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--lm", default=None, help="the scoring LM (default: demo_lsr.py's, SmolLM2)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    config = sibling_config(os.path.join("experiments", "configs", "demo_lsr.py"), "demo_lsr.py")
    config.max_eval_docs, config.max_windows_per_doc = 12, 8
    config.cache_dir, config.lm_cache = args.cache_dir, ""
    config.lm = args.lm or config.lm
    check_job_inputs(config)  # before any model loads (every setting's range: base/settings.py)
    prepared = prepare.prepare(config, args.cache_dir)  # reuses the split, datastore and index found there
    store, encoder, lm, index = prepared.store, prepared.encoder, prepared.lm, prepared.index
    windows = [w for w in prepare.make_windows(prepared.paths["eval"], prepared.tokenizer, config) if w.query][:: args.every]
    exclude = excluded_rows(store, [[w.doc_id] for w in windows], len(windows))
    scores, rows = index.search(encoder.embed([w.query for w in windows]), args.depth, exclude=exclude)
    contexts, continuations, where = document_passes(store, rows, [w.prefix for w in windows],
                                                     [w.continuation for w in windows], DOC_TEMPLATE)
    cached = CachedLM(lm, args.lm_cache)
    flat = cached.score(contexts, continuations, progress=True)
    lengths = [0] * len(windows)
    logprobs = np.full((len(windows), args.depth, max(map(len, flat))), 0.0)
    for (w, j), x in zip(where, flat):
        logprobs[w, j, : len(x)], lengths[w] = x, len(x)
    ell = logprobs.sum(-1)  # [W, N]
    closed_book = cached.score([w.prefix for w in windows], [w.continuation for w in windows])
    per_token = ell / np.maximum(np.asarray(lengths, np.float64), 1)[:, None]  # [W, N] ℓ per scored token
    k = args.k
    out = {
        "lm": config.lm, "windows": len(windows), "tokens": int(sum(lengths)), "depth": args.depth, "k": k,
        "lm_cache": cached.cache_stats(),
        "ell_per_token_range": float(np.mean(per_token.max(1) - per_token.min(1))),
        "ell_per_token_std": float(np.mean(per_token.std(1))),
        "none": float(np.exp(-sum(float(np.sum(x)) for x in closed_book) / sum(lengths))),
        "replug_top_k": mixture_perplexity(logprobs, lengths, lambda w: np.arange(k)),
        "top_1": mixture_perplexity(logprobs, lengths, lambda w: np.arange(1)),
        "random_k_of_depth": float(np.mean([mixture_perplexity(
            logprobs, lengths, lambda w: np.random.default_rng(1000 * s + w).permutation(args.depth)[:k])
            for s in range(args.seeds)])),
        "all_depth": mixture_perplexity(logprobs, lengths, lambda w: np.arange(args.depth)),
        "oracle_best_k": mixture_perplexity(logprobs, lengths, lambda w: np.argsort(-ell[w])[:k]),
        "oracle_best_1": mixture_perplexity(logprobs, lengths, lambda w: np.argsort(-ell[w])[:1]),
        "spearman_score_vs_ell": float(np.mean([spearman(scores[w], ell[w]) for w in range(len(windows))])),
    }
    report(out, args.out)


def report(out: dict, path: str | None) -> None:
    """Print the measurements as JSON, and write them to `path` if given."""
    print(json.dumps(out, indent=2))
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    from replug_jax.jobs.command_line import script_entry

    script_entry(main)  # a mistake in a setting: one line, exit 2
