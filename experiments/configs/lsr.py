"""REPLUG LSR on your own data: train the retriever with LM supervision, then evaluate.

    python -m replug_jax.main --config experiments/configs/lsr.py --workdir runs/lsr_mine \
        --config.train_data=/data/train.jsonl --config.corpus=/data/corpus.jsonl \
        --config.eval_data=/data/heldout.jsonl --config.steps=2000 --config.batch_size=16

Training documents must be disjoint from the datastore (checked). results.json reports
"none", "replug" and "replug_lsr" (plus the other methods of lm_eval.py that are listed in
`methods`); metrics.jsonl, TensorBoard events and loss.png land in WORKDIR/lsr.
Killed and restarted with the same workdir, training resumes from the newest checkpoint. Each key's range and
meaning: replug_jax/base/settings.py (`--help --config FILE` prints them); the comments here say why a value was chosen.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "lm_eval.py")
    c.job = "lsr"
    c.lm_cache = ""  # the training loop caches the LM's scores in WORKDIR/lsr itself (a path: a file runs share)
    c.train_data = ""
    c.k = 20  # the paper: top-20 per training query
    c.eval_k = 10  # the paper: top-10 at evaluation
    c.steps = 25_000
    c.batch_size = 64
    c.learning_rate = 2e-5
    c.warmup_fraction = 0.1
    c.clip_norm = 1.0
    c.gamma = 0.1
    c.beta = 0.02  # the paper's 0.1 is for ℓ summed over y (pile_lsr.py)
    c.direction = "q_pr"  # Atlas's KL(Q ‖ P_R), measured best here
    c.lm_score = "mean"  # "sum" (the paper) makes Q one-hot at β = 0.1
    c.lsr_target = "answer"  # the paper's
    c.train_documents = True
    c.recompute_activations = False  # True: the train step holds no layer's activations (TPU memory)
    c.lsr_temperature = 0.0  # τ = γ is always reported too
    c.refresh_every = 3_000
    c.swap_after = 100
    c.train_query_tokens = 128
    c.train_continuation_tokens = 128
    c.max_train_examples = 0
    c.query_max_tokens = 0  # fixed shapes in the train step; 0: the length retrieval and the index use
    c.doc_max_tokens = 0
    c.checkpoint_every = 500
    c.keep_checkpoints = 3
    c.log_every = 10
    c.methods = ("replug", "random")
    return c
