"""REPLUG LSR on Wikitext-103: the retriever trained with GPT-2 supervision, evaluated by perplexity.

    python -m replug_jax.main --config experiments/configs/wikitext103_lsr.py --workdir runs/wt103_lsr \
        --config.train_data=/data/wikitext103/train_queries.jsonl --config.corpus=/data/wikitext103/train.jsonl \
        --config.eval_data=/data/wikitext103/test.jsonl

Split Wikitext-103 train BY ARTICLE into the datastore and the training-query articles
(checked disjoint). Hyperparameters as the paper's §5.2; the LM is GPT-2 XL.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "pile_lsr.py")
    c.lm = "gpt2-xl"
    c.max_train_examples = 0
    c.index_factory = "IVF16384,PQ64"
    return c
