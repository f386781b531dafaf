"""One way to get a dense index of a datastore: reuse the saved one if it matches, else embed and build.

    index, reused = build_dense_index(encoder, datastore, "work/index_dense", metric="cosine",
                                      factory="Flat", embedding_dtype="float16")

Used by the evaluation jobs (the initial and the LSR-trained retriever's index) and by the LSR
refresher (each index version), so both embed the same way, at the same dtype, and check the
same metadata: the encoder's fingerprint, the datastore's, the metric and factory, plus any
caller fields (`extra_meta`, e.g. the refresher's version). Embeddings stream to a resumable
.npy memmap (`embed_corpus`); the index is saved atomically.

With several processes every one embeds its share of the rows (`embed_corpus_split`), process 0
builds and saves the index, and the others load it; process 0 decides whether the saved one is reused.

`build_index` is the jobs' entry: the FAISS index above, or (backend "device") the embeddings searched
exactly on the devices (`DeviceIndex`), both from the same resumable embedding file.
"""
from __future__ import annotations

import os

from replug_jax.parallel import distributed
from replug_jax.retrieval.datastore import Datastore
from replug_jax.retrieval.device_index import DeviceIndex
from replug_jax.retrieval.embeddings import embed_corpus_split, sidecar_path
from replug_jax.retrieval.index import DenseIndex, IndexRefused
from replug_jax.retrieval.retriever import index_meta


def build_dense_index(encoder, datastore: Datastore, folder: str, *, metric: str = "cosine", factory: str = "Flat",
                      embedding_dtype: str = "float32", extra_meta: dict | None = None, note: dict | None = None,
                      embeddings_path: str | None = None, delete_embeddings: bool = False, block_size: int = 4096,
                      progress: bool = True) -> tuple[DenseIndex, bool]:
    """(index, reused): the index saved in `folder` when its metadata matches, else a new one saved there.

    `encoder` needs `embed(texts)`, `fingerprint()` and `dim` (a DenseEncoder, or one bound to other
    parameters). `extra_meta` must match for reuse; `note` is only recorded. Embeddings go to
    `embeddings_path` (default `<folder>.embeddings.npy`), removed after the build with `delete_embeddings`."""
    meta = {**index_meta(encoder, datastore), **(extra_meta or {})}
    expected = {**meta, "metric": metric, "factory": factory}
    try:
        saved = DenseIndex.load(folder, expected=expected)
    except (FileNotFoundError, IndexRefused, OSError, ValueError):
        saved = None  # missing, built by another encoder or over another datastore, or unreadable: build it
    if distributed.lead_value(saved is not None):
        return saved or DenseIndex.load(folder, expected=expected), True
    path = embeddings_path or folder.rstrip("/") + ".embeddings.npy"
    embeddings = embed_corpus_split(encoder, datastore.texts, path, dtype=embedding_dtype, block_size=block_size,
                                    progress=progress)

    def build_and_save():
        built = DenseIndex.build(embeddings, metric=metric, factory=factory, meta={**(note or {}), **meta})
        built.save(folder)
        return built

    index = distributed.all_succeed(f"building the index at {folder}",
                                    lambda: build_and_save() if distributed.is_lead() else None)
    del embeddings
    if not distributed.is_lead():
        index = DenseIndex.load(folder, expected=expected)
    if delete_embeddings and distributed.is_lead():
        for f in (path, sidecar_path(path)):
            if os.path.exists(f):
                os.remove(f)
    return index, False


INDEX_BACKENDS = ("faiss", "device")


def build_index(encoder, datastore: Datastore, workdir: str, *, name: str = "dense", metric: str = "cosine",
                factory: str = "Flat", embedding_dtype: str = "float32", backend: str = "faiss",
                device_dtype: str = "float32", progress: bool = True) -> tuple[DenseIndex | DeviceIndex, bool]:
    """(index, reused) of `datastore` in `workdir`: backend "faiss" is `build_dense_index` into
    WORKDIR/index_{name}; "device" searches WORKDIR/embeddings_{name}.npy (reused while it matches encoder and
    datastore) on every device (matrix in `device_dtype`; reused is False: the matrix is placed anew)."""
    if backend not in INDEX_BACKENDS:
        raise ValueError(f"index_backend must be one of {INDEX_BACKENDS}, got {backend!r}")
    embeddings_path = os.path.join(workdir, f"embeddings_{name}.npy")
    if backend == "device":
        embeddings = embed_corpus_split(encoder, datastore.texts, embeddings_path, dtype=embedding_dtype,
                                        progress=progress)
        return DeviceIndex.from_embeddings(embeddings, metric=metric, dtype=device_dtype,
                                           meta=index_meta(encoder, datastore)), False
    return build_dense_index(encoder, datastore, os.path.join(workdir, f"index_{name}"), metric=metric,
                             factory=factory, embedding_dtype=embedding_dtype, embeddings_path=embeddings_path,
                             progress=progress)
