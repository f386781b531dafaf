"""A corpus chunked into its datastore file by every process of the job, each one a share.

    store = chunked_datastore(lambda: read_documents(corpus), tokenizer, 128, "WORKDIR/datastore.jsonl", stamp)

Each process cuts a contiguous share of the documents (`distributed.share`) as `chunk_documents` does into its own
part file; process 0 joins the parts in order into the datastore file, and every process loads it. Nobody chunks
the whole corpus, and the file is the one-process file byte for byte (chunk ids depend on the document alone).
With one process: chunk and save. Like `embed_corpus_split`, the processes share the workdir's file system.
A file whose stamp (PATH.source.json, written last) records the same `stamp` (corpus, tokenizer, passage length) is
reused, process 0 deciding for all.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Callable, Sequence

from replug_jax.base import console
from replug_jax.models.tokenizer import TextTokenizer
from replug_jax.parallel import distributed
from replug_jax.base.atomic_files import TEMPORARY_MARK, atomic_open
from replug_jax.retrieval.datastore import Datastore, Document, chunk_documents, chunk_rows, save_rows


def part_path(path: str, index: int, count: int) -> str:
    """Process `index`'s part file: a temporary name (joined, then removed), so it carries the project's mark."""
    return f"{path}.part-{index}-of-{count}{TEMPORARY_MARK}"


def chunked_datastore(read: Callable[[], Sequence[Document]], tokenizer: TextTokenizer, chunk_tokens: int,
                      path: str, stamp: dict, drop_empty: bool = False) -> Datastore:
    """`chunk_documents(read(), tokenizer, chunk_tokens, drop_empty=drop_empty)` saved to `path` (atomically), chunked
    in shares by the job's processes (a collective call with several), or `path` itself where its stamp records
    `stamp`. `read()`: the documents (every process reads them all); a document without text refused or left out
    (`datastore.with_text`)."""
    if distributed.lead_value(_stamped(path, stamp)):  # one decision for every process
        return Datastore.load(path)
    count, index = distributed.process_count(), distributed.process_index()
    if count == 1:
        store = chunk_documents(read(), tokenizer, chunk_tokens, drop_empty=drop_empty)
        store.save(path)
    else:
        def chunk_share() -> None:
            documents = read()
            rows = distributed.share(len(documents), index, count)
            part = list(chunk_rows(documents[rows.start : rows.stop], tokenizer, chunk_tokens,  # may be empty
                                   drop_empty=drop_empty))
            save_rows(part, part_path(path, index, count))
            console.phase(f"datastore: documents {rows.start:,}-{rows.stop:,} of {len(documents):,} chunked here "
                          f"({len(part):,} passages)")

        distributed.all_succeed(f"chunking {path}", chunk_share)  # a failed share stops every process
        distributed.all_succeed(f"joining {path}", lambda: join_parts(path, count) if distributed.is_lead() else None)
        store = Datastore.load(path)
    if distributed.is_lead():
        with atomic_open(path + ".source.json") as f:
            json.dump(stamp, f)
    return store


def _stamped(path: str, stamp: dict) -> bool:
    """Whether `path` exists and its stamp records `stamp`."""
    if not (os.path.isfile(path) and os.path.isfile(path + ".source.json")):
        return False
    with open(path + ".source.json") as f:
        return json.load(f) == stamp


def join_parts(path: str, count: int) -> None:
    """The `count` part files, in order, into `path` (written atomically); then the parts are removed."""
    parts = [part_path(path, index, count) for index in range(count)]
    with atomic_open(path, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
    for part in parts:
        os.remove(part)
