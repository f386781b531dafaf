"""REPLUG LSR on question–answer pairs: the LM supervises the retriever on SciQ questions that are not
evaluated, over SciQ's datastore (support paragraphs plus gensim's Wikipedia articles).

    python -m replug_jax.main --config experiments/configs/qa_lsr.py --workdir runs/qa_lsr
    python -m replug_jax.main --config experiments/configs/sciq.py --workdir runs/qa_lsr_eval \
        --config.lm=smollm2 --config.methods=none,replug,concat,replug_lsr --config.retriever_workdir=runs/qa_lsr

x is each question as the QA prompt shows it without demos ("Question: ...\\nAnswer:"), after the passage as
"Knowledge: ...\\n"; y is its gold answer; ℓ_k = Σ_t log p(y_t | d_k ∘ x, y_<t) (`lsr_target="question"`:
ℓ_k = Σ_t log p(x_t | d_k, x_<t), no answers needed). Training takes SciQ's rows from
300 on, past the demos and the evaluated questions of sciq.py (the QA job refuses to evaluate a question the
retriever was trained on); your own `train_data` trains on all its rows unless `train_offset` is set. Query
side only by default: the document encoder and the index stay as they are (no re-embedding).
`experiments/qa_lsr.py` runs training and both evaluations (τ = 1 and τ = γ) and writes the table; the
settings are the ones its table in experiments/README.md used.
"""
from ml_collections import config_dict

from replug_jax.jobs.config_files import sibling_config

LSR_KEYS = ("learning_rate", "warmup_fraction", "clip_norm", "direction", "swap_after", "query_max_tokens",
            "doc_max_tokens", "keep_checkpoints", "lsr_temperature", "max_train_examples", "recompute_activations",
            "methods")  # the LSR job's own (the QA job's, sciq.py's, hold "vote", which it does not run)


def get_config():
    c = sibling_config(__file__, "sciq.py")  # the evaluated setting: corpus, encoder, datastore cut
    lsr = sibling_config(__file__, "lsr.py")
    for key in LSR_KEYS:
        c[key] = lsr[key]
    c.job = "lsr"
    c.lm = "smollm2"
    c.train_data = "sciq"  # or "nq_open", "trivia_qa", a JSONL of {"question", "answers"}
    c.train_split = "validation"
    c.train_offset = config_dict.placeholder(int)  # rows of train_data skipped (None: 300 for "sciq", whose first
    # rows sciq.py evaluates from row 4 on; 0 for any other train_data)
    c.k = 8  # passages scored per training question (the QA evaluation mixes the top 4)
    c.steps = 40
    c.batch_size = 8
    c.learning_rate = 1e-4  # a short run needs a larger step than the paper's 2e-5 over 25k steps
    c.gamma = 0.1  # P_R = softmax(s / γ)
    c.beta = 1.0  # Q = softmax(ℓ / β): ℓ sums a few answer tokens, whole nats apart between passages
    c.lm_score = "sum"  # ℓ = Σ_t log p(y_t | d ∘ x, y_<t), the paper's
    c.lsr_target = "answer"  # "question": ℓ = Σ_t log p(x_t | d, x_<t), the question block's own likelihood after
    # the passage (ART); needs no answers: train_data may then be a JSONL of {"question"} rows alone
    c.direction = "q_pr"  # KL(Q ‖ P_R) as Atlas; "pr_q" = KL(P_R ‖ Q) as the paper
    c.train_documents = False  # query side only: no refresh; True retrains both sides with refreshes
    c.refresh_every = 1_000
    c.swap_after = 0
    c.checkpoint_every = 20
    c.log_every = 1
    c.lm_cache = ""  # a shared LM-score cache file ("": the LSR loop's own cache in WORKDIR/lsr only)
    return c
