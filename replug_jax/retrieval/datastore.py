"""The retrieval corpus: documents in, token-window chunks out, saved as JSONL.

    docs = read_jsonl("corpus.jsonl")                  # or read_text_files / read_tfds
    ds = chunk_documents(docs, lm.tokenizer, 128)      # Datastore: ids, titles, texts, sources, fields
    ds.save("ds.jsonl"); ds = Datastore.load("ds.jsonl")

A chunk is a window of `chunk_tokens` consecutive tokens of one document. Chunk text is
cut from the document with the tokenizer's character offsets (never decoded), so every
chunk is an exact substring and a document's chunks concatenate back to its text.
Row i of the datastore is row i of the embeddings and of the index.

A document's own fields (a JSONL row's keys besides "id", "title" and "text") are kept as given, by its id: under
"fields" on each of its chunks in the datastore file, and beside each passage in the jobs' records
(`with_passage_fields`), so the project's columns ("source", the chunk's "id") never overwrite a user's.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
from typing import Iterable, Iterator

import numpy as np

from replug_jax.base.atomic_files import atomic_open
from replug_jax.base.errors import InputError, invalid_json
from replug_jax.models.tokenizer import TextTokenizer, token_starts_batch


FILE_FORMAT = 2  # the datastore file's: 2 keeps a document's own fields (a file of format 1 is re-chunked)
DOCUMENT_KEYS = ("id", "title", "text")  # what a document row means to the project; its other keys are its own


@dataclasses.dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str
    fields: tuple = dataclasses.field(default=(), compare=False)  # the row's other keys as (key, value) pairs


def document_from_record(record, default_id: str) -> Document:
    """A `Document` from a {"text": ..., "title"?: ..., "id"?: ..., other keys} mapping; id defaults to
    `default_id`, the other keys are kept as its `fields`."""
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise InputError("expected an object with a string \"text\" field")
    fields = tuple((key, value) for key, value in record.items() if key not in DOCUMENT_KEYS)
    return Document(str(record.get("id", default_id)), str(record.get("title") or ""), record["text"], fields)


def read_jsonl(path: str) -> Iterator[Document]:
    """Documents from a JSONL file of {"text": ..., "title"?: ..., "id"?: ...}; id defaults to the 1-based line number."""
    with open(path, encoding="utf-8") as f:
        lines = enumerate(f, start=1)
        while True:
            try:
                line_no, line = next(lines)
            except StopIteration:
                return
            except UnicodeDecodeError as e:
                raise not_utf8(path, e) from None
            if not line.strip():
                continue
            try:
                document = document_from_record(json.loads(line), str(line_no))
            except json.JSONDecodeError as e:
                raise invalid_json(f"{path}, line {line_no}", e) from None
            except ValueError as e:
                raise InputError(f"{path}, line {line_no}: {e}") from None
            yield document


def not_utf8(path: str, error: UnicodeDecodeError) -> InputError:
    """A file of documents that is not UTF-8 text, said as the user's input."""
    return InputError(f"{path}: not UTF-8 text ({error.reason}); save it as UTF-8")


def read_document_file(path: str) -> Iterator[Document]:
    """Documents from one file: a UTF-8 .txt file (one document) or a JSONL file (`read_jsonl`)."""
    return read_text_files([path]) if path.endswith(".txt") else read_jsonl(path)


def read_text_files(paths: Iterable[str]) -> Iterator[Document]:
    """One document per UTF-8 text file; id = the file name without extension, empty title."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            try:
                text = f.read()
            except UnicodeDecodeError as e:
                raise not_utf8(path, e) from None
        yield Document(os.path.splitext(os.path.basename(path))[0], "", text)


def read_tfds(name: str, split: str, text_key: str = "text", title_key: str | None = None,
              data_dir: str | None = None, download: bool = True) -> Iterator[Document]:
    """Documents from a TensorFlow Datasets array_record dataset, via `tfds.data_source` (no TensorFlow).

    The dataset must be an array_record build (prepared in `data_dir`, or downloadable when
    `download`); records are read by random access, in the source's order. Ids are
    f"{split}/{record index}"; bytes features are decoded as UTF-8. Tested on a dataset that a
    builder in tests/tfds_tiny.py prepares without TensorFlow.
    """
    for i, record in tfds_records(name, split, data_dir, download):
        title = as_text(record[title_key]) if title_key else ""
        yield Document(f"{split}/{i}", title, as_text(record[text_key]))


def tfds_records(name: str, split: str, data_dir: str | None = None, download: bool = True):
    """(index, record) of a TFDS array_record build, by random access with `tfds.data_source` (no TensorFlow)."""
    import tensorflow_datasets as tfds

    source = tfds.data_source(name, split=split, data_dir=data_dir, download=download)
    for i in range(len(source)):
        yield i, source[i]


def as_text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def hash_strings(*columns: Iterable[str]) -> str:
    """A short sha256 of string columns, length-prefixed so different splits never collide."""
    h = hashlib.sha256()
    for column in columns:
        h.update(b"|column|")
        for s in column:
            b = s.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()[:16]


@dataclasses.dataclass
class Datastore:
    """Chunks as parallel lists: row i is (ids[i], titles[i], texts[i], sources[i] = its document's id); `fields`: a
    document's own fields by its id (documents that have any)."""

    ids: list[str]
    titles: list[str]
    texts: list[str]
    sources: list[str]
    fields: dict[str, dict] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        n = len(self.ids)
        if n == 0:
            raise InputError("empty corpus: no chunks (no documents, or only empty texts)")
        if not len(self.titles) == len(self.texts) == len(self.sources) == n:
            raise ValueError("ids, titles, texts and sources must have the same length")
        if len(set(self.ids)) != n:
            seen: set[str] = set()
            dup = next(i for i in self.ids if i in seen or seen.add(i))
            raise InputError(f"duplicate chunk id {dup!r} (are two documents sharing an id?)")
        self._rows_by_source: dict[str, np.ndarray] | None = None
        self._rows_by_id: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def fingerprint(self) -> str:
        """A short hash of ids and texts; an index built over another datastore is refused."""
        return hash_strings(self.ids, self.texts)

    def rows_of_sources(self, sources: Iterable[str]) -> np.ndarray:
        """Rows [R] int64 of every chunk cut from the given source documents (unknown ids: none)."""
        if self._rows_by_source is None:
            groups: dict[str, list[int]] = {}
            for row, source in enumerate(self.sources):
                groups.setdefault(source, []).append(row)
            self._rows_by_source = {s: np.asarray(r, np.int64) for s, r in groups.items()}
        found = [self._rows_by_source[s] for s in set(sources) if s in self._rows_by_source]
        return np.concatenate(found) if found else np.zeros(0, np.int64)

    def passage_fields(self, chunk_ids: Iterable[str]) -> list[dict]:
        """The own fields of each chunk's document ({} where it has none), for chunk ids [n]."""
        if self._rows_by_id is None:
            self._rows_by_id = {chunk_id: row for row, chunk_id in enumerate(self.ids)}
        return [self.fields.get(self.sources[self._rows_by_id[c]], {}) for c in chunk_ids]

    def save(self, path: str) -> None:
        """One JSON object per chunk, written atomically."""
        save_rows(zip(self.ids, self.titles, self.texts, self.sources,
                      (self.fields.get(s, {}) for s in self.sources)), path)

    @classmethod
    def load(cls, path: str) -> "Datastore":
        columns: dict[str, list[str]] = {"id": [], "title": [], "text": [], "source": []}
        fields: dict[str, dict] = {}
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                try:
                    record = json.loads(line)
                    for key, column in columns.items():
                        column.append(record[key])
                    if record.get("fields"):
                        fields[record["source"]] = record["fields"]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}, line {line_no}: not a datastore chunk ({e!r})") from None
        return cls(columns["id"], columns["title"], columns["text"], columns["source"], fields)


def with_passage_fields(record, store: Datastore):
    """`record` (a job's predictions or windows row) with, beside every "passage_ids" and "<method>_passage_ids"
    list at any depth, "passage_fields" ("<method>_passage_fields"): each passage's document's own fields, {} where
    it has none. Unchanged where no document of `store` has fields of its own."""
    if not store.fields:
        return record
    if isinstance(record, list):
        return [with_passage_fields(item, store) for item in record]
    if not isinstance(record, dict):
        return record
    out = {}
    for key, value in record.items():
        out[key] = with_passage_fields(value, store)
        if (key == "passage_ids" or key.endswith("_passage_ids")) and isinstance(value, list):
            out[key[: -len("ids")] + "fields"] = store.passage_fields(value)
    return out


SHOWN_IDS = 5  # ids named in a message about several documents


def without_text(ids: list[str]) -> str:
    """'2 documents without text (id 'a', 'b')': how every refusal and warning names them."""
    shown = ", ".join(map(repr, ids[:SHOWN_IDS]))
    return f"{len(ids)} document{'s' if len(ids) != 1 else ''} without text (id {shown}" + (
        f" and {len(ids) - SHOWN_IDS} more)" if len(ids) > SHOWN_IDS else ")")


class EmptyDocuments(InputError):
    """Documents without text, where leaving them out was not asked for."""


def with_text(documents: Iterable[Document], drop_empty: bool = False, batch: int = 1024) -> Iterator[Document]:
    """The documents that have text (more than whitespace), by the one rule of every source (a file of any size, a
    folder, DPR's passages, the REPLUG object, the harness): a document without text is refused naming it
    (`EmptyDocuments`, raised at the first batch of `batch` holding one), or, with `drop_empty`, left out and
    named in one warning once all are read."""
    import warnings

    dropped = []
    for part in _batches(documents, batch):
        empty = [d.id for d in part if not d.text.strip()]
        if empty and not drop_empty:
            them = "it" if len(empty) == 1 else "them"
            raise EmptyDocuments(f"{without_text(empty)}: give {them} text, or leave {them} out with "
                                 "drop_empty_documents (--config.drop_empty_documents=True in a job, "
                                 "drop_empty_documents=True for the REPLUG object and the harness)")
        dropped += empty
        yield from (d for d in part if d.text.strip())
    if dropped:
        warnings.warn(f"left out {without_text(dropped)} (drop_empty_documents)", stacklevel=2)


def chunk_documents(documents: Iterable[Document], tokenizer: TextTokenizer, chunk_tokens: int = 128,
                    min_tokens: int = 16, drop_empty: bool = False) -> Datastore:
    """Cut each document into consecutive windows of `chunk_tokens` tokens of `tokenizer`.

    Chunk j of a document spans from its first token's start (0 for j = 0) to the next
    chunk's first token's start (the end of the text for the last chunk), so the chunks
    tile the document exactly. A trailing window of fewer than `min_tokens` tokens is
    merged into the previous chunk (which then has up to chunk_tokens + min_tokens - 1
    tokens); a document shorter than `min_tokens` stays one chunk. A document with no text (only whitespace, or
    none) is refused naming it, or left out with `drop_empty` (`with_text`). Chunk ids are
    f"{document id}#{chunk number}".
    """
    ids, titles, texts, sources, fields = [], [], [], [], {}
    for row_id, title, text, source, own in chunk_rows(documents, tokenizer, chunk_tokens, min_tokens, drop_empty):
        ids.append(row_id)
        titles.append(title)
        texts.append(text)
        sources.append(source)
        if own:
            fields[source] = own
    return Datastore(ids, titles, texts, sources, fields)


def chunk_rows(documents: Iterable[Document], tokenizer: TextTokenizer, chunk_tokens: int = 128,
               min_tokens: int = 16, drop_empty: bool = False) -> Iterator[tuple[str, str, str, str, dict]]:
    """`chunk_documents`' chunks as (id, title, text, source, the document's own fields) rows, none for no document
    (not an error here); a document without text refused or left out as `with_text` says."""
    if chunk_tokens < 1 or min_tokens < 0:
        raise ValueError(f"chunk_tokens must be >= 1 and min_tokens >= 0, got {chunk_tokens}, {min_tokens}")
    # one batch encoding per batch: the tokenizer's every core
    for batch in _batches(with_text(documents, drop_empty, CHUNK_BATCH), CHUNK_BATCH):
        for doc, starts in zip(batch, token_starts_batch(tokenizer, [d.text for d in batch])):
            for j, (start, end) in enumerate(_chunk_spans(starts, chunk_tokens, min_tokens)):
                yield f"{doc.id}#{j}", doc.title, doc.text[start:end], doc.id, dict(doc.fields)


def save_rows(rows: Iterable[tuple[str, str, str, str, dict]], path: str) -> None:
    """(id, title, text, source, the document's own fields) rows as a datastore file (`Datastore.load` reads it): one
    JSON object per chunk, "fields" only where the document has some, written atomically."""
    with atomic_open(path) as f:
        for chunk_id, title, text, source, own in rows:
            row = {"id": chunk_id, "title": title, "text": text, "source": source, **({"fields": own} if own else {})}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


CHUNK_BATCH = 1024  # documents tokenised together


def _batches(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _chunk_spans(starts: list[int], chunk_tokens: int, min_tokens: int) -> list[tuple[int, int]]:
    """Character spans [(start, end)] of one document's chunks from its `token_starts` [n + 1]."""
    text_length = starts[-1]
    n = len(starts) - 1
    if n == 0:
        return []
    firsts = list(range(0, n, chunk_tokens))  # first token of each window
    if len(firsts) > 1 and n - firsts[-1] < min_tokens:
        firsts.pop()
    # sorted(set(...)): a character split over several byte-level tokens never yields an empty chunk
    bounds = sorted({0, text_length, *(starts[t] for t in firsts[1:])})
    return list(zip(bounds[:-1], bounds[1:]))

