"""SciQ as open-domain QA (offline): the science questions with a support paragraph, answered from a datastore
of every SciQ support paragraph plus gensim's Wikipedia articles as distractor text.

    python -m replug_jax.main --config experiments/configs/sciq.py --workdir runs/sciq \
        --config.lm=qwen2.5-coder-0.5b --config.max_questions=100

Unlike NQ/TriviaQA over the small offline Wikipedia, every question's answer is retrievable here (the
support paragraph of its own question is in the datastore): the setting where REPLUG should beat closed
book. Demos: the first `shots` questions with their top-1 passage, removed from the scored set. Reports
exact match and answer recall@k for none / REPLUG (per-token mixture) / replug_posterior (REPLUG's weights times
the LM's posterior over the top 16, the k = 4 best kept: this config's default beyond the paper) / concat / vote
(the official code's weighted vote over the same passes). `make readers` installs the Qwen2 reader LMs.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "qa.py")
    c.questions = "sciq"
    c.split = "validation"
    c.demo_split = "validation"
    c.corpus = "sciq"
    c.encoder = "minilm"
    c.lm = "qwen2.5-coder-0.5b"
    c.methods = ("none", "replug", "replug_posterior", "concat", "vote")
    # chosen on the dev split for both LMs (SmolLM2, the 0.5B reader; experiments/README.md "REPLUG weights from
    # the LM's posterior"): τ 0.03 is REPLUG's best and, with α 0.5 over the top 16, the posterior's
    c.temperature = 0.03
    c.posterior_alpha = 0.5
    c.rerank_depth = 16
    c.k = 4
    c.shots = 4
    c.max_new_tokens = 10
    c.max_questions = 100
    c.lm_batch_size = 4
    return c
