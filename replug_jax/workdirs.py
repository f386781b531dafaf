"""Workdirs on a bucket (`--workdir gs://BUCKET/run`): the job runs in a local staging copy of it.

What the jobs write needs a local file system (memory-mapped embeddings, SQLite caches, FAISS files, atomic
renames), so a bucket workdir is mirrored: main.py checks the bucket is reachable before any work, pulls what it
already holds into a local staging directory ($REPLUG_JAX_STAGING_DIR, default
~/.cache/replug_jax/staging/<hash of the URL>), runs the job there, and pushes new or changed files back after
every LSR checkpoint and when the job ends, failed or not (logs, results, checkpoints, index, caches). A run
resumed on a new VM pulls the checkpoints first. Paths go through `etils.epath` (installed with orbax): gs://
needs `gcsfs` (or TensorFlow's gfile), s3:// `s3fs`; a scheme it cannot open fails at start with one line, never
a local folder named "gs:". Several processes with a bucket workdir are refused (each host would stage its
own copy): give them a shared file system.
"""
from __future__ import annotations

import hashlib
import os

ENV_STAGING = "REPLUG_JAX_STAGING_DIR"
_active: "Staging | None" = None  # the job's staging, for `sync` from inside a job (LSR checkpoints)


def is_remote(path) -> bool:
    """Whether `path` is a URL (gs://, s3://, ...) rather than a local path."""
    return "://" in str(path)


def _files(root) -> dict[str, object]:
    """{relative path: path} of every file under `root` (an epath.Path; recursion by listing, no `**` glob)."""
    out, todo = {}, [root]
    while todo:
        folder = todo.pop()
        for child in folder.iterdir():
            if child.is_dir():
                todo.append(child)
            else:
                out[str(child)[len(str(root)) + 1 :]] = child
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
        self._pushed: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime_ns) last pushed or pulled

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

    def pull(self) -> int:
        """Copy what the bucket holds and the local copy lacks (or holds at another size); returns files copied."""
        os.makedirs(self.local, exist_ok=True)
        copied = 0
        for rel, path in _files(self.remote).items():
            target = os.path.join(self.local, rel)
            if not os.path.isfile(target) or os.path.getsize(target) != path.stat().length:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                path.copy(target + ".part", overwrite=True)
                os.replace(target + ".part", target)
                copied += 1
            self._pushed[rel] = self._state(target)
        return copied

    def push(self) -> int:
        """Copy every local file that is new or changed since the last push or pull; returns files copied."""
        from etils import epath

        copied = 0
        for folder, _, names in os.walk(self.local):
            for name in names:
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, self.local)
                state = self._state(path)
                if self._pushed.get(rel) == state:
                    continue
                target = self.remote / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                epath.Path(path).copy(target, overwrite=True)
                self._pushed[rel] = state
                copied += 1
        return copied

    @staticmethod
    def _state(path: str) -> tuple[int, int]:
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns


def staged(workdir: str) -> Staging | None:
    """A checked, pulled Staging for a bucket workdir (and the job's active one), or None for a local path."""
    global _active
    if not is_remote(workdir):
        return None
    from replug_jax import distributed

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
