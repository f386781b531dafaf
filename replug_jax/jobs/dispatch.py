"""Which job a config names, and running it: what main.py and the experiment scripts call (not a job itself)."""
from __future__ import annotations

from replug_jax.jobs import JOBS  # noqa: F401 (re-exported)


def run_job(config, workdir: str, **options) -> dict:
    """Run the job `config.job` names in `workdir`; options go to the job (the downstream jobs take `lm`)."""
    from replug_jax.jobs.input_checks import check_job_inputs

    check_job_inputs(config)  # in the first second: nothing loaded or embedded yet
    if config.job == "lm_eval":
        from replug_jax.jobs.lm_eval import run_lm_eval as job
    elif config.job == "lsr":
        from replug_jax.jobs.lsr import run_lsr as job
    elif config.job in ("qa", "mmlu"):
        from replug_jax.jobs.downstream import run_downstream as job
    else:
        raise ValueError(f"unknown job {config.job!r} (known: {', '.join(JOBS)})")  # (check_job_inputs says so first)
    return job(config, workdir, **options)
