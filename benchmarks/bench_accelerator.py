"""Accelerator benchmark: REPLUG ensemble scoring, corpus embedding and the LSR train step at real model shapes,
in bf16, against PyTorch (transformers, SDPA) one pass at a time and batched, in the same run.

    python benchmarks/bench_accelerator.py                       # GPU/TPU: smollm2-135m, llama-1b, contriever-base
    python benchmarks/bench_accelerator.py --shapes tiny --dtype float32 --passes 8   # CPU smoke run (the tests)

Weights are random (timing does not depend on them): each shape is built as a transformers model, saved as
safetensors and loaded by both sides. Token ids are random. Reports tokens/s and model FLOP utilisation
(model FLOPs: 2 x parameters x tokens for a forward pass plus attention, 3x that for a training step) against
the device's bf16 dense peak (table below; on CPU the fp32 matmul peak measured in the run). Targets on an
H100: scoring >= 3x the per-pass PyTorch loop, >= 40% MFU for the 1B shape.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile

import numpy as np

# JAX and PyTorch share the accelerator in one process: JAX takes 45% of its memory, not the 75% it preallocates
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

# bf16 dense peak FLOP/s by device kind (vendor figures, no sparsity)
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "TPU v4": 275e12, "TPU v5 lite": 197e12,
              "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12}

LMS = {  # transformers LlamaConfig fields (Qwen2Config's with architecture="qwen2")
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True),
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(architecture="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "tiny-llama": dict(vocab_size=260, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False),
}
ENCODERS = {  # transformers BertConfig fields
    "contriever-base": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072, max_position_embeddings=512),
    "tiny-bert": dict(vocab_size=260, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=512),
}
SHAPES = {"real": (["smollm2-135m", "llama-1b"], "contriever-base"), "tiny": (["tiny-llama"], "tiny-bert")}


def peak_flops(device) -> tuple[float, str]:
    for kind, flops in PEAK_FLOPS.items():
        if kind.lower() in device.device_kind.lower():
            return flops, f"{kind} bf16 dense"
    return common.matmul_peak_gflops() * 1e9, "measured fp32 matmul (CPU)"


def save_random(kind: str, fields: dict, folder: str, torch_dtype):
    """A random transformers model of the given shape saved to `folder` (safetensors + a byte tokenizer)."""
    import torch
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from tests.hf_tiny import save_tiny_tokenizer

    torch.manual_seed(0)
    if kind == "lm":
        fields = dict(fields)
        config, model_class = {"llama": (LlamaConfig, LlamaForCausalLM),
                               "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[fields.pop("architecture", "llama")]
        model = model_class(config(max_position_embeddings=2048, **fields))
    else:
        model = BertModel(BertConfig(**fields), add_pooling_layer=False)
    model = model.to(torch_dtype).eval()
    model.save_pretrained(folder)
    save_tiny_tokenizer(folder)
    return model


def count_params(model, skip_embeddings: bool = True) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if not (skip_embeddings and "embed" in n))


def bench_scoring(name, fields, args, torch_dtype, jnp_dtype, device, record):
    import torch

    import replug_jax as rj

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        model = save_random("lm", fields, folder, torch_dtype).to(device)
        lm = rj.load_lm(folder, batch_size=args.batch, dtype=jnp_dtype, model_parallel=args.model_parallel)
    pairs = []
    for _ in range(args.passes):
        n_ctx = args.context_tokens + int(rng.integers(-8, 9))
        ids = rng.integers(0, fields["vocab_size"], n_ctx + args.cont_tokens).tolist()
        pairs.append((ids[:n_ctx], ids[n_ctx:]))
    tokens = sum(len(c) + len(y) for c, y in pairs)
    flops = tokens * common.transformer_flops_per_token(count_params(model), fields["vocab_size"],
                                                        fields["hidden_size"], fields["num_hidden_layers"],
                                                        tokens // len(pairs) // 2)

    def per_pass():
        with torch.inference_mode():
            for ctx, cont in pairs:
                logits = model(torch.tensor([ctx + cont], device=device)).logits[0, len(ctx) - 1 : -1]
                torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(cont, device=device)[:, None]).cpu()

    def batched():
        with torch.inference_mode():
            for s in range(0, len(pairs), args.batch):
                rows = [c + y for c, y in pairs[s : s + args.batch]]
                width = max(map(len, rows))
                ids = torch.zeros((len(rows), width), dtype=torch.long)
                mask = torch.zeros_like(ids)
                for i, r in enumerate(rows):
                    ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
                logits = model(ids.to(device), attention_mask=mask.to(device)).logits
                torch.log_softmax(logits.float(), -1).max(-1).values.cpu()

    lm.score_token_pairs(pairs)  # compile every bucket
    per_pass(), batched()
    times = common.interleaved_best({"jax": lambda: lm.score_token_pairs(pairs), "torch_per_pass": per_pass,
                                     f"torch_batched{args.batch}": batched}, args.rounds)
    for impl, seconds in times.items():
        record("ensemble_scoring", name, impl, tokens, seconds, flops, vs=times["torch_per_pass"] / seconds)


def bench_encoder(name, fields, args, torch_dtype, jnp_dtype, device, record):
    """Corpus embedding (forward, mean pooling) and the LSR train step (forward + backward + Adam)."""
    import torch

    import replug_jax as rj
    from replug_jax.parallel import sharding
    from replug_jax.train import step as train_step_lib

    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as folder:
        model = save_random("encoder", fields, folder, torch_dtype).to(device)
        encoder = rj.load_encoder(folder, batch_size=args.batch, dtype=jnp_dtype, max_length=args.doc_tokens)
    vocab, per_token = fields["vocab_size"], 2 * count_params(model)
    rows = [rng.integers(1, vocab, args.doc_tokens).tolist() for _ in range(args.passes)]
    tokens = len(rows) * args.doc_tokens

    def pool(ids, mask):
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)

    def torch_embed(size):
        with torch.inference_mode():
            for s in range(0, len(rows), size):
                ids = torch.tensor(rows[s : s + size], device=device)
                pool(ids, torch.ones_like(ids)).cpu()

    encoder.embed_token_rows(rows)
    torch_embed(args.batch)
    times = common.interleaved_best({"jax": lambda: encoder.embed_token_rows(rows),
                                     "torch_per_pass": lambda: torch_embed(1),
                                     f"torch_batched{args.batch}": lambda: torch_embed(args.batch)}, args.rounds)
    for impl, seconds in times.items():
        record("corpus_embedding", name, impl, tokens, seconds, per_token * tokens, vs=times["torch_per_pass"] / seconds)

    # LSR step: B queries of Lq tokens, K documents of Ld tokens each
    b, k, lq, ld = args.batch, args.lsr_docs, args.query_tokens, args.doc_tokens
    batch = {"query_ids": rng.integers(1, vocab, (b, lq)).astype(np.int32), "query_mask": np.ones((b, lq), np.int32),
             "doc_ids": rng.integers(1, vocab, (b, k, ld)).astype(np.int32),
             "doc_mask_tokens": np.ones((b, k, ld), np.int32), "doc_valid": np.ones((b, k), bool),
             "lm_scores": rng.normal(size=(b, k)).astype(np.float32)}
    step_tokens = b * (lq + k * ld)
    mesh = sharding.global_mesh()
    optimizer = train_step_lib.make_optimizer(1e-5, 1000)
    step = train_step_lib.make_train_step(encoder.config, optimizer, mesh, gamma=0.1, beta=0.1, dtype=jnp_dtype)
    state = [train_step_lib.init_train_state(encoder.params, optimizer, mesh)]

    def jax_step():
        state[0], metrics = step(state[0], batch)
        float(metrics["loss"])

    t = {key: torch.tensor(value, device=device) for key, value in batch.items()}

    def make_torch_step(net, autocast: bool):
        """Adam on `net`'s own weights; `autocast`: float32 master weights with bf16 matmuls (what the jax step
        does: it trains float32 weights in the compute dtype), else every weight and update in `net`'s dtype."""
        net.train()
        opt = torch.optim.Adam(net.parameters(), lr=1e-5)

        def embed(ids, mask):
            hidden = net(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            return torch.nn.functional.normalize((hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)

        def torch_step():
            with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
                q = embed(t["query_ids"].long(), t["query_mask"])  # [B, D]
                d = embed(t["doc_ids"].long().reshape(b * k, ld), t["doc_mask_tokens"].reshape(b * k, ld)).reshape(b, k, -1)
            log_pr = torch.log_softmax(torch.einsum("bd,bkd->bk", q, d) / 0.1, -1)
            log_q = torch.log_softmax(t["lm_scores"] / 0.1, -1)
            loss = (log_pr.exp() * (log_pr - log_q)).sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            float(loss.detach())

        return torch_step

    steps = {"jax": jax_step, "torch": make_torch_step(model, autocast=False)}
    if args.dtype == "bfloat16":  # the mixed-precision reference: float32 weights, bf16 compute
        steps["torch_autocast"] = make_torch_step(copy.deepcopy(model).float(), autocast=True)
    for fn in steps.values():
        fn()
    times = common.interleaved_best(steps, args.rounds)
    for impl, seconds in times.items():
        record("lsr_train_step", name, impl, step_tokens, seconds, 3 * per_token * step_tokens,
               vs=times["torch"] / seconds)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", choices=sorted(SHAPES), default="real")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--passes", type=int, default=64, help="REPLUG passes (k x queries) / passages to embed")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context-tokens", type=int, default=384, help="document + input tokens of a pass")
    p.add_argument("--cont-tokens", type=int, default=128)
    p.add_argument("--doc-tokens", type=int, default=256)
    p.add_argument("--query-tokens", type=int, default=64)
    p.add_argument("--lsr-docs", type=int, default=8, help="documents per query in the LSR step")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model-parallel", type=int, default=1, help="the LM's model-axis size (lm_model_parallel)")
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype, jnp_dtype = getattr(torch, args.dtype), jnp.dtype(args.dtype)
    peak, peak_source = peak_flops(jax.devices()[0])
    command = "python " + " ".join(sys.argv if argv is None else ["benchmarks/bench_accelerator.py", *argv])
    rows = []

    def record(benchmark, shape, impl, tokens, seconds, flops, vs):
        rows.append({"benchmark": benchmark, "shape": shape, "impl": impl, "dtype": args.dtype,
                     "model_parallel": args.model_parallel if benchmark == "ensemble_scoring" else 1,
                     "tokens_per_s": tokens / seconds, "mfu": flops / seconds / peak, "vs_torch_per_pass": vs,
                     "peak_flops": peak, "peak_source": peak_source, "device": jax.devices()[0].device_kind,
                     "torch_device": device, "command": command})

    lm_shapes, encoder_shape = SHAPES[args.shapes]
    for name in lm_shapes:
        bench_scoring(name, LMS[name], args, torch_dtype, jnp_dtype, device, record)
    bench_encoder(encoder_shape, ENCODERS[encoder_shape], args, torch_dtype, jnp_dtype, device, record)
    common.print_table(rows, ["benchmark", "shape", "impl", "tokens_per_s", "mfu", "vs_torch_per_pass"])
    common.write_rows(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
