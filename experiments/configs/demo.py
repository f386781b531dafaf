"""Offline demo: REPLUG on Wikipedia with the packaged MiniLM retriever and SmolLM2-135M.

    python -m replug_jax.main --config experiments/configs/demo.py --workdir runs/demo

The 106 Wikipedia articles shipped in gensim's test data are split BY ARTICLE into a
retrieval datastore and held-out evaluation articles (and training articles for LSR), so
no held-out passage is in the datastore: REPLUG must not retrieve the text it is scored on.
Scores 6 of the 10 held-out articles, 5 windows each: about 5 minutes on 2 CPU cores, the install included.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "lm_eval.py")
    c.corpus = "gensim_wiki"  # the split is written to WORKDIR/data/*.jsonl
    c.eval_data = "gensim_wiki"
    c.eval_fraction = 0.1
    c.train_fraction = 0.1
    c.k = 4
    c.k_sweep = (1, 2, 4)
    c.max_eval_docs = 6
    c.max_windows_per_doc = 5
    return c
