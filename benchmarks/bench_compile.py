"""Compile time of the LM's scoring function against depth: 12, 24 and 48 layers.

    python benchmarks/bench_compile.py [--layers 12,24,48 --label after --out benchmarks/results.jsonl]

Times `jax.jit(causal_lm.logprobs_at).lower(...).compile()` for a small Llama (hidden 256, 4 heads, 2 KV
heads, vocabulary 4,096) at one batch shape [8, 256], on the default backend; shapes only matter, so the
weights are abstract. With the layers unrolled in Python, compile time grows with depth; under a scan over
stacked layer weights it should stay flat.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp

from replug_jax.models import architectures, causal_lm

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def compile_seconds(layers: int, batch: int = 8, length: int = 256) -> float:
    config = causal_lm.CausalLMConfig(arch="llama", vocab_size=4096, hidden_size=256, num_layers=layers, num_heads=4,
                                      num_kv_heads=2, intermediate_size=512, max_position=1024, norm_eps=1e-5,
                                      hidden_act="silu", tie_embeddings=False)
    params = architectures.param_shapes(config, jnp.float32)
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    targets = jax.ShapeDtypeStruct((batch, 32), jnp.int32)
    fn = jax.jit(lambda p, i, m, t: causal_lm.logprobs_at(p, config, i, m, t))
    start = time.perf_counter()
    fn.lower(params, ids, ids, targets).compile()
    return time.perf_counter() - start


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="12,24,48")
    parser.add_argument("--label", default="", help="e.g. before / after, kept in the rows")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    compile_seconds(2)  # warm up the compiler itself
    rows = [{"benchmark": "lm_compile", "label": args.label, "layers": n, "compile_s": compile_seconds(n),
             "backend": jax.default_backend(),
             "command": "python benchmarks/bench_compile.py " + " ".join(argv or sys.argv[1:])}
            for n in (int(x) for x in args.layers.split(","))]
    common.print_table(rows, ["label", "layers", "compile_s"])
    if args.out:
        common.write_rows(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
