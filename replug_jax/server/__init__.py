"""The scoring server: `engine` owns the model thread, `completions` answers one request, `app` speaks HTTP;
`python -m replug_jax.serve` runs it.

Layer: imports `models`, `parallel`, `base`; beside `lm` and `retrieval`, which it never imports.
"""
