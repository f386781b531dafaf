"""The language-modelling evaluation job: config in, results.json / results.md / plot out.

Re-running with the same workdir reuses the datastore, embeddings and indexes that are
still valid (fingerprints of encoder and datastore are checked on load).
"""
from __future__ import annotations

from replug_jax.jobs import prepare
from replug_jax.jobs.input_checks import read_methods
from replug_jax.jobs.window_report import evaluate_and_report, warn_early


def run_lm_eval(config, workdir: str) -> dict:
    """Build or reuse the retrieval side, score every method, write and print the results."""
    methods = read_methods(config)  # unknown names refused before any work
    warn_early(config)  # a k sweep beyond k, said before the models load
    prepared = prepare.prepare(config, workdir)
    retrievers = prepare.make_retrievers(methods, prepared.encoder, prepared.store, prepared.index,
                                           config.seed)
    return evaluate_and_report(config, workdir, prepared, retrievers)
