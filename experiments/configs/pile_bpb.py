"""The paper's Pile language-modelling setting (§6.1, Table 1): bits per byte with REPLUG.

The Pile's own JSONL shards ({"text", "meta"} per line, after `zstd -d`) are read directly:

    python -m replug_jax.main --config experiments/configs/pile_bpb.py --workdir runs/pile \
        --config.corpus=/data/pile/train/00.jsonl --config.eval_data=/data/pile/test.jsonl \
        --config.lm=gpt2 --config.dtype=bfloat16

The paper samples 367M 128-token passages of Pile training data as the datastore and
retrieves with the previous 128 tokens, ensembling the top 10. Report `bits_per_byte`.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "wikitext103_gpt2.py")  # the same REPLUG settings: Contriever, top-10, 128-token passages
    c.lm = "gpt2"
    c.max_eval_docs = 1_000_000
    c.index_factory = "IVF65536,PQ64"  # hundreds of millions of passages at the paper's scale
    c.windows_file = False  # millions of held-out windows: no per-window rows (windows.jsonl)
    c.lm_cache = ""  # millions of windows × k passes: no score cache on disk
    return c
