"""REPLUG's posterior weights on an accelerator (issue 37): what λ ∝ exp(s/τ + α·log p(x | d)) costs against
REPLUG's λ = softmax(s/τ), and what bf16 does to it.

    python benchmarks/bench_posterior.py            # GPU/TPU: smollm2-135m and qwen2.5-0.5b shapes, random weights
    python benchmarks/bench_posterior.py --shapes tiny --questions 4 --depth 4 --k 2 --rounds 1   # CPU smoke run

A question is `depth` retrieved passages of `doc_tokens` (retrieval scores falling with rank), its question
block x (`query_tokens`) and an answer y (`cont_tokens`). Timing, in the dtype given (default bf16):
  replug        scores y after d ∘ x for the top k passages (REPLUG's passes);
  posterior     scores x and y after d from the same k passes, then the weights (`posterior.kept_passes`);
  rerank        the same after the top `depth` passages, keeping the k with the highest posterior;
  torch_*       PyTorch (transformers, SDPA) scoring the posterior's k passes, one at a time and batched;
  generate      ensembled greedy decoding of `new_tokens` over the k passes, REPLUG's weights;
  generate_posterior / generate_rerank: the same with the weights fixed at prefill by the posterior
                (`posterior.generate`), over k and over `depth` passages.
Numerics (the first LM shape): the posterior log λ and re-ranking's kept set in each compute/weight dtype against
PyTorch float32 (TF32 off) on the same device, next to the spread of log p(x | d) across a question's passages
(the signal the error is to be read against). Weights are random: timings hold for trained weights, the size of
that spread does not.
"""
from __future__ import annotations

import argparse
import os
import string
import sys
import tempfile

import numpy as np

# JAX and PyTorch share the accelerator in one process: JAX takes 45% of its memory, not the 75% it preallocates
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_accelerator  # noqa: E402  (the shapes, the random-model builder, the device peaks)
import common  # noqa: E402

SHAPES = {"real": ["smollm2-135m", "qwen2.5-0.5b"], "tiny": ["tiny-llama"]}
VARIANTS = [("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16")]  # (compute, weights)


def make_questions(vocab: int, args, seed: int = 0) -> list[dict]:
    """Per question: `passages` [depth] token lists, `x` and `y` token lists, retrieval `scores` [depth] (falling)."""
    rng = np.random.default_rng(seed)
    ids = lambda n: rng.integers(1, vocab, n).tolist()  # noqa: E731
    return [{"passages": [ids(args.doc_tokens) for _ in range(args.depth)], "x": ids(args.query_tokens),
             "y": ids(args.cont_tokens), "scores": np.sort(rng.uniform(0.3, 0.6, args.depth))[::-1]}
            for _ in range(args.questions)]


def replug_pairs(questions, k: int) -> list[tuple[list[int], list[int]]]:
    """REPLUG's passes: context d ∘ x, continuation y."""
    return [(d + q["x"], q["y"]) for q in questions for d in q["passages"][:k]]


def posterior_pairs(questions, n: int) -> list[tuple[list[int], list[int]]]:
    """The same passes with x scored too: context d, continuation x ∘ y (one row each, as `score_with_query`)."""
    return [(d, q["x"] + q["y"]) for q in questions for d in q["passages"][:n]]


def posterior_weights(questions, scored, n: int, args) -> tuple[np.ndarray, np.ndarray]:
    """(kept positions [B, k], their log λ [B, k]) from the scored `posterior_pairs(questions, n)`."""
    from replug_jax.method import posterior

    lx = len(questions[0]["x"])
    query_ll = [[float(np.sum(scored[b * n + i][:lx], dtype=np.float64)) for i in range(n)]
                for b in range(len(questions))]  # [B][n]: Σ log p(x | d)
    scores = np.stack([q["scores"][:n] for q in questions])  # [B, n]
    return posterior.kept_passes(scores, query_ll, args.temperature, args.alpha, args.k)


def by_passage(positions: np.ndarray, log_weights: np.ndarray, n: int) -> np.ndarray:
    """Kept log λ [B, k'] at `positions` [B, k'] (best first) -> log λ by passage [B, n] (-inf: not kept)."""
    full = np.full((len(positions), n), -np.inf)
    np.put_along_axis(full, positions, log_weights, axis=1)
    return full


def as_text(ids: list[int]) -> str:
    """Token ids as lowercase text for the byte tokenizer (one token per character)."""
    letters = string.ascii_lowercase + " "
    return "".join(letters[i % len(letters)] for i in ids)


def bench_shape(name, fields, args, torch_dtype, jnp_dtype, device, record):
    import torch

    import replug_jax as rj
    from replug_jax.method import mixture, posterior

    questions = make_questions(fields["vocab_size"], args)
    with tempfile.TemporaryDirectory() as folder:
        model = bench_accelerator.save_random("lm", fields, folder, torch_dtype).to(device)
        lm = rj.load_lm(folder, batch_size=args.batch, dtype=jnp_dtype)
    scores_k = np.stack([q["scores"][: args.k] for q in questions])  # [B, k]
    replug_k, post_k, post_depth = (replug_pairs(questions, args.k), posterior_pairs(questions, args.k),
                                    posterior_pairs(questions, args.depth))

    def replug():
        lm.score_token_pairs(replug_k)
        np.asarray(mixture.log_weights_jax(scores_k, np.ones_like(scores_k, bool), args.temperature))

    def torch_scoring(pairs, size):
        with torch.inference_mode():
            for s in range(0, len(pairs), size):
                rows = [c + y for c, y in pairs[s : s + size]]
                width = max(map(len, rows))
                ids = torch.zeros((len(rows), width), dtype=torch.long)
                mask = torch.zeros_like(ids)
                for i, r in enumerate(rows):
                    ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
                logits = model(ids.to(device), attention_mask=mask.to(device)).logits
                torch.log_softmax(logits.float(), -1).max(-1).values.cpu()

    # generation: the k (or depth) passes as text, each ending with the question block x
    contexts = [[as_text(d) + as_text(q["x"]) for d in q["passages"]] for q in questions]
    queries = [as_text(q["x"]) for q in questions]
    log_w = [np.asarray(mixture.log_weights_jax(q["scores"][None], np.ones((1, args.depth), bool),
                                                     args.temperature))[0] for q in questions]  # [depth] each
    gen = dict(max_new_tokens=args.new_tokens, stop=())
    fns = {
        "replug": replug,
        "posterior": lambda: posterior_weights(questions, lm.score_token_pairs(post_k), args.k, args),
        "rerank": lambda: posterior_weights(questions, lm.score_token_pairs(post_depth), args.depth, args),
        "torch_per_pass": lambda: torch_scoring(post_k, 1),
        f"torch_batched{args.batch}": lambda: torch_scoring(post_k, args.batch),
        "generate": lambda: lm.generate([c[: args.k] for c in contexts], [w[: args.k] for w in log_w], **gen),
        "generate_posterior": lambda: posterior.generate(lm, [c[: args.k] for c in contexts], queries,
                                                         [w[: args.k] for w in log_w], alpha=args.alpha,
                                                         keep=args.k, **gen),
        "generate_rerank": lambda: posterior.generate(lm, contexts, queries, log_w, alpha=args.alpha, keep=args.k,
                                                      **gen),
    }
    for fn in fns.values():  # compile every bucket
        fn()
    times = common.interleaved_best(fns, args.rounds)
    passes = {"replug": args.k, "posterior": args.k, "rerank": args.depth, "torch_per_pass": args.k,
              f"torch_batched{args.batch}": args.k, "generate": args.k, "generate_posterior": args.k,
              "generate_rerank": args.depth}
    for impl, seconds in times.items():
        baseline = "generate" if impl.startswith("generate") else "replug"
        record({"benchmark": "posterior_cost", "shape": name, "impl": impl, "passes_per_question": passes[impl],
                "ms_per_question": 1e3 * seconds / len(questions), "vs_replug": seconds / times[baseline]})
    del model, lm


def numerics(name, fields, args, device, record):
    """The posterior's log λ over the top k and re-ranking's kept k of `depth`, per dtype, against PyTorch float32."""
    import torch

    import replug_jax as rj

    questions = make_questions(fields["vocab_size"], args, seed=1)
    pairs = posterior_pairs(questions, args.depth)
    with tempfile.TemporaryDirectory() as folder:
        model = bench_accelerator.save_random("lm", fields, folder, torch.float32).to(device)
        with torch.inference_mode():
            ref = []
            for ctx, cont in pairs:
                logits = model(torch.tensor([ctx + cont], device=device)).logits[0, len(ctx) - 1 : -1].double()
                ref.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(cont, device=device)[:, None])[:, 0]
                           .cpu().numpy())
        del model
        lx = args.query_tokens
        spread = np.mean([np.std([ref[b * args.depth + i][:lx].sum() for i in range(args.depth)])
                          for b in range(len(questions))])  # std of log p(x | d) over a question's passages
        ref_k = posterior_weights(questions, [r for b in range(len(questions)) for r in
                                              ref[b * args.depth : b * args.depth + args.k]], args.k, args)
        ref_depth = posterior_weights(questions, ref, args.depth, args)
        for compute, weights in VARIANTS:
            lm = rj.load_lm(folder, batch_size=args.batch, dtype=compute, param_dtype=weights)
            got = lm.score_token_pairs(pairs)
            got_k = posterior_weights(questions, [g for b in range(len(questions)) for g in
                                                  got[b * args.depth : b * args.depth + args.k]], args.k, args)
            got_depth = posterior_weights(questions, got, args.depth, args)
            dlog = np.abs(by_passage(*got_k, args.k) - by_passage(*ref_k, args.k))  # [B, k]
            same_kept = np.mean([set(a) == set(b) for a, b in zip(got_depth[0], ref_depth[0])])
            record({"check": "posterior_weights", "shape": name, "compute": compute, "weights": weights,
                    "max_abs_dlog_lambda": float(dlog.max()),
                    "max_abs_dlambda": float(np.abs(np.exp(by_passage(*got_k, args.k))
                                                    - np.exp(by_passage(*ref_k, args.k))).max()),
                    "rerank_same_kept_set": float(same_kept), "ref_query_loglik_spread": float(spread)})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", choices=sorted(SHAPES), default="real")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--questions", type=int, default=64)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--depth", type=int, default=16, help="re-ranking depth (passages scored per question)")
    p.add_argument("--doc-tokens", type=int, default=128)
    p.add_argument("--query-tokens", type=int, default=32, help="the question block x")
    p.add_argument("--cont-tokens", type=int, default=8, help="the answer y")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens decoded by the generation rows")
    p.add_argument("--temperature", type=float, default=0.1)
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    command = "python " + " ".join(sys.argv if argv is None else ["benchmarks/bench_posterior.py", *argv])
    rows = []

    def record(row):
        dtype = {"dtype": args.dtype} if "benchmark" in row else {}  # the checks name compute and weights
        rows.append({**row, **dtype, "device": jax.devices()[0].device_kind, "torch_device": device,
                     "command": command})

    names = SHAPES[args.shapes]
    for name in names:
        bench_shape(name, bench_accelerator.LMS[name], args, getattr(torch, args.dtype), jnp.dtype(args.dtype),
                    device, record)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # a float32 reference
    numerics(names[0], bench_accelerator.LMS[names[0]], args, device, record)
    for kind in ("benchmark", "check"):
        part = [r for r in rows if kind in r]
        common.print_table(part, [c for c in part[0] if c not in ("device", "torch_device", "command", "dtype")])
    common.write_rows(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
