"""Offline QA demo: NQ-open and TriviaQA questions answered from gensim's Wikipedia articles, SmolLM2-135M.

    python -m replug_jax.main --config experiments/configs/demo_qa.py --workdir runs/demo_qa

Questions: the validation questions (NQ-open, then TriviaQA) that the packaged corpus can answer: a
Wikipedia article's title occurs in the question and a gold answer occurs in that article
(`data.question_sets.covered_questions`; about 60). The corpus is all 98 gensim articles chunked into
128-token passages (4,866), so the answer is retrievable among thousands of distractors. Demos: the first
`shots` covered questions, each with its own top-1 passage, removed from the scored set (results say how
many). Sized for about 10 minutes on 2 CPU cores (3 of them embedding the corpus; a rerun reuses it).
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "qa.py")
    c.questions = "demo"
    c.corpus = "gensim_wiki"
    c.k = 4
    c.shots = 3
    c.max_new_tokens = 12
    c.lm_batch_size = 8
    return c
