"""The black-box LM: the contract (`blackbox`: log-probabilities of given tokens, ensembled generation), the local JAX
backend (`local`, `local_generate`, `shared_prefix`), the HTTP client (`http/`, no JAX) and scores on disk (`cache`).

Layer: imports `method`, `models`, `parallel`, `base`; never `retrieval`, `data` or anything above.
"""
