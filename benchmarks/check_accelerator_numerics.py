"""bf16 numerics on an accelerator: the LM's log-probabilities and the encoder's embeddings in each compute/weight
dtype against PyTorch float32 (TF32 off) on the same device, at real model shapes with random weights.

    python benchmarks/check_accelerator_numerics.py                      # GPU: smollm2-135m and contriever-base shapes
    python benchmarks/check_accelerator_numerics.py --shapes tiny        # CPU smoke run

The test suite checks every model against transformers in float32 on CPU; this script says what the accelerator
default (bf16, `models/precision.py`) costs: per token |Δ log p|, the spread of the reference log-probs (the signal
the error is to be read against), the relative error of a passage's total log-probability (what REPLUG mixes), and
for the encoder the cosine to the reference embedding and the overlap of the top-10 neighbours it retrieves.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

# JAX and PyTorch share the accelerator in one process: JAX takes 45% of its memory, not the 75% it preallocates
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.abspath(os.path.dirname(__file__))))
import bench_accelerator  # noqa: E402  (the shapes and the random-model builder)
import common  # noqa: E402

VARIANTS = [("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16")]  # (compute, weights)


def lm_rows(name, fields, args, device, record):
    import torch

    import replug_jax as rj

    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(args.passes):
        ids = rng.integers(0, fields["vocab_size"], args.context_tokens + args.cont_tokens).tolist()
        pairs.append((ids[: args.context_tokens], ids[args.context_tokens :]))
    with tempfile.TemporaryDirectory() as folder:
        model = bench_accelerator.save_random("lm", fields, folder, torch.float32).to(device)
        with torch.inference_mode():
            ref = []
            for ctx, cont in pairs:
                logits = model(torch.tensor([ctx + cont], device=device)).logits[0, len(ctx) - 1 : -1].double()
                ref.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(cont, device=device)[:, None])[:, 0]
                           .cpu().numpy())
        del model
        for compute, weights in VARIANTS:
            lm = rj.load_lm(folder, batch_size=args.batch, dtype=compute, param_dtype=weights)
            got = lm.score_token_pairs(pairs)
            delta = np.concatenate([g - r for g, r in zip(got, ref)])
            totals = np.array([[g.sum(), r.sum()] for g, r in zip(got, ref)])
            record({"check": "lm_logprobs", "shape": name, "compute": compute, "weights": weights,
                    "max_abs_dlogp": float(np.abs(delta).max()), "mean_abs_dlogp": float(np.abs(delta).mean()),
                    "ref_logp_std": float(np.concatenate(ref).std()),
                    "max_rel_passage_logp": float(np.abs(totals[:, 0] / totals[:, 1] - 1).max())})


def encoder_rows(name, fields, args, device, record):
    import torch

    import replug_jax as rj

    rng = np.random.default_rng(1)
    rows = [rng.integers(1, fields["vocab_size"], args.doc_tokens).tolist() for _ in range(args.docs)]
    with tempfile.TemporaryDirectory() as folder:
        model = bench_accelerator.save_random("encoder", fields, folder, torch.float32).to(device)
        with torch.inference_mode():
            ref = []
            for s in range(0, len(rows), args.batch):
                hidden = model(input_ids=torch.tensor(rows[s : s + args.batch], device=device)).last_hidden_state
                ref.append(torch.nn.functional.normalize(hidden.double().mean(1), dim=-1).cpu().numpy())
        ref = np.concatenate(ref)
        del model
        queries, corpus = ref[: args.docs // 8], ref
        ref_top = np.argsort(-queries @ corpus.T, axis=1)[:, :10]
        for compute, weights in VARIANTS:
            enc = rj.load_encoder(folder, batch_size=args.batch, dtype=compute, param_dtype=weights,
                                  max_length=args.doc_tokens)
            got = enc.embed_token_rows(rows).astype(np.float64)
            cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
            top = np.argsort(-got[: len(queries)] @ got.T, axis=1)[:, :10]
            overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(top, ref_top)])
            record({"check": "encoder_embeddings", "shape": name, "compute": compute, "weights": weights,
                    "min_cosine_to_ref": float(cos.min()), "top10_overlap": float(overlap)})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", choices=sorted(bench_accelerator.SHAPES), default="real")
    p.add_argument("--passes", type=int, default=16)
    p.add_argument("--docs", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context-tokens", type=int, default=384)
    p.add_argument("--cont-tokens", type=int, default=128)
    p.add_argument("--doc-tokens", type=int, default=256)
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args(argv)

    import jax
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # a float32 reference
    command = "python " + " ".join(sys.argv if argv is None else ["benchmarks/check_accelerator_numerics.py", *argv])
    rows = []

    def record(row):
        rows.append({**row, "device": jax.devices()[0].device_kind, "jax": jax.__version__,
                     "default_matmul_precision": str(jax.config.jax_default_matmul_precision), "command": command})

    lm_shapes, encoder_shape = bench_accelerator.SHAPES[args.shapes]
    for name in lm_shapes[:1]:  # the numerics do not depend on the size the way speed does: the smaller LM shape
        lm_rows(name, bench_accelerator.LMS[name], args, device, record)
    encoder_rows(encoder_shape, bench_accelerator.ENCODERS[encoder_shape], args, device, record)
    for check in ("lm_logprobs", "encoder_embeddings"):
        part = [r for r in rows if r["check"] == check]
        common.print_table(part, [c for c in part[0] if c not in ("device", "jax", "command", "check")])
    common.write_rows(rows, args.out)
    print(json.dumps({"device": rows[0]["device"], "jax": rows[0]["jax"]}))
    return rows


if __name__ == "__main__":
    main()
