"""REPLUG inside EleutherAI's lm-evaluation-harness (the optional `[harness]` extra): `model.py` the "replug" model,
`queries.py` each request's retrieval query, `offline_tasks.py` harness tasks over installed data, `__main__.py` the
command that registers the model and runs lm-eval's own command line. docs/harness.md says how to run it and what each
number is.

Layer: the top one; imports the REPLUG object (`replug`) and any layer below, and lm-eval, which no other folder
imports (.importlinter).
"""
