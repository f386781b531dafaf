"""The paper's Wikitext-103 setting (§7.2, Fig. 5): GPT-2 with REPLUG, Contriever, top-10 ensemble.

Needs a network once (hub weights) and the data as JSONL, one article per line
({"id", "title", "text"}), e.g. from the Hugging Face dataset Salesforce/wikitext,
config wikitext-103-raw-v1 (join the lines of each " = Title = " article):

    python -m replug_jax.main --config experiments/configs/wikitext103_gpt2.py --workdir runs/wt103_gpt2 \
        --config.corpus=/data/wikitext103/train.jsonl --config.eval_data=/data/wikitext103/test.jsonl \
        --config.lm=gpt2-xl --config.dtype=bfloat16

GPT-2 sizes: gpt2, gpt2-medium, gpt2-large, gpt2-xl. The datastore is Wikitext-103 train cut
into 128-token passages; queries are the previous 128 tokens; the LM sees up to 1024 tokens
(128 document + 768 context + 128 scored). Contriever's hub repository holds only a pickled
checkpoint, which replug_jax refuses to unpickle: pass a safetensors revision
(--config.encoder=/path/to/contriever-safetensors-dir).
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "lm_eval.py")
    c.encoder = "contriever"
    c.lm = "gpt2-xl"
    c.k = 10
    c.k_sweep = (1, 2, 4, 8, 10)
    c.temperature = 1.0
    c.doc_tokens = 128
    c.query_tokens = 128
    c.context_tokens = 768
    c.stride_tokens = 128
    c.max_eval_docs = 100_000
    c.index_factory = "IVF16384,PQ64"  # ~3.6M passages; use "Flat" on a large-memory host for exact search
    c.embedding_dtype = "float16"
    c.lm_batch_size = 32
    c.encoder_batch_size = 256
    c.dtype = "auto"  # bfloat16 on TPU/GPU
    return c
