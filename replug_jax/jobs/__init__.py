"""The jobs `python -m replug_jax.main` runs: they read configs and call the libraries with plain arguments.

The one-way architecture: jobs -> workspace, evaluate, train -> retrieval, lm, models. Only jobs, the
workspace (what every job prepares) and main.py read configs; no job imports another; `train/` never
imports `evaluate/`. `replug_jax.dispatch.run_job` runs the job a config names.
"""

JOBS = ("lm_eval", "lsr", "qa", "mmlu")  # what `config.job` may name
