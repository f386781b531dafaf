"""REPLUG LSR training: the data (`data`), the LM's scores of each batch (`lm_cache`, `batch`), the jitted step
(`step`), the loop with the index refresher (`loop`), checkpoints (`checkpoint`, the only orbax user), metrics.

Layer: imports `data`, `lm`, `retrieval`, `method` and below; never `evaluate` (and `evaluate` never imports it).
"""
