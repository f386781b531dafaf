"""Offline REPLUG LSR demo: MiniLM retriever trained with SmolLM2 as the supervising LM.

    python -m replug_jax.main --config experiments/configs/demo_lsr.py --workdir runs/demo_lsr

gensim's Wikipedia articles are split by article into datastore (80%), held-out evaluation
(10%) and training (10%) articles: training queries come from articles disjoint from both
the datastore and the evaluation. A short training on 2 CPU cores with one asynchronous
index refresh, then none / REPLUG / REPLUG LSR on the held-out articles.
"""
from replug_jax.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "lsr.py")
    demo = sibling_config(__file__, "demo.py")  # the same data split and evaluation as the REPLUG demo
    for key in ("eval_fraction", "train_fraction", "k", "k_sweep", "max_eval_docs", "max_windows_per_doc"):
        c[key] = demo[key]
    c.corpus = c.eval_data = c.train_data = "gensim_wiki"
    c.eval_k = demo.k
    c.steps = 24
    c.batch_size = 4
    c.learning_rate = 1e-4  # a short run needs a larger step than the paper's 2e-5 over 25k steps
    c.refresh_every = 12
    c.swap_after = 10  # the rebuild (~2 min on 2 cores) runs while steps 13-21 train on the old index
    c.checkpoint_every = 6
    c.log_every = 1
    c.train_query_tokens = 64
    c.train_continuation_tokens = 64
    c.query_max_tokens = 96
    c.doc_max_tokens = 160
    c.methods = ("replug",)
    return c
