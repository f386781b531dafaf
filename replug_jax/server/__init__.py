"""The scoring server: `engine` owns the model thread, `app` speaks HTTP; `python -m replug_jax.serve` runs it."""
