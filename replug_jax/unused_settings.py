"""Settings a run was given but none of its methods reads: said, never dropped in silence (a config file may set
them for its default methods, so they are warnings, not errors). The jobs print them in their first seconds and
keep them in results.json's "warnings" and under the table."""
from __future__ import annotations

from replug_jax.input_checks import job_methods

POSTERIOR_KEYS = {"posterior_alpha": 1.0, "rerank_depth": 0, "posterior_evidence": "question"}  # key: its default; replug_posterior alone reads them


def unused_settings(config) -> list[str]:
    """Warnings (not errors: a config file may set them for its default methods) for settings no chosen method
    reads: posterior_alpha / rerank_depth away from their defaults while --config.methods has no replug_posterior,
    a run that would look re-ranked but is plain REPLUG."""
    methods = job_methods(config)
    given = [f"--config.{key}={config.get(key)!r}" for key, default in POSTERIOR_KEYS.items()
             if "replug_posterior" not in methods and config.get(key, default) != default]
    if not given:
        return []
    return [f"{' and '.join(given)} unused: only replug_posterior reads {'them' if len(given) > 1 else 'it'}, and "
            f"--config.methods={','.join(methods)} does not run it"]
