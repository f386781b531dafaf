"""Corpus embedding throughput: our jitted DenseEncoder against PyTorch transformers, in one run.

    python benchmarks/bench_embedding.py --docs 256 --batch-size 32
    python benchmarks/bench_embedding.py --questions 16          # one question against 16 at once, compiled
    python benchmarks/bench_embedding.py --bits                  # what a row's bits depend on (row count, length)
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/bench_embedding.py --bits

Documents are 128-token passages of the demo's Wikipedia articles (as the datastore holds).
Reports documents/s, achieved GFLOP/s and the fp32 matmul peak measured in the same run. `--questions N`: the time
to embed one question and N questions in one call (NQ-open's first N, every program compiled first), and the same
with `tokens_per_call` high enough to pad every call to the batch size (the encoder before issue 62).
"""
from __future__ import annotations

import argparse
import os
import sys
from unittest.mock import patch

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def passages(count: int, tokens: int = 128) -> list[str]:
    import replug_jax as rj
    from replug_jax.data.wiki import load_wiki_articles
    from replug_jax.retrieval.datastore import chunk_documents

    tok = rj.load_tokenizer("smollm2")
    return chunk_documents(load_wiki_articles()[:20], tok, chunk_tokens=tokens).texts[:count]


def torch_embedder(threads: int, batch_size: int, max_length: int):
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    from replug_jax.models import registry

    torch.set_num_threads(threads)
    path = registry.packaged_path("minilm")
    model, tok = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)

    def embed(texts, by_length=False):
        """Batches in the given order, or (`by_length`) of texts sorted by token count as sentence-transformers'
        `encode` does (less padding); padded to the longest text of each batch either way."""
        with torch.inference_mode():
            if by_length:
                lengths = [len(ids) for ids in tok(texts, truncation=True, max_length=max_length)["input_ids"]]
                texts = [texts[i] for i in np.argsort(lengths, kind="stable")]
            for s in range(0, len(texts), batch_size):
                b = tok(texts[s : s + batch_size], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
                h = model(**b).last_hidden_state
                m = b["attention_mask"][..., None].float()
                torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)

    return embed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--questions", type=int, default=0)
    p.add_argument("--bits", action="store_true")
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args()
    if args.questions:
        return questions(args)
    if args.bits:
        return bits(args)

    import jax
    import numpy as np
    import replug_jax as rj

    from replug_jax.parallel import xla_cpu

    enc = rj.load_encoder("minilm", batch_size=args.batch_size)
    # the same encoder compiled with the other choice (xla_cpu.ENCODER is XLA's defaults, {}, since issue 72)
    other = "xla_defaults" if xla_cpu.ENCODER else "without_ynnpack"
    with patch.multiple(xla_cpu, ENCODER={} if xla_cpu.ENCODER else xla_cpu.NO_YNNPACK):
        enc_other = rj.load_encoder("minilm", batch_size=args.batch_size)
    texts = passages(args.docs)
    rows = enc.tokenize(texts)
    tokens = sum(len(r) for r in rows)
    c = enc.config
    non_embed = c.num_layers * (4 * c.hidden_size**2 + 2 * c.hidden_size * c.intermediate_size)
    mean_len = tokens / len(rows)
    flops = tokens * (2 * non_embed + 2 * c.num_layers * mean_len * c.hidden_size * 2)
    peak = common.matmul_peak_gflops()
    command = "python " + " ".join(sys.argv)
    rows_out = []

    def record(name, seconds):
        rows_out.append({"benchmark": "corpus_embedding", "impl": name, "docs_per_s": len(texts) / seconds,
                         "gflops": flops / seconds / 1e9, "peak_gflops": peak, "docs": len(texts),
                         "mean_tokens": float(np.mean([len(r) for r in rows])), "device": jax.devices()[0].platform,
                         "command": command})

    enc.embed(texts)  # compile every bucket
    enc_other.embed(texts)
    torch_embed = torch_embedder(args.threads, args.batch_size, enc.max_length)
    torch_embed(texts[: args.batch_size])
    times = common.interleaved_best({f"jax_bs{args.batch_size}": lambda: enc.embed(texts),
                                     f"jax_bs{args.batch_size}_{other}": lambda: enc_other.embed(texts),
                                     f"torch_bs{args.batch_size}": lambda: torch_embed(texts),
                                     f"torch_bs{args.batch_size}_by_length": lambda: torch_embed(texts, by_length=True)},
                                    args.rounds)
    for name, seconds in times.items():
        record(name, seconds)
    best_torch = max(r["docs_per_s"] for r in rows_out if r["impl"].startswith("torch"))
    for r in rows_out:
        r["vs_best_torch"] = r["docs_per_s"] / best_torch
    common.print_table(rows_out, ["impl", "docs_per_s", "gflops", "peak_gflops", "vs_best_torch"])
    common.write_rows(rows_out, args.out)


def questions(args):
    """One question against `args.questions` questions embedded in one call, each timed compiled (best of rounds)."""
    import jax
    import replug_jax as rj

    from replug_jax.data.question_sets import load_nq_open

    texts = [e.question for e in load_nq_open()[: args.questions]]
    command = "python " + " ".join(sys.argv)
    rows_out = []
    for label, tokens_per_call in (("rows_per_call", None), ("batch_size_rows", 10**9)):
        enc = rj.load_encoder("minilm", batch_size=args.batch_size)
        enc.tokens_per_call = tokens_per_call or enc.tokens_per_call
        one, many = (lambda: enc.embed(texts[:1])), (lambda: enc.embed(texts))
        one(), many()  # compile
        times = common.interleaved_best({"one": one, "many": many}, max(args.rounds, 5))
        rows_out.append({"benchmark": "question_embedding", "impl": label, "questions": len(texts),
                         "one_ms": times["one"] * 1e3, "many_ms": times["many"] * 1e3,
                         "many_vs_one": times["many"] / times["one"], "device": jax.devices()[0].platform,
                         "cpu": common.cpu_model(), "command": command})
    base = rows_out[1]["one_ms"]
    for r in rows_out:
        r["many_vs_one_before"] = r["many_ms"] / base
    common.print_table(rows_out, ["impl", "questions", "one_ms", "many_ms", "many_vs_one", "many_vs_one_before"])
    common.write_rows(rows_out, args.out)


def bits(args):
    """Random token rows padded to 8 lengths and run in 13 row counts by the encoder's compiled forward (one CPU
    device of the mesh): which (length, rows) cells change a row's bits against 32 rows, and which other padded
    lengths change them."""
    import jax
    import numpy as np
    import replug_jax as rj

    from replug_jax.parallel import sharding

    enc = rj.load_encoder("minilm", batch_size=64, mesh=sharding.data_mesh(jax.devices()[:1]))
    fn, pad, rng = enc._batch_fn, enc.config.pad_token_id, np.random.default_rng(0)

    def run(batch, length):
        ids, mask = sharding.pad_rows(batch, length, pad, len(batch))
        return np.asarray(fn.jitted(fn.params, *jax.device_put((ids, mask), fn._batch)))

    rows_differ, lengths_differ = [], []
    for length in (8, 16, 24, 32, 40, 64, 96, 128):
        rows = [[101, *rng.integers(1000, 20000, rng.integers(max(1, length - 9), length - 1)), 102] for _ in range(40)]
        base = run(rows[:32], length)
        rows_differ += [(length, n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 33, 40)
                        if not np.array_equal(run(rows[:n], length)[: min(n, 32)], base[: min(n, 32)])]
        lengths_differ += [(length, other) for other in (length + 8, length + 16, 2 * length, 256)
                           if not np.array_equal(run(rows[:32], other), base)]
    out = {"benchmark": "embedding_bits", "devices_in_process": len(jax.devices()), "rows_differ": rows_differ,
           "lengths_differ": lengths_differ, "cpu": common.cpu_model(), "command": "python " + " ".join(sys.argv)}
    print(f"{len(jax.devices())} CPU device(s) in the process; (length, rows) changing a row's bits against 32 rows: "
          f"{rows_differ or 'none'}; (length, padded to) changing them: {lengths_differ or 'none'}")
    common.write_rows([out], args.out)


if __name__ == "__main__":
    main()
