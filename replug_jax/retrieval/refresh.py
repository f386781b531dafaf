"""Asynchronous index refresh (the paper's §4.4): re-embed the datastore with the retriever's
current parameters and rebuild the FAISS index on a background host thread, while training
goes on searching the previous index; the new index is swapped in atomically between steps.

    refresher = IndexRefresher(encoder, datastore, workdir="run/index", swap_after=50)
    refresher.request(params, step=0, version=0, wait=True)  # or adopt(index) / load_version(v) on resume
    for step in range(start, steps):
        info = refresher.maybe_swap(step)          # None, or the swap/failure record (log it)
        scores, rows = refresher.search(queries, k)  # or refresher.current / refresher.snapshot()
        ...train step...
        if (step + 1) % refresh_every == 0:
            refresher.request(params, step + 1, version + 1)

Determinism: a build requested at step s is swapped in exactly at the first `maybe_swap`
call with step >= s + swap_after. If it is not done by then, that call blocks until it is
and records the wait (`waited_seconds`); if nothing is serving yet it swaps at once. So a
killed-and-resumed run that re-requests the same (step, params, version) sees the same
index at the same steps as an uninterrupted one. `swap_after=0` is synchronous mode: the
build runs inside `request` (no thread; `waited_seconds` is the whole build) and the next
`maybe_swap` installs it. With `workdir`, builds go through `retrieval.build.build_dense_index`
(as the evaluation's do): `index_v{version}` saved with the same encoder fingerprint is reused,
and embeddings (at `embedding_dtype`) are resumable on disk, deleted once the index is saved. For an exact resume,
checkpoint only where no build is pending (`pending` is None) and record `version`; saving
keeps the newest `keep` versions plus the serving one, so `keep` must cover every version
a retained checkpoint may name.

One build at a time: `request` while a build is still pending (not yet swapped in) raises
RuntimeError — choose swap_after < refresh_every. A failed build leaves the old index
serving; `maybe_swap` reports it ({"version", "ok": False, "error", ...}) and logs a
warning; it never raises into the training loop (only `request(..., wait=True)` raises,
when the build fails and there is no index to fall back on).
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time

import jax
import numpy as np

from replug_jax.base.atomic_files import is_temporary
from replug_jax.parallel import distributed
from replug_jax.retrieval.build import build_dense_index
from replug_jax.retrieval.datastore import Datastore
from replug_jax.retrieval.index import DenseIndex, IndexRefused
from replug_jax.retrieval.retriever import index_meta

log = logging.getLogger(__name__)
_INDEX_DIR = re.compile(r"index_v(\d+)")


class _Cancelled(Exception):
    """The refresher was closed while a build was running."""


class _BoundEncoder:
    """The encoder with fixed (snapshot) parameters, in the shape `embed_corpus` expects."""

    def __init__(self, encoder, params, stop: threading.Event):
        self.encoder, self.params, self.stop = encoder, params, stop
        self.dim = encoder.dim
        self._fingerprint = encoder.fingerprint(params)

    def fingerprint(self) -> str:
        return self._fingerprint

    def embed(self, texts, progress=False) -> np.ndarray:
        if self.stop.is_set():
            raise _Cancelled("refresher closed during the build")
        return self.encoder.embed(texts, progress=progress, params=self.params)


class IndexRefresher:
    """Rebuilds a DenseIndex over `datastore` with snapshot parameters; `current` is the serving index."""

    def __init__(self, encoder, datastore: Datastore, *, metric: str = "cosine", factory: str = "Flat",
                 workdir: str | None = None, swap_after: int = 0, keep: int = 2, block_size: int = 4096,
                 embedding_dtype: str = "float32"):
        if swap_after < 0 or keep < 1:
            raise ValueError(f"need swap_after >= 0 and keep >= 1, got {swap_after}, {keep}")
        self.encoder, self.datastore, self.metric, self.factory = encoder, datastore, metric, factory
        self.workdir, self.swap_after, self.keep, self.block_size = workdir, swap_after, keep, block_size
        self.embedding_dtype = embedding_dtype
        self._lock = threading.Lock()  # guards (_index, _version): readers get one consistent pair
        self._index: DenseIndex | None = None
        self._version: int | None = None
        self._pending: dict | None = None  # version, request_step, swap_step, thread, result
        self._stop = threading.Event()
        self._writer = distributed.is_lead()  # several processes: process 0 alone writes (builds are split)
        if workdir and self._writer:
            os.makedirs(workdir, exist_ok=True)
            for name in os.listdir(workdir):  # leftovers of a save killed between its renames
                if name.startswith(".index_v") and is_temporary(name):
                    shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)

    # ---- reading: the serving index ----
    @property
    def current(self) -> DenseIndex | None:
        """The serving index (None before the first swap or `load_version`)."""
        return self._index

    @property
    def version(self) -> int | None:
        return self._version

    def snapshot(self) -> tuple[int | None, DenseIndex | None]:
        """(version, index) of the serving index, read together."""
        with self._lock:
            return self._version, self._index

    def search(self, queries: np.ndarray, k: int, exclude=None) -> tuple[np.ndarray, np.ndarray]:
        """`DenseIndex.search` on the serving index: (scores [Q, k] float32, rows [Q, k] int64)."""
        index = self._index  # one read: a swap during the search does not affect it
        if index is None:
            raise RuntimeError("no index is serving yet: request a build and call maybe_swap, or load_version")
        return index.search(queries, k, exclude=exclude)

    @property
    def pending(self) -> dict | None:
        """{"version", "request_step", "swap_step", "done"} of the build not yet swapped in, or None."""
        p = self._pending
        if p is None:
            return None
        return {"version": p["version"], "request_step": p["request_step"], "swap_step": p["swap_step"],
                "done": p["result"] is not None}

    # ---- writing: request, swap, reload ----
    def request(self, params, step: int, version: int, wait: bool = False) -> dict | None:
        """Start building index `version` from `params` (copied to host now: the train step may donate them).

        `wait=True` builds it now in this thread and serves it at once (e.g. the first index),
        returning the swap record; otherwise None, and `maybe_swap` installs it when due.
        """
        if self._stop.is_set():
            raise RuntimeError("the refresher is closed")
        if self._pending is not None:
            p = self._pending
            raise RuntimeError(f"index refresh v{p['version']} (requested at step {p['request_step']}) is not swapped "
                               f"in yet (due at step {p['swap_step']}); call maybe_swap first, or use swap_after "
                               f"< refresh interval")
        if self._version is not None and version <= self._version:
            raise ValueError(f"index version {version} is not newer than the serving version {self._version}")
        snapshot = jax.device_get(params)  # host numpy tree, safe from buffer donation
        p = {"version": version, "request_step": step, "swap_step": step + (0 if wait else self.swap_after),
             "result": None, "thread": None}
        self._pending = p
        if wait or self.swap_after == 0:
            self._run(p, snapshot)  # synchronous: training waits for the whole build
            p["result"]["waited_seconds"] = p["result"]["build_seconds"]
            if not wait:
                return None
            info = self.maybe_swap(step)
            if not info["ok"] and self._index is None:
                raise RuntimeError(f"building the first index (v{version}) failed: {info['error']}")
            return info
        else:
            p["thread"] = threading.Thread(target=self._run, args=(p, snapshot), daemon=True,
                                           name=f"index-refresh-v{version}")
            p["thread"].start()

    def maybe_swap(self, step: int) -> dict | None:
        """Between train steps: install the pending index if it is due at `step` (blocking until it is built).

        Returns None when nothing was due, else {"version", "ok", "build_seconds", "waited_seconds",
        "step", "request_step", "reused"} (+ "error" when the build failed and the old index stays).
        """
        p = self._pending
        if p is None or (step < p["swap_step"] and self._index is not None):
            return None
        waited = 0.0
        if p["thread"] is not None:
            start = time.perf_counter()
            p["thread"].join()
            waited = time.perf_counter() - start
        result = p["result"]
        self._pending = None
        info = {"version": p["version"], "ok": result["ok"], "build_seconds": result["build_seconds"],
                "waited_seconds": result.get("waited_seconds", waited), "step": step,
                "request_step": p["request_step"], "reused": result.get("reused", False)}
        if step > p["swap_step"] and self._index is not None:
            log.warning("index v%d was due at step %d but maybe_swap was first called at step %d",
                        p["version"], p["swap_step"], step)
        if result["ok"]:
            with self._lock:
                self._index, self._version = result["index"], p["version"]
            log.info("index v%d swapped in at step %d (built in %.1fs, training waited %.2fs)",
                     p["version"], step, info["build_seconds"], info["waited_seconds"])
        else:
            info["error"] = result["error"]
            log.warning("index refresh v%d failed, still serving v%s: %s", p["version"], self._version, result["error"])
        return info

    def adopt(self, index: DenseIndex, version: int = 0) -> DenseIndex:
        """Serve an index built elsewhere over this datastore (e.g. by the evaluation) as `version`,
        saved as `workdir/index_v{version}` so that `load_version` finds it on resume."""
        if self._pending is not None:
            raise RuntimeError(f"index refresh v{self._pending['version']} is pending; swap it in before adopting")
        if index.count != len(self.datastore):
            raise IndexRefused(f"the index holds {index.count} rows but the datastore {len(self.datastore)} chunks")
        meta = {**index.meta, **self._expected(version)}
        for key in ("datastore", "metric", "factory"):
            if index.meta.get(key, meta[key]) != meta[key]:
                raise IndexRefused(f"cannot adopt an index with {key} {index.meta[key]!r}: expected {meta[key]!r}")
        index = DenseIndex(index.index, meta)  # shares the FAISS index; the caller's meta is left alone
        if self.workdir and self._writer:
            index.save(self.path(version))
            self._prune(version)
        with self._lock:
            self._index, self._version = index, version
        return index

    def load_version(self, version: int, expected: dict | None = None) -> DenseIndex:
        """Serve the saved `workdir/index_v{version}` (on resume), after checking its metadata."""
        if not self.workdir:
            raise ValueError("load_version needs a workdir")
        if self._pending is not None:
            raise RuntimeError(f"index refresh v{self._pending['version']} is pending; swap it in before loading")
        index = DenseIndex.load(self.path(version), expected={**self._expected(version), **(expected or {})})
        with self._lock:
            self._index, self._version = index, version
        return index

    def path(self, version: int) -> str:
        return os.path.join(self.workdir, f"index_v{version}")

    def close(self, timeout: float = 60) -> None:
        """Cancel a running build (between embedding blocks) and join its thread for at most `timeout` seconds: a
        build blocked elsewhere (several processes: at a barrier its cancelled peer never reaches) is left to die
        with the process (a daemon thread), with a warning, rather than hang the end of training."""
        self._stop.set()
        p = self._pending
        if p is not None and p["thread"] is not None:
            p["thread"].join(timeout)
            if p["thread"].is_alive():
                log.warning("index refresh v%d did not stop within %.0fs of close(); left to end with the process",
                            p["version"], timeout)
        self._pending = None

    def __enter__(self) -> "IndexRefresher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the build (background thread, or the caller's in synchronous mode) ----
    def _expected(self, version: int) -> dict:
        return {"version": version, "datastore": self.datastore.fingerprint(), "metric": self.metric,
                "factory": self.factory}

    def _run(self, p: dict, snapshot) -> None:
        start = time.perf_counter()
        try:
            index, reused = self._build(snapshot, p["version"], p["request_step"])
            result = {"ok": True, "index": index, "reused": reused}
        except Exception as e:  # reported by maybe_swap; training keeps the old index
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        result["build_seconds"] = time.perf_counter() - start
        p["result"] = result  # one assignment, after everything: `pending` reads it as "done"

    def _build(self, snapshot, version: int, step: int) -> tuple[DenseIndex, bool]:
        bound = _BoundEncoder(self.encoder, snapshot, self._stop)
        extra, note = {"version": version}, {"request_step": step}
        if not self.workdir:
            blocks = [bound.embed(self.datastore.texts[i : i + self.block_size])
                      for i in range(0, len(self.datastore), self.block_size)]
            meta = {**index_meta(bound, self.datastore), **extra, **note}
            return DenseIndex.build(np.concatenate(blocks), self.metric, self.factory, meta=meta), False
        index, reused = build_dense_index(
            bound, self.datastore, self.path(version), metric=self.metric, factory=self.factory,
            embedding_dtype=self.embedding_dtype, extra_meta=extra, note=note, delete_embeddings=True,
            block_size=self.block_size,
            embeddings_path=os.path.join(self.workdir, f"embeddings_v{version}.npy"), progress=False)
        if not reused and self._writer:
            self._prune(version)
        return index, reused

    def _prune(self, newest: int) -> None:
        """Keep the newest `keep` saved versions (and the serving one); drop stale embedding files."""
        versions = sorted(int(m.group(1)) for n in os.listdir(self.workdir) if (m := _INDEX_DIR.fullmatch(n)))
        for v in versions[: -self.keep]:
            if v != self._version and v != newest:
                shutil.rmtree(self.path(v), ignore_errors=True)
        for name in os.listdir(self.workdir):
            m = re.fullmatch(r"embeddings_v(\d+)\.npy(\.json)?", name)
            if m and int(m.group(1)) < newest:
                os.remove(os.path.join(self.workdir, name))
