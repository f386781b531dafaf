"""Ensemble scoring throughput: our jitted LocalLM against two PyTorch references, in one run.

    python benchmarks/bench_scoring.py --passes 16 --doc-tokens 128 --context-tokens 192 --cont-tokens 128

The workload is REPLUG's: for each query, k passes "document ∘ context ∘ continuation" of
about 450 tokens. References (transformers, SmolLM2 loaded from the same GGUF):
  torch_per_pass  one pass at a time, as the official REPLUG code scores documents;
  torch_per_pass_head_at_continuation  the same with the LM head only where the continuation is
                  predicted (`logits_to_keep`), as our LocalLM does;
  torch_batched   padded batches of 8 with an attention mask.
Reports tokens/s, achieved GFLOP/s and the fp32 matmul peak measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def workload(tokenizer, passes, doc_tokens, context_tokens, cont_tokens, seed=0):
    """(context ids, continuation ids) pairs cut from real English text, lengths jittered by ±8 tokens."""
    from replug_jax.data.wiki import load_wiki_articles

    text = " ".join(a.text for a in load_wiki_articles()[:3])
    ids = tokenizer.encode(text)
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(passes):
        n_ctx = doc_tokens + context_tokens + int(rng.integers(-8, 9))
        start = int(rng.integers(0, len(ids) - n_ctx - cont_tokens))
        pairs.append((ids[start : start + n_ctx], ids[start + n_ctx : start + n_ctx + cont_tokens]))
    return pairs


def torch_scorers(threads: int, lm_name: str = "smollm2"):
    import torch
    from transformers import AutoModelForCausalLM

    from replug_jax.models import registry

    torch.set_num_threads(threads)
    folder, name = os.path.split(registry.resolve(lm_name).path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()

    def per_pass(pairs):
        with torch.inference_mode():
            for ctx, cont in pairs:
                ids = torch.tensor([ctx + cont])
                logits = model(ids).logits[0, len(ctx) - 1 : -1]
                torch.log_softmax(logits, -1).gather(-1, torch.tensor(cont)[:, None])

    def per_pass_head_at_continuation(pairs):
        """As `per_pass`, with the LM head only at the positions that predict the continuation (as ours)."""
        with torch.inference_mode():
            for ctx, cont in pairs:
                logits = model(torch.tensor([ctx + cont]), logits_to_keep=len(cont) + 1).logits[0, :-1]
                torch.log_softmax(logits, -1).gather(-1, torch.tensor(cont)[:, None])

    def batched(pairs, size=8):
        with torch.inference_mode():
            for s in range(0, len(pairs), size):
                rows = [c + y for c, y in pairs[s : s + size]]
                width = max(map(len, rows))
                ids = torch.zeros((len(rows), width), dtype=torch.long)
                mask = torch.zeros_like(ids)
                for i, r in enumerate(rows):
                    ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
                torch.log_softmax(model(ids, attention_mask=mask).logits, -1)

    return per_pass, per_pass_head_at_continuation, batched


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--passes", type=int, default=16)
    p.add_argument("--doc-tokens", type=int, default=128)
    p.add_argument("--context-tokens", type=int, default=192)
    p.add_argument("--cont-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", default="1,2,4")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--length-multiple", type=int, default=None,
                   help="LocalLM's smallest length step (default: LocalLM's, 32)")
    p.add_argument("--lm", default="smollm2", help="the LM (and its GGUF as the torch reference), e.g. qwen2.5-coder-0.5b")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args()

    import jax
    import replug_jax as rj

    lm = rj.load_lm(args.lm, batch_size=1)
    pairs = workload(lm.tokenizer, args.passes, args.doc_tokens, args.context_tokens, args.cont_tokens)
    tokens = sum(len(c) + len(y) for c, y in pairs)
    c = lm.config
    non_embed = c.num_layers * (c.hidden_size * c.dims_per_head * (c.num_heads * 2 + c.num_kv_heads * 2)
                                + 3 * c.hidden_size * c.intermediate_size)
    flops = tokens * common.transformer_flops_per_token(non_embed, c.vocab_size, c.hidden_size, c.num_layers,
                                                        tokens // len(pairs) // 2)
    peak = common.matmul_peak_gflops()
    command = "python " + " ".join(sys.argv)
    rows = []

    def record(name, seconds):
        rows.append({"benchmark": "ensemble_scoring", "impl": name, "tokens_per_s": tokens / seconds,
                     "gflops": flops / seconds / 1e9, "peak_gflops": peak, "passes": len(pairs),
                     "tokens": tokens, "device": str(jax.devices()[0].platform), "command": command, "lm": args.lm})

    fns = {}
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        model = lm if bs == 1 else rj.load_lm(args.lm, batch_size=bs)
        model.length_multiple = args.length_multiple or model.length_multiple
        model.score_token_pairs(pairs)  # compile every bucket
        fns[f"jax_local_bs{bs}"] = lambda model=model: model.score_token_pairs(pairs)
    if not args.skip_torch:
        per_pass, per_pass_head, batched = torch_scorers(args.threads, args.lm)
        per_pass(pairs[:2])
        fns.update(torch_per_pass=lambda: per_pass(pairs), torch_per_pass_head_at_continuation=lambda: per_pass_head(pairs),
                   torch_batched8=lambda: batched(pairs))
    for name, seconds in common.interleaved_best(fns, args.rounds).items():
        record(name, seconds)
    if not args.skip_torch:
        best_torch = max(r["tokens_per_s"] for r in rows if r["impl"].startswith("torch"))
        for r in rows:
            r["vs_best_torch"] = r["tokens_per_s"] / best_torch
    common.print_table(rows, ["impl", "tokens_per_s", "gflops", "peak_gflops", "vs_best_torch"])
    common.write_rows(rows, args.out)


if __name__ == "__main__":
    main()
