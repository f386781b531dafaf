"""REPLUG language-modelling evaluation on your own data (JSONL files of {"text", "title"?, "id"?}).

    python -m replug_jax.main --config experiments/configs/lm_eval.py --workdir runs/mine \
        --config.corpus=/data/corpus.jsonl --config.eval_data=/data/heldout.jsonl \
        --config.encoder=contriever --config.lm=gpt2 --config.k=10

Reports perplexity and bits per byte for: no retrieval, REPLUG (k sweep), random documents,
all documents concatenated, and BM25. Held-out documents never retrieve chunks of their own source.
Each key's range and meaning: replug_jax/base/settings.py (`--help --config FILE` prints them); the comments
here say why a value was chosen.
"""
import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.job = "lm_eval"
    c.corpus = ""
    c.eval_data = ""
    c.encoder = "minilm"
    c.lm = "smollm2"
    c.lm_tokenizer = ""
    # the HTTP client's defaults survive a loaded 2-core server, which answers a 16-prompt request in minutes
    c.lm_timeout = 600.0
    c.lm_retries = 5
    c.lm_concurrency = 8
    c.k = 10  # the reported REPLUG result
    c.k_sweep = (1, 2, 4, 8, 10)
    c.temperature = 1.0  # the paper's τ on cosine similarity
    c.bm25_temperature = 1.0  # appendix D
    c.windows_file = True
    c.temperature_sweep = ()
    c.posterior_alpha = 1.0
    c.rerank_depth = 0
    c.doc_tokens = 128  # the paper's
    c.drop_empty_documents = False  # a document without text is refused: a user's row never vanishes unsaid
    c.query_tokens = 128
    c.context_tokens = 128
    c.stride_tokens = 128  # a document's first window has no retrieval (its first half is the query); a mostly
    # unretrieved run warns
    c.max_eval_docs = 100
    c.max_windows_per_doc = 0
    c.methods = ("replug", "random", "concat", "bm25")
    c.metric = "cosine"  # "ip": the official code's unnormalised inner product
    c.index_factory = "Flat"  # any faiss index_factory string, e.g. "IVF4096,PQ64"
    c.embedding_dtype = "float32"
    c.lm_batch_size = 4
    c.lm_max_length = 0
    c.lm_model_parallel = 1  # more than one host's devices: the mesh spans processes, which step in lockstep
    c.encoder_batch_size = 32
    c.seed = 0
    c.cache_dir = ""
    c.lm_cache = "workdir"  # a path: a file runs share; several processes: one file each
    c.wiki_split = "by_article"
    c.held_out_fraction = 0.5
    c.index_backend = "faiss"
    c.device_index_dtype = "float32"
    c.multihost = False
    c.dtype = "auto"
    c.param_dtype = "auto"
    return c
