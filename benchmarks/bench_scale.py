"""The cost curve of the datastore side, from 10k passages to the paper's 21M-36M: every stage at each size on this
machine (seconds and resident bytes), each stage's fitted exponent, and the projection to 21M and 36M passages.

    python benchmarks/bench_scale.py --passages 10000,100000,1000000 --workdir runs/bench_scale

The corpus is real text (gensim's Wikipedia articles) cut into ~100-word documents and shuffled into new ones, so
a size is reached without repeating a document. Stages, in order: read the JSONL, chunk into 128-token passages
(SmolLM2's tokenizer; beside it the tokenizer's own batch encoding of the same documents: the rate chunking can
reach), save and load the datastore, its fingerprint, embedding (MiniLM at 128 tokens, measured on a sample: its
rate times N), building Flat / SQ8 / IVF-PQ / HNSW indexes over N unit vectors (HNSW up to --hnsw-max rows,
projected above), exact search with source exclusion (512 queries, top 10), LSR batch building (16 queries x 20
passages tokenised for the step), an index refresh (embedding plus the Flat build: projected from the two), and a
retriever checkpoint (orbax; its size does not depend on N). The projection to a TPU VM host and a v4-32 slice
states its assumptions (printed). Rows go to benchmarks/results.jsonl with the command; the table to stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

# Projection assumptions (printed with the table): embedding FLOPs per 128-token passage are 2 x params x tokens;
# an accelerator chip embeds at MFU of its bf16 peak; CPU stages scale with a host's cores (FAISS, tokenizers).
CONTRIEVER_PARAMS = 110e6
V4_CHIP_BF16 = 275e12
EMBED_MFU = 0.30  # the target on accelerators (12% measured on an H100, 2026-11-24)
TPU_HOST_CORES = 120  # a v4 TPU VM host: 240 vCPUs
HOSTS = {"one TPU VM host (4 v4 chips)": (1, 4), "v4-32 slice (4 hosts, 16 chips)": (4, 16)}


def resident() -> int:
    """This process's resident bytes now (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(rows: list, size: int, stage: str, fn, note: str = ""):
    """Run `fn` once, record its seconds and the resident bytes it added; returns its value."""
    before, start = resident(), time.perf_counter()
    value = fn()
    rows.append({"stage": stage, "passages": size, "seconds": time.perf_counter() - start,
                 "resident_added": resident() - before, "note": note})
    print(f"  {stage:28s} {rows[-1]['seconds']:9.2f} s  {rows[-1]['resident_added'] / 2**20:9.1f} MiB  {note}",
          flush=True)
    return value


def write_corpus(path: str, passages: int, seed: int = 0) -> int:
    """A JSONL corpus of ~100-word documents (~1.5 passages of 128 SmolLM2 tokens each) from Wikipedia sentences,
    shuffled into new documents; returns the document count."""
    from replug_jax.data.wiki import load_wiki_articles

    sentences = [s for a in load_wiki_articles() for s in re.split(r"(?<=[.!?])\s+", a.text) if len(s) > 20]
    rng = random.Random(seed)
    documents = int(passages / 1.55)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(documents):
            words, text = 0, []
            while words < 100:
                s = sentences[rng.randrange(len(sentences))]
                text.append(s)
                words += s.count(" ") + 1
            f.write(json.dumps({"id": f"d{i}", "title": f"Document {i}", "text": " ".join(text)}) + "\n")
    return documents


def run_size(size: int, workdir: str, tokenizer, encoder, args) -> tuple[list, dict]:
    import faiss

    from replug_jax.retrieval import datastore as ds
    from replug_jax.retrieval.index import DenseIndex
    from replug_jax.jobs.prepare import read_documents

    rows: list[dict] = []
    folder = os.path.join(workdir, f"n{size}")
    os.makedirs(folder, exist_ok=True)
    corpus = os.path.join(folder, "corpus.jsonl")
    if not os.path.isfile(corpus):
        write_corpus(corpus, size)
    documents = measure(rows, size, "read", lambda: read_documents(corpus))
    texts = [d.text for d in documents]
    measure(rows, size, "tokenizer batch (baseline)", lambda: batch_encode(tokenizer, texts))
    store = measure(rows, size, "chunk", lambda: ds.chunk_documents(documents, tokenizer, chunk_tokens=128))
    n = len(store)
    path = os.path.join(folder, "datastore.jsonl")
    measure(rows, size, "save datastore", lambda: store.save(path))
    loaded = measure(rows, size, "load datastore", lambda: ds.Datastore.load(path))
    measure(rows, size, "fingerprint", loaded.fingerprint)
    del loaded, documents, texts
    sample = store.texts[: args.embed_sample]
    encoder.embed(sample[:32])  # compile
    start = time.perf_counter()
    encoder.embed(sample)
    embed_rate = len(sample) / (time.perf_counter() - start)
    rows.append({"stage": "embed (measured rate x N)", "passages": size, "seconds": n / embed_rate,
                 "resident_added": n * encoder.dim * 4, "note": f"{embed_rate:.0f} passages/s on {len(sample)}"})
    print(f"  {'embed (measured rate x N)':28s} {n / embed_rate:9.0f} s  ({embed_rate:.0f} passages/s)", flush=True)
    vectors = np.random.default_rng(0).standard_normal((n, encoder.dim), dtype=np.float32)
    faiss.normalize_L2(vectors)
    built = {}
    for factory in ("Flat", "SQ8", f"IVF{ivf_lists(n)},PQ48", "HNSW32"):
        if factory == "HNSW32" and n > args.hnsw_max:
            continue
        name = "IVF-PQ" if factory.startswith("IVF") else factory
        built[name] = measure(rows, size, f"index build {name}",
                              lambda f=factory: DenseIndex.build(vectors, metric="cosine", factory=f,
                                                                 train_size=min(n, 100_000)), note=factory)
    queries = vectors[np.random.default_rng(1).choice(n, 512, replace=False)]
    exclude = [store.rows_of_sources([store.sources[r]]) for r in np.random.default_rng(1).choice(n, 512, replace=False)]
    store.rows_of_sources([])  # the source map, built once (as a job's first search builds it)
    measure(rows, size, "search Flat, exclusion", lambda: built["Flat"].search(queries, 10, exclude=exclude),
            note="512 queries, top 10")
    measure(rows, size, "search SQ8, exclusion", lambda: built["SQ8"].search(queries, 10, exclude=exclude))
    measure(rows, size, "lsr batch (16 x 20)", lambda: lsr_batch(encoder, store, n))
    for name, index in built.items():
        index.save(os.path.join(folder, f"index_{name}"))
        rows.append({"stage": f"index bytes {name}", "passages": size, "seconds": 0.0,
                     "resident_added": os.path.getsize(os.path.join(folder, f"index_{name}", "index.faiss")),
                     "note": "on disk"})
    flat_build = next(r["seconds"] for r in rows if r["stage"] == "index build Flat")
    rows.append({"stage": "refresh (embed + Flat)", "passages": size, "seconds": n / embed_rate + flat_build,
                 "resident_added": 0, "note": "projected from the two"})
    shutil.rmtree(os.path.join(folder, "checkpoints"), ignore_errors=True)
    measure(rows, size, "checkpoint (retriever)", lambda: checkpoint(encoder, os.path.join(folder, "checkpoints")))
    shutil.rmtree(folder, ignore_errors=True) if args.clean else None
    return rows, {"embed_rate": embed_rate}


def batch_encode(tokenizer, texts: list[str], batch: int = 8192) -> None:
    """The tokenizer's own batch encoding with offsets of every text, `batch` at a time (what chunking could reach;
    the offsets of a million documents at once would not fit in memory)."""
    for start in range(0, len(texts), batch):
        tokenizer.offsets_batch(texts[start : start + batch])


def ivf_lists(n: int) -> int:
    """IVF lists: about 4 sqrt(N), a power of two (FAISS's guideline), at least 16."""
    return max(16, 2 ** int(round(np.log2(4 * np.sqrt(n)))))


def lsr_batch(encoder, store, n: int) -> dict:
    from replug_jax.train.batch import make_batch
    from replug_jax.train.queries import TrainExample

    rng = np.random.default_rng(2)
    examples = [TrainExample(store.texts[int(r)][:200], " x", excluded_sources=(store.sources[int(r)],))
                for r in rng.choice(n, 16)]
    rows = rng.choice(n, (16, 20)).astype(np.int64)
    return make_batch(encoder, store, examples, rows, np.zeros((16, 20), np.float32), query_max_tokens=128,
                      doc_max_tokens=128)


def checkpoint(encoder, directory: str) -> None:
    from replug_jax.train.checkpoint import Checkpointer

    saver = Checkpointer(directory, max_to_keep=1)
    saver.save(1, {"params": encoder.params}, {"step": 1})
    saver.close() if hasattr(saver, "close") else None


def fit(rows: list) -> dict:
    """Per stage: the exponent b of seconds ~ a N^b and a, through its two largest sizes measured (the smallest
    carry fixed costs: a compile, an index's training on a capped sample)."""
    out = {}
    for stage in dict.fromkeys(r["stage"] for r in rows):
        points = sorted((r["passages"], r["seconds"]) for r in rows if r["stage"] == stage and r["seconds"] > 0)[-2:]
        if len(points) >= 2:
            x, y = np.log([p[0] for p in points]), np.log([p[1] for p in points])
            b, log_a = np.polyfit(x, y, 1)
            out[stage] = (float(np.exp(log_a)), float(b))
    return out


def project(fits: dict, embed_rate_cpu: float, target: int) -> list[dict]:
    """Seconds at `target` passages: on this machine (each fit), and on a TPU VM host and a v4-32 slice (CPU stages
    over the host's cores, linear in N; embedding at EMBED_MFU of the chips)."""
    cores = os.cpu_count() or 1
    per_passage = 2 * CONTRIEVER_PARAMS * 128
    out = []
    for stage, (a, b) in fits.items():
        here = a * target ** b
        if stage.startswith(("embed", "refresh")):  # the measured rate is per passage: linear in N
            here = target / embed_rate_cpu
        row = {"stage": stage, "passages": target, "exponent": b, "this_machine_s": here}
        for name, (hosts, chips) in HOSTS.items():
            if stage.startswith(("embed", "refresh")):
                seconds = target * per_passage / (chips * V4_CHIP_BF16 * EMBED_MFU)
            else:  # CPU stages: a linear extrapolation spread over every host's cores
                seconds = here / (TPU_HOST_CORES * hosts / cores)
            row[name] = seconds
        out.append(row)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--passages", default="10000,100000,1000000")
    p.add_argument("--workdir", default="runs/bench_scale")
    p.add_argument("--embed-sample", type=int, default=512)
    p.add_argument("--hnsw-max", type=int, default=200_000, help="HNSW is built up to this many rows")
    p.add_argument("--clean", action="store_true", help="remove each size's files when done")
    p.add_argument("--out", default="benchmarks/results.jsonl")
    p.add_argument("--from-results", metavar="JSONL", help="print the tables again from the last run's rows in this "
                   "file (no measurement)")
    args = p.parse_args(argv)
    if args.from_results:
        saved = [json.loads(line) for line in open(args.from_results, encoding="utf-8")]
        last = [r for r in saved if r.get("benchmark") == "scale" and r["command"] == next(
            r["command"] for r in reversed(saved) if r.get("benchmark") == "scale")]
        rate = float(re.match(r"(\d+)", [r for r in last if r["stage"].startswith("embed")][-1]["note"]).group(1))
        return report(last, rate, last[0]["cpu"], last[0]["command"], None)

    import replug_jax as rj

    tokenizer, encoder = rj.load_tokenizer("smollm2"), rj.load_encoder("minilm")
    command = "python benchmarks/bench_scale.py " + " ".join(sys.argv[1:] if argv is None else argv)
    cpu = common.cpu_model()
    rows, rates = [], []
    for size in (int(x) for x in args.passages.split(",")):
        print(f"{size:,} passages ({cpu})", flush=True)
        measured, info = run_size(size, args.workdir, tokenizer, encoder, args)
        rows += measured
        rates.append(info["embed_rate"])
    report(rows, rates[-1], cpu, command, args.out)
    return rows


def report(rows: list, embed_rate: float, cpu: str, command: str, out: str | None) -> None:
    """The table of seconds per stage and size, the fitted exponents and the projections; rows appended to `out`."""
    fits = fit(rows)
    sizes = sorted({r["passages"] for r in rows})
    print(f"\nSeconds per stage ({cpu}; resident MiB added in brackets):\n")
    print("| stage | " + " | ".join(f"{s:,}" for s in sizes) + " | exponent |")
    print("|---|" + "---:|" * (len(sizes) + 1))
    for stage in dict.fromkeys(r["stage"] for r in rows):
        cells = []
        for s in sizes:
            r = next((r for r in rows if r["stage"] == stage and r["passages"] == s), None)
            cells.append("" if r is None else f"{r['seconds']:.2f} ({r['resident_added'] / 2**20:.0f})")
        exponent = f"{fits[stage][1]:.2f}" if stage in fits else ""
        print(f"| {stage} | " + " | ".join(cells) + f" | {exponent} |")
    projections = [row for target in (21_000_000, 36_000_000) for row in project(fits, embed_rate, target)]
    print(f"\nProjected hours (this machine: each stage's fit, embedding at {embed_rate:.0f} passages/s; TPU: "
          f"embedding at {EMBED_MFU:.0%} MFU of v4 chips, a {CONTRIEVER_PARAMS / 1e6:.0f}M-parameter encoder at 128 "
          f"tokens; CPU stages spread over {TPU_HOST_CORES} cores per host):\n")
    names = ["this_machine_s", *HOSTS]
    print("| stage | passages | " + " | ".join(n.replace("_s", "") for n in names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for row in projections:
        print(f"| {row['stage']} | {row['passages'] / 1e6:.0f}M | "
              + " | ".join(f"{row[n] / 3600:.2f}" for n in names) + " |")
    if out:
        common.write_rows([{"benchmark": "scale", **r, "cpu": cpu, "command": command} for r in rows]
                          + [{"benchmark": "scale_projection", **r, "cpu": cpu, "command": command}
                             for r in projections], out)


if __name__ == "__main__":
    main()
