"""Said, not silent (issue 51): settings and data that make a run cost more or mean less than it looks are warned
about in words that name the key to change: a k sweep beyond k, fewer demos than shots, a held-out text too short
for its perplexity to mean anything, answers that came back empty."""
import logging
import os

import pytest
from ml_collections import config_dict

from replug_jax.jobs.config_files import sibling_config
from replug_jax.data.evaluation_sets import fewer_shots
from replug_jax.data.records import MCExample, QAExample
from replug_jax.evaluate.qa import empty_answers_warning
from replug_jax.evaluate.windows import NOISY_BYTES, Window, small_evaluation
from replug_jax.jobs.window_report import sweep_depth
from replug_jax.models.registry import ModelNotFound

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_k_sweep_beyond_k_says_what_it_scores_and_how_to_stop_it():
    config = lambda **kw: config_dict.ConfigDict({"methods": ("replug", "random", "concat"), **kw})
    said = sweep_depth(config(k=4, k_sweep=(1, 2, 4, 8, 10)))
    assert "--config.k_sweep reaches 10 > k=4: replug and random score their top 10 passages per window (2.5x" in said
    assert "--config.k_sweep=1,2,4 scores only the top 4" in said
    assert sweep_depth(config(k=4, k_sweep=(1, 2, 4))) is None
    assert sweep_depth(config(k=20, eval_k=10, k_sweep=(1, 10))) is None  # LSR: eval_k is what is evaluated
    lsr = sweep_depth(config(k=20, eval_k=2, k_sweep=(1, 8), methods=("replug", "replug_lsr")))
    assert "reaches 8 > k=2: replug and replug_lsr score" in lsr


@pytest.mark.parametrize("job", ["lm_eval", "lsr"])
def test_a_k_sweep_beyond_k_is_said_before_the_models_load(job, tmp_path, caplog):
    """The warning comes as the job starts, a phase line: here the encoder cannot load, and the warning was said
    before that."""
    from replug_jax.jobs.lm_eval import run_lm_eval
    from replug_jax.jobs.lsr import run_lsr

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"id": "d{i}", "text": "Document {i} is short."}}\n' for i in range(4)))
    config = sibling_config(os.path.join(ROOT, "experiments", "configs", f"{job}.py"), f"{job}.py")
    config.update(corpus=str(corpus), eval_data=str(corpus), encoder="/no/such/encoder", lm="/no/such/lm", k=1,
                  k_sweep=(1, 2), methods=("replug",), **({"train_data": str(corpus), "eval_k": 0} if job == "lsr" else {}))
    with caplog.at_level(logging.INFO), pytest.raises(ModelNotFound, match="/no/such/encoder"):  # never loaded
        (run_lm_eval if job == "lm_eval" else run_lsr)(config, str(tmp_path / "w"))
    said = [r.getMessage() for r in caplog.records if "--config.k_sweep reaches 2 > k=1" in r.getMessage()]
    assert said and all(m.startswith("warning: ") for m in said)  # a phase line (console.phase), logged too


def test_fewer_demos_than_shots_is_said_for_qa_and_per_subject():
    qa = [QAExample(str(i), f"q{i}?", ("a",)) for i in range(3)]
    assert fewer_shots("qa", 16, qa, qa[:2], source="d.jsonl") == [
        "--config.shots=16 but 'd.jsonl' gives 2 demo(s): the prompt is 2-shot"]
    assert fewer_shots("qa", 2, qa, qa[:2], source="d.jsonl") == [] and fewer_shots("qa", 0, qa, [], source="x") == []
    mc = lambda i, subject: MCExample(str(i), "q", ("a", "b"), 0, subject)
    asked = [mc(0, "anatomy"), mc(1, "virology"), mc(2, "law")]
    dev = [mc(3, "anatomy"), mc(4, "anatomy"), mc(5, "virology")]  # law has none: warned about apart (zero-shot)
    said = fewer_shots("mmlu", 2, asked, dev, source="mmlu")
    assert said == ["--config.shots=2 but 1 subject(s) have fewer dev examples in 'mmlu' (virology: 1): their "
                    "prompts hold fewer shots"]
    assert fewer_shots("mmlu", 5, asked, [], source="olmes:arc_easy:rc_5shot") == []  # OLMES: the file's own shots


def test_a_short_held_out_text_is_called_noisy():
    window = lambda text: Window("d", "q", "p", text)
    short = [window("word " * 100)] * 3  # 1,500 bytes
    assert "only 1,500 bytes of held-out text are scored (3 windows)" in small_evaluation(short)
    assert small_evaluation([window("x" * NOISY_BYTES)]) is None


def test_empty_answers_name_their_methods_and_the_fix():
    assert empty_answers_warning({"none": 0, "replug": 3}, 10, shots=0) == (
        "empty answers (the LM ended its answer at once): replug 3 of 10; few-shot demos (--config.shots) usually "
        "fix it")
    assert empty_answers_warning({"replug": 0}, 10, shots=2) is None
