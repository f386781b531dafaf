"""Ensembled greedy decoding (REPLUG generation) throughput: our jitted KV-cache decoder against PyTorch.

    python benchmarks/bench_generate.py --questions 4 --passes 4 --prefix-tokens 256 --doc-tokens 128 --new-tokens 16

Workload: B questions, each with K passes "few-shot prefix ∘ passage_i ∘ question"; at every step the K
next-token distributions are mixed with λ and the argmax is fed to all K passes, until the end-of-sequence
token or --new-tokens (no stop string). Implementations, timed interleaved in one run:
  jax_shared      LocalLM.generate with the prefix computed once and its cache copied to the B·K rows;
  jax_full        the same decoder with the prefix part of every pass (no sharing);
  torch_kv        transformers SmolLM2 (same GGUF, fp32), per question the K passes batched (left padding,
                  attention mask, position ids), KV cache (past_key_values), the mixture computed by hand.
Reports generated tokens/s (answer tokens per second, prefill included), the ratio to torch, and the LM FLOPs per question
with and without prefix sharing.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def workload(tokenizer, questions, passes, prefix_tokens, doc_tokens, seed=0):
    """(prefix text, contexts [B][K], log λ [B, K]) cut from real English text at token boundaries."""
    from replug_jax.data.wiki import load_wiki_articles

    text = " ".join(a.text for a in load_wiki_articles()[:4])
    ids = tokenizer.encode(text)
    rng = np.random.default_rng(seed)
    cut = lambda n: tokenizer.decode(ids[(s := int(rng.integers(0, len(ids) - n))) : s + n])
    prefix = "Knowledge: " + cut(prefix_tokens) + "\nQuestion: What is it?\nAnswer: it\n\n"
    contexts = [["Knowledge: " + cut(doc_tokens) + f"\nQuestion: What is item {b}?\nAnswer:" for _ in range(passes)]
                for b in range(questions)]
    scores = rng.uniform(0.2, 0.8, size=(questions, passes))
    log_w = scores - np.log(np.exp(scores).sum(-1, keepdims=True))
    return prefix, contexts, log_w.astype(np.float32)


def torch_decoder(threads: int, lm_name: str = "smollm2"):
    import torch
    from transformers import AutoModelForCausalLM

    from replug_jax.models import registry

    torch.set_num_threads(threads)
    folder, name = os.path.split(registry.resolve(lm_name).path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()

    def decode(rows: list[list[int]], log_w: np.ndarray, new_tokens: int, eos_id: int | None) -> list[int]:
        """One question: K passes batched with left padding, the mixture by hand, greedy, KV cache."""
        width = max(map(len, rows))
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):], mask[i, width - len(r):] = torch.tensor(r), 1
        weights = torch.tensor(log_w)[:, None]
        out, past = [], None
        with torch.inference_mode():
            for _ in range(new_tokens):
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                step_ids = ids if past is None else ids[:, -1:]
                step_pos = positions if past is None else positions[:, -1:]
                result = model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos, past_key_values=past,
                               use_cache=True)
                past = result.past_key_values
                mixed = torch.logsumexp(weights + torch.log_softmax(result.logits[:, -1].float(), -1), dim=0)
                token = int(mixed.argmax())
                out.append(token)
                if token == eos_id:  # as LocalLM.generate: the end-of-sequence token ends the answer
                    break
                ids = torch.cat([ids, torch.full((len(rows), 1), token)], 1)
                mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], 1)
        return out

    return decode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--prefix-tokens", type=int, default=256)
    parser.add_argument("--doc-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--lm", default="smollm2", help="the LM (and its GGUF as the torch reference), e.g. qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results.jsonl"))
    args = parser.parse_args()

    import jax

    import replug_jax as rj

    lm = rj.load_lm(args.lm, batch_size=8)
    prefix, contexts, log_w = workload(lm.tokenizer, args.questions, args.passes, args.prefix_tokens, args.doc_tokens)
    full_contexts = [[prefix + c for c in q] for q in contexts]
    torch_decode = torch_decoder(args.threads, args.lm)
    tok = lm.tokenizer
    rows = [[tok.encode(prefix) + tok.encode(c) for c in q] for q in contexts]  # the contract's tokenisation

    run = {
        "jax_shared": lambda: lm.generate(contexts, log_w, max_new_tokens=args.new_tokens, stop=(), shared_prefix=prefix),
        "jax_full": lambda: lm.generate(full_contexts, log_w, max_new_tokens=args.new_tokens, stop=()),
        "torch_kv": lambda: [torch_decode(r, w, args.new_tokens, tok.eos_id) for r, w in zip(rows, log_w)],
    }
    outputs = {name: fn() for name, fn in run.items()}  # warm-up (compilation) and the tokens to compare
    agree = np.mean([a.token_ids == b for a, b in zip(outputs["jax_shared"], outputs["torch_kv"])])
    generated = {"torch_kv": sum(map(len, outputs["torch_kv"])),
                 **{name: sum(len(g.token_ids) for g in outputs[name]) for name in ("jax_shared", "jax_full")}}
    times = common.interleaved_best(run, rounds=args.rounds)

    n_prefix, n_ctx = len(tok.encode(prefix)), float(np.mean([len(tok.encode(c)) for q in contexts for c in q]))
    per_token = common.transformer_flops_per_token(
        sum(x.size for x in jax.tree_util.tree_leaves(lm.params)) - lm.config.vocab_size * lm.config.hidden_size,
        lm.config.vocab_size, lm.config.hidden_size, lm.config.num_layers, n_prefix + int(n_ctx))
    k, new = args.passes, args.new_tokens
    flops_shared = per_token * (n_prefix / args.questions + k * (n_ctx + new))  # the prefix once per batch
    flops_full = per_token * k * (n_prefix + n_ctx + new)
    rows_out = []
    for name, seconds in times.items():
        rows_out.append({"benchmark": "generate", "impl": name, "tokens_per_s": generated[name] / seconds,
                         "tokens": generated[name],
                         "vs_torch": times["torch_kv"] / seconds, "seconds": seconds,
                         "gflop_per_question": (flops_full if name != "jax_shared" else flops_shared) / 1e9,
                         "questions": args.questions, "passes": k, "prefix_tokens": n_prefix,
                         "context_tokens": n_ctx, "new_tokens": new, "tokens_agree_with_torch": float(agree),
                         "jax_devices": len(jax.devices()), "command": "python " + " ".join(sys.argv), "lm": args.lm})
    common.print_table(rows_out, ["impl", "tokens_per_s", "vs_torch", "seconds", "gflop_per_question"])
    print(f"greedy tokens equal to torch's for {agree:.0%} of questions; prefix {n_prefix} tokens, "
          f"passage+question {n_ctx:.0f}, k={k}")
    common.write_rows(rows_out, args.out)


if __name__ == "__main__":
    main()
