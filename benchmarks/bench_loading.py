"""Peak host memory of loading an LM split over the model axis: streamed slices against the whole checkpoint.

    python benchmarks/bench_loading.py [--hidden 1024 --layers 12 --shard-mb 100 --devices 8]

Writes a random Llama (float32 safetensors, in shards of --shard-mb) once, then loads it in two fresh
processes over --devices fake CPU devices with model_parallel = --devices: "whole" reads every tensor into
host memory (models/weights.load_causal_lm_dir) and then places it; "streamed" is what rj.load_lm does
(models/streamed.py: each device's slice read from the file). On CPU the devices' buffers are host memory
too, so the floor is one copy of the weights; the peak RSS of each process (ru_maxrss) is reported.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import os, resource, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=%(devices)d"
import jax
jax.config.update("jax_platforms", "cpu")
import numpy as np
import replug_jax as rj
from replug_jax.lm.local import LocalLM
from replug_jax.models import tokenizer, weights
path, how = sys.argv[1], sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
start = time.time()
if how == "whole":
    config, params = weights.load_causal_lm_dir(path)
    lm = LocalLM(config, params, tokenizer.from_hf_dir(path), dtype="float32", model_parallel=%(devices)d)
    del params
else:
    lm = rj.load_lm(path, dtype="float32", model_parallel=%(devices)d)
jax.block_until_ready(lm.params)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, base, time.time() - start)
"""


def write_model(path: str, hidden: int, layers: int, shard_mb: int) -> float:
    """A random Llama checkpoint in `path`; returns its size in MB."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests import hf_tiny

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, max_position_embeddings=512)
    LlamaForCausalLM(cfg).save_pretrained(path, max_shard_size=f"{shard_mb}MB")
    hf_tiny.save_tiny_tokenizer(path)
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors")) / 2**20


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--shard-mb", type=int, default=100)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as path:
        size = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
                               f"import bench_loading as b; print(b.write_model({path!r}, {args.hidden}, {args.layers}, "
                               f"{args.shard_mb}))"], check=True, capture_output=True, text=True).stdout.split()[-1]
        shards = len([f for f in os.listdir(path) if f.endswith(".safetensors")])
        for how in ("whole", "streamed"):
            out = subprocess.run([sys.executable, "-c", CHILD % {"devices": args.devices}, path, how], check=True,
                                 capture_output=True, text=True).stdout.split()
            peak, base, seconds = (float(x) for x in out[-3:])
            rows.append({"benchmark": "lm_loading", "impl": how, "checkpoint_mb": float(size), "shards": shards,
                         "devices": args.devices, "model_parallel": args.devices, "peak_rss_mb": peak,
                         "rss_before_mb": base, "seconds": seconds,
                         "command": "python benchmarks/bench_loading.py " + " ".join(argv or sys.argv[1:])})
    print(f"checkpoint {float(size):.0f} MB in {shards} shards, {args.devices} devices, model_parallel {args.devices}\n")
    print("| load | peak RSS (MB) | before loading (MB) | growth / checkpoint | seconds |\n|---|---:|---:|---:|---:|")
    for r in rows:
        growth = (r["peak_rss_mb"] - r["rss_before_mb"]) / r["checkpoint_mb"]
        print(f"| {r['impl']} | {r['peak_rss_mb']:.0f} | {r['rss_before_mb']:.0f} | {growth:.2f}x | {r['seconds']:.1f} |")
    if args.out:
        sys.path.insert(0, os.path.dirname(__file__))
        import common

        common.write_rows(rows, args.out)
    return rows


if __name__ == "__main__":
    main()
