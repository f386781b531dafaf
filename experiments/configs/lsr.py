"""REPLUG LSR on your own data: train the retriever with LM supervision, then evaluate.

    python -m replug_jax.main --config experiments/configs/lsr.py --workdir runs/lsr_mine \
        --config.train_data=/data/train.jsonl --config.corpus=/data/corpus.jsonl \
        --config.eval_data=/data/heldout.jsonl --config.steps=2000 --config.batch_size=16

Training documents must be disjoint from the datastore (checked). results.json reports
"none", "replug" and "replug_lsr" (plus the other methods of lm_eval.py that are listed in
`methods`); metrics.jsonl, TensorBoard events and loss.png land in WORKDIR/lsr.
Killed and restarted with the same workdir, training resumes from the newest checkpoint.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "lm_eval.py")
    c.job = "lsr"
    c.lm_cache = ""  # the training loop caches the LM's scores in WORKDIR/lsr itself (a path: a file runs share)
    c.train_data = ""  # JSONL / .txt of training documents (disjoint from the corpus)
    c.k = 20  # documents retrieved per training query (the paper: top-20)
    c.eval_k = 10  # documents ensembled at evaluation (the paper: top-10)
    c.steps = 25_000
    c.batch_size = 64
    c.learning_rate = 2e-5
    c.warmup_fraction = 0.1
    c.clip_norm = 1.0
    c.gamma = 0.1  # P_R = softmax(s / γ)
    c.beta = 0.02  # Q = softmax(ℓ / β); the paper's 0.1 is for ℓ summed over y (pile_lsr.py)
    c.direction = "q_pr"  # KL(Q ‖ P_R) as Atlas (measured best here); "pr_q" = KL(P_R ‖ Q) as the paper
    c.lm_score = "mean"  # ℓ = mean_t log p(y_t | d ∘ x); "sum" (the paper) makes Q one-hot at β = 0.1
    c.lsr_target = "answer"  # ℓ scores y after d ∘ x (the paper); "question": x after d, log p(x | d) (ART)
    c.train_documents = True  # False: query-side only (document encoder and index frozen, no refresh)
    c.lsr_temperature = 0.0  # τ of REPLUG LSR at evaluation (0: config.temperature); τ = γ is always reported too
    c.refresh_every = 3_000
    c.swap_after = 100  # a refresh is swapped in this many steps after its request (0: synchronous)
    c.train_query_tokens = 128
    c.train_continuation_tokens = 128
    c.max_train_examples = 0  # 0: all
    c.query_max_tokens = 0  # encoder tokens per query / document in the train step (fixed shapes);
    c.doc_max_tokens = 0  # 0: the encoder's own length, which retrieval and the index use
    c.checkpoint_every = 500
    c.keep_checkpoints = 3
    c.log_every = 10
    c.methods = ("replug", "random")
    return c
