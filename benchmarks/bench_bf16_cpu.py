"""bf16 on a CPU (opt-in: `dtype: bfloat16`) against float32, and both against PyTorch, on the same texts, in one run.

    python benchmarks/bench_bf16_cpu.py --docs 256 --articles 40 --questions 100 --passes 16 --rounds 3

Embedding (MiniLM): documents/s on `--docs` datastore passages (128 SmolLM2 tokens, as the demo cuts them); the
cosine of each bf16 embedding to its float32 one; and over a datastore of every passage of the first `--articles`
Wikipedia articles, how many of each NQ-open question's top 10 (exact inner product, corpus and questions both
embedded in the dtype) are float32's top 10.
Scoring (SmolLM2): tokens/s on bench_scoring.py's REPLUG passes, LocalLM at batch 4 against PyTorch one pass at a
time with the LM head at the continuation; each dtype's largest and mean |log p - float32's log p| over the
continuations' tokens and their perplexity.
Every figure has PyTorch's counterpart in the same dtype (bf16 through oneDNN, AMX where the CPU has it); with
`--skip-torch` (an install without PyTorch: `make install`'s) the jax rows alone, against jax's float32.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from bench_embedding import passages  # noqa: E402
from bench_scoring import workload  # noqa: E402

DTYPES = ("float32", "bfloat16")


def torch_embedder(dtype: str, threads: int, batch_size: int = 32):
    """PyTorch MiniLM in `dtype`: texts -> unit mean-pooled embeddings [N, D] float32, batches sorted by length."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from replug_jax.models import registry

    torch.set_num_threads(threads)
    path = registry.packaged_path("minilm")
    model = AutoModel.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    tok = AutoTokenizer.from_pretrained(path)

    def embed(texts):
        order = np.argsort([len(ids) for ids in tok(texts, truncation=True, max_length=512)["input_ids"]], kind="stable")
        out = np.zeros((len(texts), model.config.hidden_size), np.float32)
        with torch.inference_mode():
            for s in range(0, len(texts), batch_size):
                rows = order[s : s + batch_size]
                b = tok([texts[i] for i in rows], padding=True, truncation=True, max_length=512, return_tensors="pt")
                h = model(**b).last_hidden_state.float()
                m = b["attention_mask"][..., None].float()
                out[rows] = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
        return out

    return embed


def torch_scorer(dtype: str, threads: int, lm_name: str):
    """PyTorch's log-probs of each continuation, one pass at a time, the LM head at the continuation only."""
    import torch
    from transformers import AutoModelForCausalLM

    from replug_jax.models import registry

    torch.set_num_threads(threads)
    folder, name = os.path.split(registry.resolve(lm_name).path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype)).eval()

    def score(pairs):
        out = []
        with torch.inference_mode():
            for ctx, cont in pairs:
                logits = model(torch.tensor([ctx + cont]), logits_to_keep=len(cont) + 1).logits[0, :-1].float()
                out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(cont)[:, None])[:, 0].numpy())
        return out

    return score


def reference(seconds: dict) -> str:
    """The row the speeds are relative to: PyTorch's float32 where it ran, else jax's."""
    return "torch_float32" if "torch_float32" in seconds else "jax_float32"


def top10_agreement(corpus: dict, queries: dict, reference: str) -> dict:
    """{dtype: mean share of each query's top 10 that is also in `reference`'s top 10}."""
    top = {name: np.argsort(-(queries[name] @ corpus[name].T), axis=1, kind="stable")[:, :10] for name in corpus}
    return {name: float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(top[name], top[reference])]))
            for name in corpus}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=256, help="passages timed")
    p.add_argument("--articles", type=int, default=40, help="articles whose passages make the retrieval datastore")
    p.add_argument("--questions", type=int, default=100)
    p.add_argument("--passes", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lm", default="smollm2")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--parts", default="embedding,scoring", help="which of the two to run")
    p.add_argument("--skip-torch", action="store_true", help="jax rows alone (an install without PyTorch)")
    p.add_argument("--out", default="benchmarks/results.jsonl")
    args = p.parse_args()

    import jax

    command = "python " + " ".join(sys.argv)
    base = {"cpu": common.cpu_model(), "command": command, "device": jax.devices()[0].platform}

    if "embedding" in args.parts:
        embedding(args, base)
    if "scoring" in args.parts:
        scoring(args, base)


def embedding(args, base: dict) -> None:
    """Speed on --docs passages; cosine to float32 and top-10 agreement over the datastore."""
    import replug_jax as rj
    from replug_jax.data.question_sets import load_nq_open
    from replug_jax.data.wiki import load_wiki_articles
    from replug_jax.retrieval.datastore import chunk_documents

    store = chunk_documents(load_wiki_articles()[: args.articles], rj.load_tokenizer("smollm2"), chunk_tokens=128).texts
    questions = [e.question for e in load_nq_open()[: args.questions]]
    timed = passages(args.docs)
    embedders = {f"jax_{d}": rj.load_encoder("minilm", dtype=d).embed for d in DTYPES}
    if not args.skip_torch:
        embedders.update({f"torch_{d}": torch_embedder(d, args.threads) for d in DTYPES})
    corpus = {name: np.asarray(embed(store), np.float32) for name, embed in embedders.items()}  # compiles too
    queries = {name: np.asarray(embed(questions), np.float32) for name, embed in embedders.items()}
    for embed in embedders.values():
        embed(timed)
    seconds = common.interleaved_best({name: (lambda e=embed: e(timed)) for name, embed in embedders.items()},
                                      args.rounds)
    agreement = {}
    for side in sorted({name.split("_")[0] for name in embedders}):  # jax, torch: each against its own float32
        agreement.update(top10_agreement({k: v for k, v in corpus.items() if k.startswith(side)},
                                         {k: v for k, v in queries.items() if k.startswith(side)}, f"{side}_float32"))
    reference_name = reference(seconds)
    rows = []
    for name in embedders:
        float32_rows = corpus[name.replace("bfloat16", "float32")]
        cosine = np.sum(corpus[name] * float32_rows, axis=1)
        rows.append({"benchmark": "bf16_cpu_embedding", "impl": name, "docs_per_s": len(timed) / seconds[name],
                     f"vs_{reference_name}": seconds[reference_name] / seconds[name],
                     "min_cosine_to_float32": float(cosine.min()), "mean_cosine_to_float32": float(cosine.mean()),
                     "top10_agreement": agreement[name], "datastore": len(store), "questions": len(questions), **base})
    common.print_table(rows, ["impl", "docs_per_s", f"vs_{reference_name}", "min_cosine_to_float32",
                              "top10_agreement"])
    common.write_rows(rows, args.out)



def scoring(args, base: dict) -> None:
    """Speed, log-prob differences and perplexity on REPLUG's passes."""
    import replug_jax as rj

    lms = {f"jax_{d}": rj.load_lm(args.lm, batch_size=4, dtype=d) for d in DTYPES}
    pairs = workload(lms["jax_float32"].tokenizer, args.passes, 128, 192, 128)
    tokens = sum(len(c) + len(y) for c, y in pairs)
    scorers = {name: lm.score_token_pairs for name, lm in lms.items()}
    if not args.skip_torch:
        scorers.update({f"torch_{d}": torch_scorer(d, args.threads, args.lm) for d in DTYPES})
    logps = {name: np.concatenate(score(pairs)) for name, score in scorers.items()}  # compiles too
    seconds = common.interleaved_best({name: (lambda s=score: s(pairs)) for name, score in scorers.items()},
                                      max(1, args.rounds - 1))
    rows, reference_name = [], reference(seconds)
    for name in scorers:
        delta = np.abs(logps[name] - logps[name.replace("bfloat16", "float32")])
        rows.append({"benchmark": "bf16_cpu_scoring", "impl": name, "tokens_per_s": tokens / seconds[name],
                     f"vs_{reference_name}": seconds[reference_name] / seconds[name],
                     "max_abs_dlogp": float(delta.max()), "mean_abs_dlogp": float(delta.mean()),
                     "perplexity": float(np.exp(-logps[name].mean())), "passes": len(pairs), "lm": args.lm, **base})
    common.print_table(rows, ["impl", "tokens_per_s", f"vs_{reference_name}", "max_abs_dlogp", "mean_abs_dlogp",
                              "perplexity"])
    common.write_rows(rows, args.out)


if __name__ == "__main__":
    main()
