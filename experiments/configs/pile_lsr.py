"""REPLUG LSR with the paper's hyperparameters (§5.2): Pile training queries, Contriever init.

    # on each host of a TPU VM slice (multi-host: jax.distributed.initialize(), process 0 logs; several hosts
    # share one file system for the workdir; a one-host VM may use --workdir gs://BUCKET/runs/pile_lsr):
    python -m replug_jax.main --config experiments/configs/pile_lsr.py --workdir /mnt/nfs/runs/pile_lsr \
        --config.train_data=/data/pile/train_queries.jsonl --config.corpus=/data/pile/train_corpus.jsonl \
        --config.eval_data=/data/pile/test.jsonl --config.lm=http://lm-host:8000/v1 --config.lm_tokenizer=gpt2

800K training sequences of 2 × 128 tokens, a 36M-passage datastore disjoint from them, top-20
retrieval, γ = β = 0.1, Adam lr 2e-5 with 10% warmup, batch 64, index refresh every 3k steps,
25k steps. The paper's supervising LM was GPT-3 Curie behind an API: serve a large LM with
`python -m replug_jax.serve` (or any server with prompt log-probabilities) and point `lm` at it.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "lsr.py")
    c.encoder = "contriever"
    c.lm = "gpt2-xl"
    c.k = 20
    c.eval_k = 10
    c.gamma = c.beta = 0.1
    c.lm_score, c.direction = "sum", "pr_q"  # the paper's: ℓ summed over y, KL(P_R ‖ Q)
    c.learning_rate = 2e-5
    c.warmup_fraction = 0.1
    c.batch_size = 64
    c.refresh_every = 3_000
    c.steps = 25_000
    c.max_train_examples = 800_000
    c.windows_file = False  # the Pile's held-out windows: no per-window rows (windows.jsonl)
    c.index_factory = "IVF65536,PQ64"
    c.embedding_dtype = "float16"
    c.context_tokens = 768
    c.encoder_batch_size = 512
    c.lm_batch_size = 64
    c.dtype = "auto"  # bfloat16 on TPU/GPU
    c.multihost = True
    return c
