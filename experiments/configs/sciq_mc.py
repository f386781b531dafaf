"""SciQ as 4-way multiple choice (offline) through the MMLU machinery: options shuffled per question with a
fixed seed, the option-probability mixture of §3.2; datastore as in sciq.py.

    python -m replug_jax.main --config experiments/configs/sciq_mc.py --workdir runs/sciq_mc \
        --config.lm=qwen2.5-coder-0.5b --config.max_questions=100

none (closed book) / REPLUG / concat accuracy; the first `shots` questions are the demos and are not scored.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "sciq.py")
    c.job = "mmlu"
    c.questions = "sciq"
    c.demos = "sciq"
    c.subjects = ()
    c.query_with_options = False
    c.methods = ("none", "replug", "concat")  # replug_posterior (with scoring="options") is not tuned for MC
    c.temperature = 1.0  # sciq.py's 0.03 was chosen for open QA
    c.rerank_depth = 0
    c.max_new_tokens = 1
    c.scoring = "letters"  # "options": each option's text as the continuation (evaluate/option_text.py)
    c.option_metric = "acc_per_char"  # with "options", which decides: "acc", "acc_per_char" or "acc_per_token"
    return c
