"""The settings of "replug_posterior" checked in a job's first second (`input_checks` calls this where the method
runs; posterior.py holds the method itself)."""
from __future__ import annotations

from replug_jax.errors import InputError


def check_posterior_settings(config) -> None:
    """replug_posterior: α a finite number >= 0, rerank_depth 0 or a whole number >= k, a known ℓ (QA), and (mmlu)
    the options scored by their text, since the letter prompt lists the options between the question and the answer."""
    from replug_jax.posterior import EVIDENCE, EVIDENCES, check_alpha  # jax: imported when the method runs

    try:
        check_alpha(config.get("posterior_alpha", 1.0))
    except ValueError as e:
        raise InputError(f"--config.{e}") from None
    if config.get("posterior_evidence", EVIDENCE) not in EVIDENCES:
        raise InputError(f"--config.posterior_evidence={config.posterior_evidence!r}: one of "
                         f"{', '.join(EVIDENCES)}")
    depth, k = config.get("rerank_depth", 0), config.get("eval_k") or config.k  # the k the job evaluates with
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0 or 0 < depth < k:
        key = "eval_k" if config.get("eval_k") else "k"
        raise InputError(f"--config.rerank_depth={depth!r}: passages scored before keeping {key}={k}: 0 ({key}) or a "
                         f"whole number >= {key}")
    olmes = str(config.get("questions")).startswith("olmes:")
    olmes_mc = olmes and "mc" in config.questions.split(":")[-1].split("_")  # (val_)mc_*: the block lists the options
    if config.job == "mmlu" and (olmes_mc or not olmes and config.get("scoring") != "options"):
        fix = (f"{config.questions} lists the options in the question block, use an rc form" if olmes_mc else
               "set --config.scoring=options (the letter prompt puts the options after the question)")
        raise InputError(f"--config.methods has replug_posterior, which weighs each passage by log p(question | "
                         f"passage): {fix}")


def retrieval_depth(config, method: str) -> int:
    """Passages a downstream job retrieves per question for `method`: k, or for "replug_posterior" its re-ranking
    depth (at least k)."""
    return max(config.k, config.get("rerank_depth", 0) or 0) if method == "replug_posterior" else config.k
