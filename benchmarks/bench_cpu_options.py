"""The CPU choices behind issue 19 item 11 as A/B timings in one process (benchmarks/README.md "CPU speed").

    python benchmarks/bench_cpu_options.py --rounds 4

encoder: MiniLM embedding 32 passages of 136 tokens (every third cut to 90) compiled with XLA's defaults,
         with `xla_cpu.NO_YNNPACK` (no YNNPACK fusions: what DenseEncoder used below jaxlib 0.12 until issue 72), and with that
         plus one attention op per batch row (faster, compiles ~6x longer: not used); PyTorch's forward of the same
         padded batch as the reference.
scoring: SmolLM2 scoring 8 REPLUG passes of ~450 tokens in batches of 4 with the attention in query blocks
         (what LocalLM uses) or over all keys, each with XLA's defaults and without YNNPACK fusions.
Best of `--rounds`, interleaved; seconds per call and compile seconds go to results.jsonl with the command.
"""
from __future__ import annotations

import argparse
import os
import sys
from unittest.mock import patch
import time

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

NO_YNNPACK = {"xla_cpu_experimental_ynn_fusion_type": ""}


def per_row(attend):
    """`attend` applied to each batch row separately: [B, L, H, Dh] -> [B, L, H, Dh]."""
    import jax.numpy as jnp

    return lambda q, k, v, bias: jnp.concatenate([attend(q[i : i + 1], k[i : i + 1], v[i : i + 1], bias[i : i + 1])
                                                  for i in range(q.shape[0])])


def warmed(build, run):
    """(run, compile seconds): `build()` makes the object, its first `run` compiles."""
    obj = build()
    start = time.perf_counter()
    run(obj)
    return (lambda: run(obj)), time.perf_counter() - start


def encoder_fns(threads: int):
    import numpy as np
    import torch
    from transformers import AutoModel

    import replug_jax as rj
    from replug_jax.parallel import sharding, xla_cpu
    from replug_jax.models import layers, registry

    rows = [list(map(int, r)) for r in np.random.default_rng(0).integers(1000, 20000, (32, 136))]
    rows = [r[:90] if i % 3 == 0 else r for i, r in enumerate(rows)]
    embed = lambda enc: enc.embed_token_rows(rows)
    variants = {"encoder_xla_defaults": ({}, layers.dot_product_attention),
                "encoder_without_ynnpack": (xla_cpu.NO_YNNPACK, layers.dot_product_attention),
                "encoder_without_ynnpack_attention_per_row": (xla_cpu.NO_YNNPACK,
                                                              per_row(layers.dot_product_attention))}
    fns, compile_s = {}, {}
    for name, (options, attend) in variants.items():
        with patch.multiple(xla_cpu, ENCODER=options), patch.multiple(layers, dot_product_attention=attend):
            fns[name], compile_s[name] = warmed(lambda: rj.load_encoder("minilm"), embed)

    torch.set_num_threads(threads)
    model = AutoModel.from_pretrained(registry.packaged_path("minilm")).eval()
    ids, mask = (torch.tensor(a).long() for a in sharding.pad_rows(rows, 136, 0, len(rows)))

    def torch_forward():
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask)

    fns["encoder_torch"] = torch_forward
    return fns, compile_s


def scoring_fns(threads: int):  # noqa: ARG001 (one signature for both groups)
    import replug_jax as rj
    from bench_scoring import workload
    from replug_jax.parallel import xla_cpu
    from replug_jax.models import layers

    pairs = workload(rj.load_tokenizer("smollm2"), 8, 128, 192, 128)
    score = lambda lm: lm.score_token_pairs(pairs)
    all_keys = 1 << 30  # a block longer than any pass: attention over all keys
    variants = {"scoring_blocks_xla_defaults": ({}, layers.CAUSAL_BLOCK),
                "scoring_blocks_without_ynnpack": (NO_YNNPACK, layers.CAUSAL_BLOCK),
                "scoring_all_keys_xla_defaults": ({}, all_keys),
                "scoring_all_keys_without_ynnpack": (NO_YNNPACK, all_keys)}
    fns, compile_s = {}, {}
    for name, (options, block) in variants.items():
        with patch.multiple(xla_cpu, LM_SCORING=options), patch.multiple(layers, CAUSAL_BLOCK=block):
            fns[name], compile_s[name] = warmed(lambda: rj.load_lm("smollm2", batch_size=4), score)
    return fns, compile_s


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--groups", default="encoder,scoring", help="which groups to time (comma-separated)")
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args(argv)
    groups = {"encoder": encoder_fns, "scoring": scoring_fns}
    command = "python benchmarks/bench_cpu_options.py " + " ".join(sys.argv[1:] if argv is None else argv)
    rows = []
    for build in (groups[name] for name in args.groups.split(",")):
        fns, compile_s = build(args.threads)
        for name, seconds in common.interleaved_best(fns, args.rounds).items():
            rows.append({"benchmark": "cpu_options", "impl": name, "seconds": seconds,
                         "first_call_seconds": compile_s.get(name), "command": command.strip()})
    common.print_table(rows, ["impl", "seconds", "first_call_seconds"])
    common.write_rows(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
