"""The jobs `python -m replug_jax.main` runs: they read configs and call the libraries with plain arguments.

The one-way architecture: jobs -> evaluate, train -> retrieval, lm, models. Only jobs (and main.py)
read configs; `train/` never imports `evaluate/`.
"""
