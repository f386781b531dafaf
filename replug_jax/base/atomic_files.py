"""Atomic writes: a file or folder is written under a temporary name next to it and renamed into place on success,
so a crash never leaves it half-written (at worst, between a folder's two renames, the previous one sits under a
temporary name).

Every temporary name the project writes holds `TEMPORARY_MARK`, a mark of its own that no user file is expected to
hold: the files written here, the index refresher's builds and the datastore's per-process part files
(retrieval/chunk_shares.py). Bucket workdirs never mirror such names (jobs/bucket_workdirs.py) and the index
refresher removes leftovers, while a user's `draft.tmp` or `index.old-20251127` is a file like any other. Orbax names
its unfinished checkpoint steps itself (`<step>.orbax-checkpoint-tmp-<n>`): `is_temporary` knows that name too. Not
temporary, so unmarked: the embedding shards of several processes (`<path>.part-<i>-of-<n>.npy`,
retrieval/embeddings.py), which are resumable progress a preempted job takes up again, mirrored like any file.

    with atomic_open("run/results.json") as f: json.dump(results, f)
    with atomic_directory("run/index") as folder: write(folder)
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile

TEMPORARY_MARK = ".replug_jax-tmp"
_ORBAX_UNFINISHED = re.compile(r"\d+\.orbax-checkpoint-tmp(-\d+)?")


def is_temporary(name: str) -> bool:
    """Whether a file or folder name (one path part) is a temporary name the project or orbax writes."""
    return TEMPORARY_MARK in name or bool(_ORBAX_UNFINISHED.fullmatch(name))


def temporary_path(path: str, role: str = "") -> str:
    """A fixed temporary name next to `path` for one writer (`role`: e.g. "pull", "snapshot"): `.<name>.<role>` and
    the mark."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{role}{TEMPORARY_MARK}")


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w"):
    """Write a file through a temp file in the same folder, renamed over `path` only on success."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=TEMPORARY_MARK)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(path: str):
    """Yield a temp folder next to `path`; on success it replaces `path`, on error it is removed."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{name}.new-", suffix=TEMPORARY_MARK)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.exists(path):
        old = tempfile.mkdtemp(dir=parent, prefix=f".{name}.old-", suffix=TEMPORARY_MARK)
        os.replace(path, old)  # rename over the empty placeholder
    os.replace(tmp, path)
    if old:
        shutil.rmtree(old, ignore_errors=True)
