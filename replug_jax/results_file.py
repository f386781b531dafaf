"""results.json on disk: what ran, written atomically, and every run's copy kept.

Each job's results carry `run_id` (UTC time and process id) and `config` (every key as the job read it: corpus,
data, LM, encoder, methods, ...). `save` writes WORKDIR/results.json, the latest run, and WORKDIR/history/
results-<run_id>.json, which later runs in the same workdir leave alone.
"""
from __future__ import annotations

import datetime
import json
import os

HISTORY = "history"


def config_record(config) -> dict:
    """The config as plain JSON (ml_collections' best effort: a value JSON cannot hold becomes its text)."""
    return json.loads(config.to_json_best_effort(sort_keys=True))


def new_run_id() -> str:
    """UTC time to the microsecond and the process id: unique per run of a workdir."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ") + f"-{os.getpid()}"


def save(results: dict, workdir: str) -> str:
    """results.json (stamped with a `run_id` if it has none) and its copy under history/; returns the copy's path."""
    from replug_jax.retrieval.datastore import atomic_open

    results.setdefault("run_id", new_run_id())
    text = json.dumps(results, indent=2, sort_keys=True, default=str)
    copy = os.path.join(workdir, HISTORY, f"results-{results['run_id']}.json")
    for path in (copy, os.path.join(workdir, "results.json")):
        with atomic_open(path) as f:
            f.write(text)
    return copy
