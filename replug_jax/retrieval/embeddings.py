"""Corpus embeddings on disk: resumable, reusable, never all in memory.

    E = embed_corpus(encoder, datastore.texts, "work/emb.npy", dtype="float16")  # np.memmap [N, D]

Blocks of `block_size` texts go through `encoder.embed` and are written into an .npy
memmap. A JSON sidecar (`<path>.json`) records the rows done, the encoder fingerprint,
a hash of the texts, the dtype, N and D; it is rewritten (atomically) only after a block
is flushed to disk, so an interrupted run resumes from the last completed block and a
finished run with the same encoder and texts is returned without recomputation.

With several processes, `embed_corpus_split` has each one embed its contiguous share into a shard
file of its own (`<path>.part-<i>-of-<n>.npy`, resumable per shard); process 0 then copies the shards
into `path`. The work folder must be one file system for all processes (a TPU VM pod: a shared disk).
"""
from __future__ import annotations

import inspect
import json
import os
from typing import Sequence

import numpy as np

from replug_jax.parallel import distributed
from replug_jax.base.atomic_files import atomic_open
from replug_jax.retrieval.datastore import hash_strings

DTYPES = ("float32", "float16")


def sidecar_path(path: str) -> str:
    return path + ".json"


def embed_corpus(encoder, texts: Sequence[str], path: str, dtype: str = "float32", block_size: int = 4096,
                 progress: bool = True) -> np.memmap:
    """Embeddings [N, D] of `texts` in the .npy file `path`, returned read-only memory-mapped.

    `encoder` needs `embed(list[str]) -> [n, D]`, `fingerprint()` and `dim` (a DenseEncoder).
    """
    from replug_jax.base.progress import tqdm

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    want = _wanted(encoder, texts, dtype)
    n, d = want["count"], want["dim"]
    done = _rows_done(path, want)
    if done == n:
        return np.load(path, mmap_mode="r")
    if done == 0:
        out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(n, d))  # [N, D] on disk
        _write_sidecar(path, want, 0)
    else:
        out = np.load(path, mmap_mode="r+")
    with tqdm(total=n, initial=done, disable=not progress, desc="embed corpus", unit="rows") as bar:
        for start in range(done, n, block_size):
            stop = min(start + block_size, n)
            before = bar.n
            # an encoder that reports its batches (DenseEncoder) moves the bar every batch, not once a block
            reports = "progress" in inspect.signature(encoder.embed).parameters
            block = np.asarray(encoder.embed(list(texts[start:stop]), **({"progress": bar.update} if reports else {})))
            if block.shape != (stop - start, d):
                raise ValueError(f"encoder returned shape {block.shape} for {stop - start} texts of dimension {d}")
            out[start:stop] = block.astype(dtype)  # [b, D]
            bar.update(stop - start - (bar.n - before))
            out.flush()  # the data reaches the file before the sidecar says it did
            _write_sidecar(path, want, stop)
    del out
    return np.load(path, mmap_mode="r")


def shard_path(path: str, index: int, count: int) -> str:
    return f"{path[:-4] if path.endswith('.npy') else path}.part-{index}-of-{count}.npy"


def embed_corpus_split(encoder, texts: Sequence[str], path: str, dtype: str = "float32", block_size: int = 4096,
                       progress: bool = True) -> np.memmap:
    """`embed_corpus`, the rows split over the job's processes (each embeds only its share); every process
    gets the whole [N, D] file. With one process it is `embed_corpus`."""
    count = distributed.process_count()
    if count == 1:
        return embed_corpus(encoder, texts, path, dtype=dtype, block_size=block_size, progress=progress)
    want = _wanted(encoder, texts, dtype)
    n = want["count"]
    if distributed.lead_value(_rows_done(path, want)) != n:
        index = distributed.process_index()
        rows = distributed.share(n, index, count)
        distributed.all_succeed(f"embedding {path}", lambda: embed_corpus(  # a failed share stops every process
            encoder, texts[rows.start : rows.stop], shard_path(path, index, count), dtype=dtype,
            block_size=block_size, progress=progress))
        distributed.all_succeed(f"merging {path}",
                                lambda: _merge_shards(path, want, count, block_size) if distributed.is_lead() else None)
    return np.load(path, mmap_mode="r")


def _merge_shards(path: str, want: dict, count: int, block_size: int) -> None:
    """Copy the `count` shard files into `path` ([N, D], rows in order), then remove the shards."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=want["dtype"], shape=(want["count"], want["dim"]))
    _write_sidecar(path, want, 0)
    for index in range(count):
        rows = distributed.share(want["count"], index, count)
        part = np.load(shard_path(path, index, count), mmap_mode="r")
        if part.shape != (len(rows), want["dim"]):
            raise ValueError(f"shard {index} of {path} holds {part.shape}, expected {(len(rows), want['dim'])}")
        for start in range(0, len(rows), block_size):
            out[rows.start + start : rows.start + min(start + block_size, len(rows))] = part[start : start + block_size]
    out.flush()
    _write_sidecar(path, want, want["count"])
    del out
    for index in range(count):
        for f in (shard_path(path, index, count), sidecar_path(shard_path(path, index, count))):
            os.remove(f)


def _wanted(encoder, texts: Sequence[str], dtype: str) -> dict:
    """What a finished embeddings file of `texts` records: encoder, texts hash, dtype, count, dim."""
    if len(texts) == 0:
        raise ValueError("empty corpus: no texts to embed")
    return {"encoder": encoder.fingerprint(), "texts": hash_strings(texts), "dtype": dtype, "count": len(texts),
            "dim": int(encoder.dim)}


def _rows_done(path: str, want: dict) -> int:
    """Rows already embedded for the same encoder/texts/dtype/shape; 0 means start from scratch."""
    try:
        with open(sidecar_path(path), encoding="utf-8") as f:
            state = json.load(f)
        header = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return 0
    if any(state.get(key) != value for key, value in want.items()):
        return 0
    if header.shape != (want["count"], want["dim"]) or header.dtype != np.dtype(want["dtype"]):
        return 0
    rows = state.get("rows_done")
    return rows if isinstance(rows, int) and 0 <= rows <= want["count"] else 0


def _write_sidecar(path: str, want: dict, rows_done: int) -> None:
    with atomic_open(sidecar_path(path)) as f:
        json.dump({**want, "rows_done": rows_done}, f, indent=1)
