"""The paper's Pile language-modelling setting (§6.1, Table 1): bits per byte with REPLUG.

The Pile's own JSONL shards ({"text", "meta"} per line, after `zstd -d`) are read directly:

    python -m replug_jax.main --config experiments/configs/pile_bpb.py --workdir runs/pile \
        --config.corpus=/data/pile/train/00.jsonl --config.eval_data=/data/pile/test.jsonl \
        --config.lm=gpt2 --config.dtype=bfloat16

The paper samples 367M 128-token passages of Pile training data as the datastore and
retrieves with the previous 128 tokens, ensembling the top 10. Report `bits_per_byte`.
"""
from replug_jax.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "lm_eval.py")
    c.encoder = "contriever"
    c.lm = "gpt2"
    c.k = 10
    c.k_sweep = (1, 2, 4, 8, 10)
    c.context_tokens = 768
    c.max_eval_docs = 1_000_000
    c.index_factory = "IVF65536,PQ64"
    c.embedding_dtype = "float16"
    c.lm_batch_size = 32
    c.encoder_batch_size = 256
    c.dtype = "bfloat16"
    return c
