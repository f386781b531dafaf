"""Workdirs on a bucket (`--workdir gs://BUCKET/run`): the job runs in a local staging copy of it.

What the jobs write needs a local file system (memory-mapped embeddings, SQLite caches, FAISS files, atomic
renames), so a bucket workdir is mirrored: main.py checks the bucket is reachable before any work, pulls it into
a local staging directory ($REPLUG_JAX_STAGING_DIR, default ~/.cache/replug_jax/staging/<hash of the URL>), runs
the job there, and pushes it back after every LSR checkpoint and when the job ends, failed or not. Both
directions mirror by MD5 checksum: a pull makes the local copy equal the bucket (local files the bucket lacks
are deleted: a stale staged checkpoint never reaches a fresh bucket), a push makes the bucket equal the local
copy (uploads first, then bucket files the local copy lacks are deleted: the newest complete checkpoint is
always there). Never mirrored: the project's own temporary names (`base.atomic_files.is_temporary`: the project's
mark, or orbax's unfinished step; a user's `notes.part`, `draft.tmp` or `index.old-20251127` is mirrored) and
SQLite's side files (`-wal`, `-shm`, `-journal`); an SQLite database is pushed as a consistent snapshot (SQLite's
backup API), so a cache written while a push runs is never sent half-written. A resumed run on a new VM pulls the
checkpoints first. Paths go through `etils.epath` (installed with orbax): gs:// needs `gcsfs` (or TensorFlow's
gfile), s3:// `s3fs`; a scheme it cannot open fails at start with one line, never a local folder named "gs:".
Several processes with a bucket workdir are refused (each host would stage its own copy): give them a shared
file system. `local_folder` stages a few named files of a bucket folder (a trained retriever) for reading.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import sqlite3

from replug_jax.base.atomic_files import is_temporary, temporary_path

ENV_STAGING = "REPLUG_JAX_STAGING_DIR"
SIDE_FILES = ("-wal", "-shm", "-journal")  # SQLite's: consistent only with their open database
_SQLITE_HEADER = b"SQLite format 3\x00"
_active: "Staging | None" = None  # the job's staging, for `sync` from inside a job (LSR checkpoints)


def is_remote(path) -> bool:
    """Whether `path` is a URL (gs://, s3://, ...) rather than a local path."""
    return "://" in str(path)


def ignored(rel: str) -> bool:
    """Whether a relative path is never mirrored: a temporary file or folder, or an SQLite side file."""
    parts = rel.replace(os.sep, "/").split("/")
    return any(is_temporary(p) for p in parts) or parts[-1].endswith(SIDE_FILES)


def _md5(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _info_md5(info: dict) -> str | None:
    """The MD5 a listing gives (gcsfs: base64 `md5Hash`; s3fs: a single-part `ETag`), else None."""
    if info.get("md5Hash"):
        return base64.b64decode(info["md5Hash"]).hex()
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"').lower()
    return etag if re.fullmatch(r"[0-9a-f]{32}", etag) else None


def _files(root) -> dict[str, tuple[object, dict]]:
    """{relative path: (epath, listing info)} of every file under `root` (one fsspec `find`; epath's listing
    folder by folder, with no info, where fsspec cannot open the scheme)."""
    try:
        import fsspec

        fs, base = fsspec.core.url_to_fs(str(root))
        fs.invalidate_cache()
        found = fs.find(base, detail=True)
    except (ImportError, ValueError):
        found = None
    if found is not None:
        base = base.rstrip("/")
        return {name[len(base) + 1 :]: (root / name[len(base) + 1 :], info) for name, info in found.items()
                if info.get("type") != "directory" and name.startswith(base + "/")}
    out, todo = {}, [root]
    while todo:
        folder = todo.pop()
        for child in folder.iterdir():
            if child.is_dir():
                todo.append(child)
            else:
                out[str(child)[len(str(root)) + 1 :]] = (child, {})
    return out


class Staging:
    """A bucket workdir `url` mirrored in the local directory `local`."""

    def __init__(self, url: str, local: str | None = None):
        from etils import epath

        self.url = url.rstrip("/")
        self.remote = epath.Path(self.url)
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        base = os.environ.get(ENV_STAGING) or os.path.join(os.path.expanduser("~"), ".cache", "replug_jax", "staging")
        self.local = local or os.path.join(base, digest)
        self._bucket: dict[str, tuple[str, int]] = {}  # relative path -> (md5, size) the bucket got from us or gave us
        self._digests: dict[str, tuple[tuple, str]] = {}  # local path -> (its stat key, md5) last computed

    def check(self) -> None:
        """The bucket folder exists or can be made, and takes a file: ValueError naming the problem otherwise."""
        try:
            self.remote.mkdir(parents=True, exist_ok=True)
            probe = self.remote / ".replug_jax_write_check"
            probe.write_text("ok")
            probe.unlink()
        except Exception as e:  # noqa: BLE001 (ImportError for a missing gcsfs, auth and network errors, ...)
            raise ValueError(f"--workdir {self.url}: cannot write there ({type(e).__name__}: {e}); for gs:// "
                             "install gcsfs (pip install gcsfs) and log in (gcloud auth application-default "
                             "login), or give a local or shared-file-system workdir") from None

    def pull(self, names=None) -> int:
        """Make the local copy equal the bucket (or, with `names`, hold those of its files the bucket has):
        files that differ by checksum are copied, local files the bucket lacks deleted; returns files copied."""
        os.makedirs(self.local, exist_ok=True)
        remote = {rel: entry for rel, entry in _files(self.remote).items()
                  if not ignored(rel) and (names is None or rel in names)}
        for rel in self._local_files(every=True):
            if rel not in remote and (names is None or rel in names):
                os.remove(os.path.join(self.local, rel))
        copied = 0
        for rel, (path, info) in remote.items():
            target = os.path.join(self.local, rel)
            want = _info_md5(info)
            if want is not None and os.path.isfile(target) and self._digest(target) == want:
                self._bucket[rel] = (want, os.path.getsize(target))
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            part = temporary_path(target, "pull")
            path.copy(part, overwrite=True)
            got = _md5(part)
            if os.path.isfile(target) and self._digest(target) == got:
                os.remove(part)  # the same bytes (a bucket whose listing gives no checksum)
            else:
                os.replace(part, target)
                copied += 1
            self._digests[target] = (self._key(target), got)
            self._bucket[rel] = (got, os.path.getsize(target))
        _prune_empty(self.local)
        return copied

    def push(self) -> int:
        """Make the bucket equal the local copy: files that differ by checksum are copied (an SQLite database as a
        snapshot), then bucket files the local copy lacks deleted (none if an upload failed); returns files copied."""
        local = set(self._local_files())
        remote = _files(self.remote)
        copied = 0
        for rel in sorted(local):
            try:
                copied += self._push_one(rel, remote.get(rel))
            except FileNotFoundError:
                continue  # removed meanwhile (a replaced index): the next push mirrors what replaced it
        for rel, (path, _) in remote.items():
            if rel not in local:
                path.unlink(missing_ok=True)
                self._bucket.pop(rel, None)
        return copied

    def _push_one(self, rel: str, remote) -> int:
        """Send one local file unless the bucket's (`remote`: (epath, info) or None) has its checksum: 1 if sent."""
        from etils import epath

        path = os.path.join(self.local, rel)
        same = lambda digest: digest is not None and remote is not None and self._bucket_md5(rel, *remote) == digest
        if same(self._digest(path, cached_only=True)):
            return 0  # unchanged since we last read it, and the bucket has it
        snapshot = _snapshot(path) if _is_sqlite(path) else None
        try:
            digest = self._digest(path, snapshot)
            if same(digest):
                return 0
            target = self.remote / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            epath.Path(snapshot or path).copy(target, overwrite=True)
            self._bucket[rel] = (digest, os.path.getsize(snapshot or path))
            return 1
        finally:
            if snapshot:
                os.remove(snapshot)

    def _local_files(self, every: bool = False) -> list[str]:
        """Relative paths of the local files (`every`: temporary and SQLite side files too)."""
        out = []
        for folder, _, names in os.walk(self.local):
            for name in names:
                rel = os.path.relpath(os.path.join(folder, name), self.local)
                if every or not ignored(rel):
                    out.append(rel)
        return out

    def _bucket_md5(self, rel: str, path, info: dict) -> str:
        """The bucket file's MD5: its listing's, else what we last sent or got (same size), else read."""
        known = _info_md5(info)
        if known is None and rel in self._bucket and info.get("size", self._bucket[rel][1]) == self._bucket[rel][1]:
            known = self._bucket[rel][0]
        if known is None:
            h = hashlib.md5()
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            known = h.hexdigest()
        return known

    def _key(self, path: str) -> tuple:
        """What changes when a file (or its SQLite database's side files) changes."""
        return (_stat(path),) + tuple(_stat(path + s) for s in SIDE_FILES if os.path.exists(path + s))

    def _digest(self, path: str, source: str | None = None, cached_only: bool = False) -> str | None:
        """MD5 of `source` (default `path`), remembered under `path`'s stat key until the file changes
        (`cached_only`: None unless remembered)."""
        key = self._key(path)
        if self._digests.get(path, (None,))[0] == key:
            return self._digests[path][1]
        if cached_only:
            return None
        digest = _md5(source or path)
        if self._key(path) == key:  # not written meanwhile
            self._digests[path] = (key, digest)
        return digest


def _is_sqlite(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(16) == _SQLITE_HEADER


def _snapshot(path: str) -> str:
    """A consistent copy of the SQLite database `path` (its WAL included), next to it under a temporary name."""
    target = temporary_path(path, "snapshot")
    if os.path.exists(target):
        os.remove(target)
    source, copy = sqlite3.connect(path, timeout=60), sqlite3.connect(target)
    try:
        source.backup(copy)
    finally:
        copy.close()
        source.close()
    return target


def _prune_empty(root: str) -> None:
    for folder, subfolders, names in os.walk(root, topdown=False):
        if folder != root and not os.listdir(folder):
            os.rmdir(folder)


def local_folder(path: str, names) -> str:
    """`path` itself for a local folder; for a bucket folder, a local folder holding those of the files `names`
    (relative paths) that the bucket has, pulled by checksum into $REPLUG_JAX_STAGING_DIR (ValueError where
    the bucket cannot be read)."""
    if not is_remote(path):
        return path
    staging = Staging(path)
    staging.local += "-read"
    try:
        staging.pull(set(names))
    except Exception as e:  # noqa: BLE001 (a missing gcsfs, auth and network errors, ...)
        raise ValueError(f"{path}: cannot read it ({type(e).__name__}: {e})") from None
    return staging.local


def staged(workdir: str) -> Staging | None:
    """A checked, pulled Staging for a bucket workdir (and the job's active one), or None for a local path."""
    global _active
    if not is_remote(workdir):
        return None
    from replug_jax.parallel import distributed

    if distributed.process_count() > 1:
        raise ValueError(f"--workdir {workdir}: several processes cannot share a bucket workdir through local "
                         "copies; give them a shared file system (or run one process)")
    _active = Staging(workdir)
    _active.check()
    _active.pull()
    return _active


def sync() -> None:
    """Push the active staging's changes to its bucket (after a checkpoint); nothing for a local workdir."""
    if _active is not None:
        _active.push()


def finish(staging: Staging | None) -> None:
    """The job's last push (also after a failure), and no staging active any more."""
    global _active
    if staging is not None:
        staging.push()
    _active = None
