"""OLMES's request files as tasks: read as the files say, closed-book log-likelihoods equal to transformers' forward
pass of the same GGUF, and the mmlu job running them (closed book on the exact requests, REPLUG's passages
prepended to each request's context)."""
import gzip
import json
import os

import numpy as np
import pytest
import torch

from replug_jax.data import olmes
from replug_jax.evaluate import option_text
from tests.test_downstream import RecordingLM, files, mmlu_config, run_job  # noqa: F401


def raw_requests(task, form):
    with gzip.open(os.path.join(olmes.task_dir(task, form), "requests.jsonl.gz"), "rt") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("task", olmes.OLMES_TASKS)
@pytest.mark.parametrize("form", ["rc_5shot", "mc_5shot", "rc_0shot"])
def test_requests_are_read_as_the_files_say(task, form):
    questions, info = olmes.load_olmes(task, form)
    assert len(questions) == info["num_instances"] > 0 and info["split"] == "validation"
    assert info["num_shots"] == (0 if form == "rc_0shot" else 5)
    raw = [r for r in raw_requests(task, form) if r["doc_id"] < olmes.UNCONDITIONED_DOC_IDS]
    first = [r for r in raw if r["doc_id"] == raw[0]["doc_id"]]
    q = questions[0]
    assert q.context == first[0]["request"]["context"] and q.answer == first[0]["label"]
    assert list(q.continuations) == [r["request"]["continuation"] for r in sorted(first, key=lambda r: r["idx"])]
    assert sum(len(x.continuations) for x in questions) == len(raw)
    for x in questions:
        assert 0 <= x.answer < len(x.continuations) and x.context.endswith("Answer:")
        assert x.question and not x.question.startswith("Question:") and x.question in x.context
        if form.startswith("mc"):
            assert [c.strip() for c in x.continuations] == ["A", "B", "C", "D", "E"][: len(x.continuations)]
    assert info["primary_metric"] in option_text.OPTION_METRICS


def test_bad_olmes_sources_are_refused():
    with pytest.raises(ValueError, match="forms of arc_easy: .*rc_5shot"):
        olmes.load_olmes("arc_easy", "rc_9shot")
    with pytest.raises(ValueError, match="olmes:<task>:<form>"):
        olmes.parse_source("olmes:arc_easy")
    assert olmes.parse_source("sciq") is None


@pytest.mark.slow  # SmolLM2 against transformers: test_real_weights.py
def test_closed_book_loglikelihoods_equal_transformers(smollm2, torch_smollm2):
    """A handful of ARC-Easy and OpenBookQA requests (5-shot rc and mc: one question's options each): our
    log p(continuation | context) equal transformers' forward pass of the same GGUF on the same token ids, and those
    ids are its tokenizer's."""
    model, ref_tok = torch_smollm2
    pairs = []
    for task, form in (("arc_easy", "rc_5shot"), ("openbookqa", "mc_5shot")):
        for q in olmes.load_olmes(task, form)[0][:1]:
            pairs += [(q.context, c) for c in q.continuations]
    ours = smollm2.score([c for c, _ in pairs], [y for _, y in pairs])
    for (context, continuation), got in zip(pairs, ours):
        ctx_ids, cont_ids = smollm2.pair_tokens(context, continuation)
        assert ctx_ids == ref_tok(context, add_special_tokens=False).input_ids
        assert cont_ids == ref_tok(continuation, add_special_tokens=False).input_ids
        ids = ctx_ids + cont_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        ref = torch.log_softmax(logits[len(ctx_ids) - 1 : -1], -1).gather(-1, torch.tensor(cont_ids)[:, None])[:, 0]
        assert got.shape == (len(cont_ids),)
        np.testing.assert_allclose(got, ref.numpy(), atol=2e-3)


def test_job_runs_olmes_requests(files, smollm2, tmp_path):  # noqa: F811
    lm = RecordingLM(smollm2)
    config = mmlu_config(files, questions="olmes:arc_challenge:rc_5shot", demos="", max_questions=2, option_metric="")
    results = run_job(config, tmp_path, lm)
    questions = olmes.load_olmes("arc_challenge", "rc_5shot")[0][:2]
    saved = json.load(open(tmp_path / "results.json"))
    assert saved["shots"] == 5 and saved["olmes"]["task_name"] == "arc_challenge" and saved["count"] == 2
    assert saved["option_metric"] == "acc_per_char" == saved["olmes"]["primary_metric"]
    none, replug, concat = lm.score_calls
    # closed book: every request exactly as the file gives it
    assert list(zip(none["contexts"], none["continuations"])) == [(q.context, c) for q in questions
                                                                   for c in q.continuations]
    # REPLUG: per option, each of the k = 2 passages before the request's own context
    assert len(replug["contexts"]) == sum(2 * len(q.continuations) for q in questions)
    for context in replug["contexts"] + concat["contexts"]:
        passage, _, rest = context.partition("\n\n")
        assert any(rest == q.context for q in questions) and passage and passage not in rest
    rows = [json.loads(line) for line in open(tmp_path / "predictions.jsonl")]
    for r in rows:  # each method that retrieved names the passages it mixed
        assert "none_passage_ids" not in r and len(r["replug_passage_ids"]) == 2 == len(r["concat_passage_ids"])
    for r, q in zip(rows, questions):
        ll = np.array(r["none_options"]["loglik"])
        chars = np.array([len(c) for c in q.continuations])
        assert r["none"] == (ll / chars).argmax() and r["answer"] == q.answer
        flat = [float(np.sum(x)) for x in none["out"][: len(q.continuations)]] if q is questions[0] else None
        if flat:
            np.testing.assert_allclose(ll, flat, atol=1e-4)  # one pass of weight 1: the request's own log-likelihood
    assert results["option_accuracy"] == saved["option_accuracy"]
    assert "arc_challenge" in open(tmp_path / "results.md").read()
