"""REPLUG language-modelling evaluation on your own data (JSONL files of {"text", "title"?, "id"?}).

    python -m replug_jax.main --config experiments/configs/lm_eval.py --workdir runs/mine \
        --config.corpus=/data/corpus.jsonl --config.eval_data=/data/heldout.jsonl \
        --config.encoder=contriever --config.lm=gpt2 --config.k=10

Reports perplexity and bits per byte for: no retrieval, REPLUG (k sweep), random documents,
all documents concatenated, and BM25. Held-out documents never retrieve chunks of their own source.
"""
import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.job = "lm_eval"
    c.corpus = ""  # JSONL {"text", "title"?, "id"?}, a .txt file or folder of them, or tfds:NAME:SPLIT[:TEXT[:TITLE]]
    c.eval_data = ""  # held-out documents to score, in any form corpus takes
    c.encoder = "minilm"  # as rj.load_encoder takes: packaged name, local dir, or hub id
    c.lm = "smollm2"  # as rj.load_lm takes: packaged name, local dir, .gguf path, or hub id
    c.lm_tokenizer = ""  # lm a server URL: its model's tokenizer, by name ("": the server's /tokenize) to cut text
    # lm a server URL: seconds one request may wait for its answer before it is retried, retries before the run
    # fails, requests in flight at once (a loaded 2-core server answers a 16-prompt request in minutes, not seconds)
    c.lm_timeout = 600.0
    c.lm_retries = 5
    c.lm_concurrency = 8
    c.k = 10  # documents ensembled (the reported REPLUG result)
    c.k_sweep = (1, 2, 4, 8, 10)  # also reported; reuses the passes of the largest k
    c.temperature = 1.0  # λ = softmax(s / τ); the paper uses τ = 1 on cosine similarity
    c.bm25_temperature = 1.0  # τ for BM25 scores (appendix D)
    c.windows_file = True  # WORKDIR/windows.jsonl: each window's passages, scores and λ per method (False: none)
    c.temperature_sweep = ()  # other τ values also reported for REPLUG (the same passes, re-weighted)
    c.posterior_alpha = 1.0  # "replug_posterior": λ ∝ exp(s/τ + α log p(window context | document)); 0: REPLUG's λ
    c.rerank_depth = 0  # "replug_posterior": score the context after the top N >= k documents, keep the k best (0: k)
    c.doc_tokens = 128  # datastore chunk length in LM tokens (the paper: 128)
    c.query_tokens = 128  # retrieval query: the previous tokens of the held-out document
    c.context_tokens = 128  # LM context before each continuation
    c.stride_tokens = 128  # tokens scored per window; a document's first has no retrieval (one of at most
    # stride_tokens tokens is scored after its first half, which is the query); a mostly unretrieved run warns
    c.max_eval_docs = 100
    c.max_windows_per_doc = 0  # 0: all windows
    c.methods = ("replug", "random", "concat", "bm25")
    c.metric = "cosine"  # or "ip" (unnormalised inner product, as the official code)
    c.index_factory = "Flat"  # any faiss index_factory string, e.g. "IVF4096,PQ64"
    c.embedding_dtype = "float32"  # or "float16" on disk
    c.lm_batch_size = 4
    c.lm_max_length = 0  # 0: the LM's own window
    c.lm_model_parallel = 1  # devices holding one copy of the LM's weights between them (the "model" mesh axis;
    # more than one host's devices: the mesh spans processes, which then step through the same batches in lockstep)
    c.encoder_batch_size = 32
    c.seed = 0
    c.cache_dir = ""  # where the data split, datastore, embeddings and index live ("": the workdir); runs may share it
    c.lm_cache = "workdir"  # SQLite file of LM scores: a rerun after a failure resumes ("workdir": WORKDIR/lm_cache.sqlite;
    # a path: a file runs share; "": none)
    c.wiki_split = "by_article"  # gensim_wiki only: "related" also puts the opening of held-out articles in the datastore
    c.held_out_fraction = 0.5  # wiki_split="related": the share of each eval/train article that is held out
    c.index_backend = "faiss"  # or "device": exact search on the devices (the corpus embeddings split over them)
    c.device_index_dtype = "float32"  # index_backend="device": the embeddings' dtype on the devices ("bfloat16")
    c.multihost = False  # True on TPU VM hosts: jax.distributed.initialize() finds the other hosts
    c.dtype = "auto"  # compute dtype: "auto" = bfloat16 on TPU/GPU, float32 on CPU; or "float32", "bfloat16"
    c.param_dtype = "auto"  # weights of the LM and the encoder: "auto" = as dtype (LSR trains the retriever in float32)
    return c
