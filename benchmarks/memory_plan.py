"""Memory plan: per-device bytes of the paper-scale LMs' weights and generation cache on TPU VM meshes, in bf16.

    python benchmarks/memory_plan.py [--out benchmarks/memory_plan.json]

From `jax.eval_shape` (nothing allocated; runs on a laptop CPU). For each model and TPU VM, the smallest
model-axis size M (1, 2, 4, ... up to the chips) whose weights plus the KV cache of a REPLUG generation
batch (ROWS rows of SLOTS slots per data shard: e.g. 16 = top-10 passes of one question plus room) fit in
HEADROOM of a chip's HBM, the rest of the memory being left for activations and XLA's buffers.
"""
from __future__ import annotations

import argparse
import json
import sys

from replug_jax.models import memory
from replug_jax.models.causal_lm import CausalLMConfig

ROWS, SLOTS, HEADROOM = 16, 2048, 0.85
GIB = 2 ** 30

# Hugging Face config.json values of each model (the fields CausalLMConfig.from_hf reads)
MODELS = {
    "Llama-2-7B": dict(model_type="llama", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, intermediate_size=11008),
    "Llama-2-13B": dict(model_type="llama", vocab_size=32000, hidden_size=5120, num_hidden_layers=40,
                        num_attention_heads=40, num_key_value_heads=40, intermediate_size=13824),
    "Llama-2-70B": dict(model_type="llama", vocab_size=32000, hidden_size=8192, num_hidden_layers=80,
                        num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672),
    "Qwen2.5-7B": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944),
    "Qwen2.5-14B": dict(model_type="qwen2", vocab_size=152064, hidden_size=5120, num_hidden_layers=48,
                        num_attention_heads=40, num_key_value_heads=8, intermediate_size=13824),
    "Mistral-7B": dict(model_type="mistral", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, sliding_window=4096),
}
# JAX devices (chips) and HBM per chip of single-host TPU VMs
TPUS = {"v4-8": (4, 32), "v5e-8": (8, 16), "v5p-8": (4, 95)}


def plan_row(name: str, tpu: str) -> dict:
    config = CausalLMConfig.from_hf(MODELS[name])
    chips, hbm_gib = TPUS[tpu]
    row = {"model": name, "tpu": tpu, "chips": chips, "hbm_gib": hbm_gib, "rows_per_data_shard": ROWS, "slots": SLOTS,
           "model_parallel": None}
    m = 1
    while m <= chips:
        mesh = memory.abstract_mesh(chips // m, m)
        weights = memory.weight_bytes_per_device(config, mesh)
        cache = memory.kv_cache_bytes_per_device(config, mesh, ROWS, SLOTS)
        row.update(weights_gib=weights / GIB, kv_cache_gib=cache / GIB, total_gib=(weights + cache) / GIB,
                   model_parallel=m)
        if weights + cache <= HEADROOM * hbm_gib * GIB:
            row["fits"] = True
            return row
        m *= 2
    row["fits"] = False  # even split over every chip (the numbers are for that split)
    return row


def table(rows: list[dict], params: dict[str, float]) -> str:
    lines = ["| model | params (B) | bf16 weights (GiB) | " + " | ".join(TPUS) + " |",
             "|---|---:|---:|" + "---|" * len(TPUS)]
    for name in MODELS:
        cells = []
        for tpu in TPUS:
            r = next(r for r in rows if r["model"] == name and r["tpu"] == tpu)
            if r["fits"]:
                cells.append(f"M={r['model_parallel']}: {r['weights_gib']:.1f} + {r['kv_cache_gib']:.1f} GiB")
            else:
                cells.append(f"**does not fit** (M={r['model_parallel']}: {r['total_gib']:.1f} GiB)")
        lines.append(f"| {name} | {params[name]:.2f} | {params[name] * 2e9 / GIB:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = [plan_row(name, tpu) for name in MODELS for tpu in TPUS]
    params = {name: memory.parameter_count(CausalLMConfig.from_hf(MODELS[name])) / 1e9 for name in MODELS}
    print(f"Per device: bf16 weights + KV cache ({ROWS} rows x {SLOTS} slots per data shard), the smallest model "
          f"axis M fitting {HEADROOM:.0%} of HBM\n")
    print(table(rows, params))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python benchmarks/memory_plan.py " + " ".join(argv or sys.argv[1:]),
                       "params_billion": params, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
