"""The scoring server: `engine` owns the model thread, `completions` answers one request, `app` speaks HTTP;
`python -m replug_jax.serve` runs it.

Layer: imports `models`, `parallel`, `base`; beside `lm` and `retrieval`, which it never imports: what it needs of
a local LM is declared in `models/served_model.py` (`ServedModel`), which `lm.local.LocalLM` meets.
"""
