"""Multiple choice by option text (`scoring = "options"`): acc / acc_per_char / acc_per_token against a hand-built
per-option computation, and the mmlu job run with it end to end."""
import json

import numpy as np
import pytest

from replug_jax.evaluate import mmlu, multiple_choice, option_text
from tests.test_downstream import (MC, MC_PASSAGES, SHOT, SHOT_PASSAGE, RecordingLM, files, log_softmax64,  # noqa: F401
                                   mmlu_config, run_job, tiny_gpt2)


def hand_logliks(lm, prompts, log_weights, questions):
    """[Q][n] Σ_t log Σ_i λ_i p_i(y_t | ..): each (pass, option) scored alone, mixed per token in float64."""
    out = []
    for passes, log_w, q in zip(prompts, log_weights, questions):
        row = []
        for option in q.choices:
            per_pass = np.stack([np.asarray(lm.score([p], [f" {option}"])[0], np.float64) for p in passes])  # [K, T]
            mixed = np.logaddexp.reduce(np.asarray(log_w, np.float64)[:, None] + per_pass, axis=0)  # [T]
            row.append((float(mixed.sum()), per_pass.shape[1]))
        out.append(row)
    return out


@pytest.mark.parametrize("method", ["none", "replug"])
def test_option_metrics_equal_a_hand_computation(tiny_gpt2, method):
    prefix = mmlu.shots_block([SHOT], [SHOT_PASSAGE if method != "none" else None], block=option_text.cloze_block)
    prompts = mmlu.method_prompts(method, MC, MC_PASSAGES, {q.subject: prefix for q in MC},
                                  block=option_text.cloze_block)
    scores = np.array([[0.7, 0.2], [0.1, 0.5], [0.3, 0.3]], np.float32)
    log_w = [option_text.log_lambda(s, len(p), 0.5) for s, p in zip(scores, prompts)]
    if method == "replug":
        np.testing.assert_allclose(log_w[0], log_softmax64(scores[0], 0.5), atol=1e-6)
    got = option_text.option_predictions(tiny_gpt2, prompts, log_w, [option_text.continuations(q) for q in MC])
    want = hand_logliks(tiny_gpt2, prompts, log_w, MC)
    for q, row in enumerate(want):
        ll = np.array([v for v, _ in row])
        np.testing.assert_allclose(got["loglik"][q], ll, atol=1e-4)
        chars = np.array([len(f" {c}") for c in MC[q].choices])
        tokens = np.array([n for _, n in row])
        assert tokens.tolist() == [tiny_gpt2.count_tokens(f" {c}") for c in MC[q].choices]
        assert got["acc"][q] == ll.argmax() and got["acc_per_char"][q] == (ll / chars).argmax()
        assert got["acc_per_token"][q] == (ll / tokens).argmax()
    # the prompt: the question without its options, the shot ending with its correct option's text
    assert prompts[0][0].endswith(f"Question: {MC[0].question}\nAnswer:") and "A. " not in prompts[0][0]
    assert prompts[0][0].startswith(("Knowledge: " if method != "none" else "") + ("" if method != "none" else
                                                                                   "Question: "))
    assert f"Answer: {SHOT.choices[SHOT.answer]}\n\n" in prompts[0][0]
    assert len(prompts[0]) == (2 if method == "replug" else 1)


def test_mmlu_job_scores_option_texts(files, smollm2, tmp_path):  # noqa: F811
    lm = RecordingLM(smollm2)
    results = run_job(mmlu_config(files, scoring="options", option_metric="acc_per_token"), tmp_path, lm)
    saved = json.load(open(tmp_path / "results.json"))
    assert saved["scoring"] == "options" and saved["option_metric"] == "acc_per_token"
    rows = [json.loads(line) for line in open(tmp_path / "predictions.jsonl")]
    for m in ("none", "replug", "concat"):
        for r in rows:
            ll = np.array(r[f"{m}_options"]["loglik"])
            assert r[f"{m}_options"]["acc"] == ll.argmax() and r[m] == r[f"{m}_options"]["acc_per_token"]
        for metric in option_text.OPTION_METRICS:
            correct = [r[f"{m}_options"][metric] == r["answer"] for r in rows]
            assert saved["option_accuracy"][metric][m] == pytest.approx(100 * np.mean(correct))
        assert saved["accuracy"][m]["micro"] == saved["option_accuracy"]["acc_per_token"][m]
    # every score call asks for option texts after prompts that list no options
    for call in lm.score_calls:
        assert all(c.endswith("\nAnswer:") and "\nA. " not in c.split("\n\n")[-1] for c in call["contexts"])
        assert not {" A", " B", " C", " D"} & set(call["continuations"])
    table = open(tmp_path / "results.md").read()
    assert "| method | acc | acc_per_char | acc_per_token |" in table and "acc_per_token decides" in table
    assert results["option_accuracy"] == saved["option_accuracy"]


def test_an_empty_option_metric_is_the_default_one(files, smollm2, tmp_path):  # noqa: F811
    """option_metric "" (the schema's "the file's own" for OLMES) on MMLU's own questions: acc_per_char, as the
    input checks take it, not a refusal after the models have loaded."""
    run_job(mmlu_config(files, scoring="options", option_metric="", methods=("none",)), tmp_path, smollm2)
    assert json.load(open(tmp_path / "results.json"))["option_metric"] == "acc_per_char"


def test_unknown_scoring_is_refused(files, smollm2, tmp_path):  # noqa: F811
    from replug_jax.jobs.input_checks import InputError, check_job_inputs

    with pytest.raises(InputError, match="scoring='letter': must be one of 'letters', 'options'"):  # no model loaded
        check_job_inputs(mmlu_config(files, scoring="letter"))
    with pytest.raises(InputError, match="option_metric='acc_norm': must be one of"):
        check_job_inputs(mmlu_config(files, scoring="options", option_metric="acc_norm"))
    with pytest.raises(ValueError, match=r"questions \[1\] have no passes"):
        option_text.option_predictions(smollm2, [["Q: x\nA:"], []], [np.zeros(1), np.zeros(0)], [[" a"], [" b"]])
    with pytest.raises(ValueError, match="scoring must be one of"):  # the job's own check, past the schema's
        run_job(mmlu_config(files, scoring="letter", methods=("none",)), tmp_path, smollm2)
    with pytest.raises(ValueError, match="option_metric must be one of"):
        run_job(mmlu_config(files, scoring="options", option_metric="acc_norm", methods=("none",)), tmp_path, smollm2)


def test_record_passages_names_the_mixed_passages_by_datastore_id():
    """predictions.jsonl's "<method>_passage_ids": the rows found, best first (-1 rows left out), or for
    replug_posterior the kept positions among them, best posterior first."""
    from replug_jax.retrieval.datastore import Datastore

    store = Datastore([f"d{i}#0" for i in range(5)], [""] * 5, [f"text {i}" for i in range(5)], [f"d{i}" for i in range(5)])
    retrieved = np.array([[3, 1, -1], [0, 4, 2]])
    rows = [{}, {}]
    multiple_choice.record_passages(rows, "replug", store, retrieved)
    assert [r["replug_passage_ids"] for r in rows] == [["d3#0", "d1#0"], ["d0#0", "d4#0", "d2#0"]]
    multiple_choice.record_passages(rows, "replug_posterior", store, retrieved, kept=[[1], [2, 0]])
    assert [r["replug_posterior_passage_ids"] for r in rows] == [["d1#0"], ["d2#0", "d0#0"]]
