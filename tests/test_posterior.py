"""REPLUG weighted by the LM's posterior over passages (replug_jax/method/posterior.py, evaluate/qa_posterior.py, the
contract's `score_with_query`): the weights against a float64 hand computation from the LM's own log-probs, one
pass per passage (counted), α = 0 is REPLUG through the whole QA job, the cache and re-ranking."""
import json
import os

import numpy as np
import pytest

from replug_jax.method import mixture, posterior
from replug_jax.data.records import MCExample, QAExample
from replug_jax.evaluate import mmlu, multiple_choice, option_text, qa_posterior
from replug_jax.lm.blackbox import query_token_count
from replug_jax.lm.cache import CachedLM
from replug_jax.method.passages import QA_DOC_TEMPLATE, question_block

from tests.test_downstream import RecordingLM, files, qa_config, run_job  # noqa: F401 (files: a fixture)

PASSAGES = [["Velmora is a town in the hills. Its mayor is Tobias Grint.", "The river Oster flows through Karsk.",
             "Karsk is known for its glassworks."],
            ["The river Oster flows through Karsk.", "Velmora is a town in the hills. Its mayor is Tobias Grint.",
             "Karsk is known for its glassworks."]]
QUESTIONS = [QAExample("q0", "Who is the mayor of Velmora?", ("Tobias Grint",)),
             QAExample("q1", "Which river flows through Karsk?", ("the Oster", "Oster"))]
SCORES = np.array([[0.52, 0.31, 0.30], [0.48, 0.40, 0.12]], np.float32)


def hand_posterior(lm, tau, alpha, k):
    """Per question: (kept positions, log λ renormalised over them, answer NLL) in float64 from separate
    `lm.score` calls: log p(x | d) = Σ score(doc, question block); the answer's per-pass scores after doc ∘ x."""
    out = []
    for q, ps, s in zip(QUESTIONS, PASSAGES, SCORES):
        docs = [QA_DOC_TEMPLATE.format(passage=p) for p in ps]
        x = question_block(q.question, None)
        ll = np.array([np.sum(v, dtype=np.float64) for v in lm.score(docs, [x] * len(docs))])
        z = s.astype(np.float64) / tau + alpha * ll
        kept = np.argsort(-z, kind="stable")[:k]
        log_w = z[kept] - np.logaddexp.reduce(z[kept])
        best = -np.inf
        for a in q.answers:
            per_pass = [np.asarray(v, np.float64) for v in lm.score([docs[j] + x for j in kept], [f" {a}"] * k)]
            best = max(best, np.sum(np.logaddexp.reduce(log_w[:, None] + np.stack(per_pass), axis=0)))
        out.append((kept, log_w, -best))
    return out


@pytest.mark.parametrize("alpha,k", [pytest.param(1.0, 2, marks=pytest.mark.slow), (0.5, 3)])
def test_posterior_weights_equal_a_float64_hand_computation(smollm2, alpha, k):
    got = qa_posterior.posterior_passes(smollm2, QUESTIONS, PASSAGES, SCORES, temperature=0.1, alpha=alpha, k=k)
    for i, (kept, log_w, nll) in enumerate(hand_posterior(smollm2, 0.1, alpha, k)):
        assert list(got.kept[i]) == list(kept)
        np.testing.assert_allclose(got.log_weights[i], log_w, atol=2e-5)
        assert got.answer_nll[i] == pytest.approx(nll, abs=2e-4)
        assert got.contexts[i] == [question_block(QUESTIONS[i].question, PASSAGES[i][j]) for j in kept]
    # the LM knows which passage answers: its passage gets most of the weight, whatever the retriever's rank
    assert PASSAGES[0][got.kept[0][0]].startswith("Velmora") and np.exp(got.log_weights[0][0]) > 0.9
    assert PASSAGES[1][got.kept[1][0]].startswith("The river Oster")


def test_the_question_is_scored_in_the_pass_that_scores_the_answer(smollm2, monkeypatch):
    """score_with_query: one forward row per passage, exactly REPLUG's tokens `tokens(d ∘ x) + tokens(y)`, the
    question's tokens those from its first character on (also after "\n\n", where tokenising x apart would merge
    the two newlines into one token); its two parts equal separate scores of the same ids."""
    rows = []
    inner = smollm2.score_token_pairs
    monkeypatch.setattr(smollm2, "score_token_pairs",
                        lambda pairs, progress=False, **kw: rows.append(pairs) or inner(pairs, **kw))
    docs = [QA_DOC_TEMPLATE.format(passage=p) for p in PASSAGES[0]] + ["Karsk is known for its glassworks.\n\n"]
    x = question_block(QUESTIONS[0].question, None)
    got = smollm2.score_with_query(docs, [x] * 4, [" Tobias Grint"] * 4)
    assert len(rows) == 1 and len(rows[0]) == 4  # one call, one row per passage
    tok = smollm2.tokenizer
    assert tok.encode(docs[3]) + tok.encode(x) != tok.encode(docs[3] + x)  # the case the offsets are for
    for (ctx, scored), d in zip(rows[0], docs):
        assert ctx + scored == tok.encode(d + x) + tok.encode(" Tobias Grint")  # the very tokens of REPLUG's pass
        n_query = len(scored) - len(tok.encode(" Tobias Grint"))
        assert tok.decode(scored[:n_query]) == x and tok.decode(ctx) == d
    monkeypatch.undo()
    for (q_lps, a_lps), d in zip(got, docs):
        joint = tok.encode(d + x)
        n_ctx = len(tok.encode(d + x)) - len(q_lps)
        # the same tokens in passes of other lengths and batches: float32 differs by ~3e-5 on this CPU
        np.testing.assert_allclose(q_lps, smollm2.score_token_pairs([(joint[:n_ctx], joint[n_ctx:])])[0], atol=1e-4)
        np.testing.assert_allclose(a_lps, smollm2.score([d + x], [" Tobias Grint"])[0], atol=1e-4)
    q_only = smollm2.score_with_query(docs[:1], [x], [""])[0]  # no continuation: the question alone
    assert q_only[1].shape == (0,) and np.allclose(q_only[0], got[0][0], atol=1e-4)
    with pytest.raises(ValueError, match="queries \\[0\\] are empty"):
        smollm2.score_with_query(docs[:1], [""], [" a"])


def test_score_with_query_through_the_cache(smollm2, tmp_path):
    cached = CachedLM(smollm2, str(tmp_path / "c.sqlite"))
    docs, x = ["Knowledge: Karsk.\n", "Knowledge: Velmora.\n"], "Question: Where?\nAnswer:"
    first = cached.score_with_query(docs, [x, x], [" Karsk", " Velmora"])
    again = cached.score_with_query(docs, [x, x], [" Karsk", " Velmora"])
    assert cached.misses == 2 and cached.hits == 2
    for (a, b), (c, d), (e, f) in zip(first, again, smollm2.score_with_query(docs, [x, x], [" Karsk", " Velmora"])):
        assert np.array_equal(a, c) and np.array_equal(b, d) and np.allclose(a, e, atol=1e-6)
    assert cached.score([docs[0]], [x])[0].shape == first[0][0].shape and cached.misses == 3  # another key


DEMOS = question_block("Which town has glassworks?", "Karsk is known for its glassworks.", "Karsk")


class ScoringRoute:
    """The real LM behind the black-box contract alone (no `weights_at_prefill`): `posterior.generate`'s route for
    HTTP servers, which scores x with `score_with_query` and then generates."""

    def __init__(self, lm):
        self.score_with_query, self.generate = lm.score_with_query, lm.generate


def prefill_hand_weights(lm, contexts, queries, retrieval, alpha, keep):
    """Per question: (log p(x | demos ∘ d) [K], log λ [K] with -inf for the dropped) in float64 from `score_token_pairs`
    of each pass's very generation tokens: the demos' ids, then the pass context's, x its last tokens."""
    tok, out = lm.tokenizer, []
    for ctx, x, base in zip(contexts, queries, retrieval):
        ll = []
        for c in ctx:
            ids, n = tok.encode(c), query_token_count(tok, c, x)
            assert tok.decode(ids[-n:]) == x
            ll.append(np.sum(lm.score_token_pairs([(tok.encode(DEMOS) + ids[:-n], ids[-n:])])[0], dtype=np.float64))
        z = np.asarray(base, np.float64) + alpha * np.array(ll)
        kept = np.argsort(-z, kind="stable")[:keep]
        log_w = np.full(len(ctx), -np.inf)
        log_w[kept] = z[kept] - np.logaddexp.reduce(z[kept])
        out.append((np.array(ll), log_w))
    return out


def test_generation_fixes_the_posterior_weights_at_its_own_prefill(smollm2, monkeypatch, keep=2):
    """posterior.generate on a LocalLM reads log p(x | demos ∘ d) in the generation's own prefill (no scoring call,
    one generate call), equal to a float64 hand computation from the very tokens of each pass; the k best kept;
    the answers are the kept passes decoded with those weights; the score_with_query route (HTTP's) agrees."""
    contexts = [[question_block(q.question, p) for p in ps] for q, ps in zip(QUESTIONS, PASSAGES)]
    queries = [question_block(q.question, None) for q in QUESTIONS]
    retrieval = list(np.asarray(mixture.log_weights_jax(SCORES, np.ones(SCORES.shape, bool), 0.1)))  # [2][3]
    generate_calls = []
    inner_generate = smollm2.generate
    monkeypatch.setattr(smollm2, "generate", lambda *a, **kw: generate_calls.append(1) or inner_generate(*a, **kw))
    for name in ("score", "score_token_pairs", "score_with_query"):
        monkeypatch.setattr(smollm2, name, lambda *a, **kw: pytest.fail("a scoring pass beside the generation's"))
    gens = posterior.generate(smollm2, contexts, queries, retrieval, alpha=0.5, keep=keep, max_new_tokens=6,
                              shared_prefix=DEMOS)
    monkeypatch.undo()
    assert len(generate_calls) == 1
    routed = posterior.generate(ScoringRoute(smollm2), contexts, queries, retrieval, alpha=0.5, keep=keep,
                                max_new_tokens=6, shared_prefix=DEMOS)
    for b, (ll, log_w) in enumerate(prefill_hand_weights(smollm2, contexts, queries, retrieval, 0.5, keep)):
        for g in (gens[b], routed[b]):  # passes of other shapes: float32 differs by ~3e-5 a token on this CPU
            np.testing.assert_allclose(g.query_logliks, ll, atol=1e-3)
            np.testing.assert_allclose(g.log_weights, log_w, atol=1e-3)
        kept = np.flatnonzero(np.isfinite(log_w))
        want = smollm2.generate([[contexts[b][j] for j in kept]], [log_w[kept]], max_new_tokens=6,
                                shared_prefix=DEMOS)[0]
        assert gens[b].text == routed[b].text == want.text and want.text.strip()
    assert np.isfinite(gens[0].log_weights).sum() == keep
    assert PASSAGES[0][int(np.argmax(gens[0].log_weights))].startswith("Velmora")  # the LM's pick, not rank 0's
    with pytest.raises(ValueError, match="does not end with its query"):
        posterior.generate(smollm2, contexts, ["Question: another?"] * 2, retrieval, alpha=0.5, keep=2,
                           max_new_tokens=2)


def test_qa_rows_without_answers_come_from_the_generations_prefill(smollm2, monkeypatch):
    """The QA method with ℓ after the demos (`evidence="demos"`) and without answer NLL: the rows' kept ranks,
    weights and question log-likelihoods are the prefill's, the answer its decoding, with no scoring pass."""
    for name in ("score", "score_token_pairs", "score_with_query"):
        monkeypatch.setattr(smollm2, name, lambda *a, **kw: pytest.fail("a scoring pass beside the generation's"))
    rows, kept_passages = qa_posterior.predict(smollm2, QUESTIONS, PASSAGES, SCORES, demo_prefix=DEMOS, k=2,
                                               temperature=0.1, alpha=0.5, ensemble="replug", max_new_tokens=6,
                                               with_answers=False, evidence="demos")
    monkeypatch.undo()
    contexts = [[question_block(q.question, p) for p in ps] for q, ps in zip(QUESTIONS, PASSAGES)]
    retrieval = list(np.asarray(mixture.log_weights_jax(SCORES, np.ones(SCORES.shape, bool), 0.1)))
    hand = prefill_hand_weights(smollm2, contexts, [question_block(q.question, None) for q in QUESTIONS],
                                retrieval, 0.5, 2)
    for row, passages, ps, (ll, log_w) in zip(rows, kept_passages, PASSAGES, hand):
        kept = np.argsort(-log_w, kind="stable")[:2]
        assert row["kept_ranks"] == kept.tolist() and passages == [ps[j] for j in kept]
        np.testing.assert_allclose(row["log_weights"], log_w[kept], atol=1e-3)
        np.testing.assert_allclose(row["question_logliks"], ll[kept], atol=1e-3)
        assert "answer_nll" not in row and row["prediction"]


def test_rerank_keeps_the_highest_weights_and_renormalises():
    with np.errstate(divide="ignore"):  # 0.0: a missing passage (-inf)
        log_w = np.log(np.array([[0.1, 0.6, 0.3, 0.0], [0.25, 0.25, 0.5, 0.0]]))
    order, kept = posterior.rerank(log_w, 2)
    assert order.tolist() == [[1, 2], [2, 0]]  # ties: the retriever's order
    np.testing.assert_allclose(np.exp(kept), [[2 / 3, 1 / 3], [2 / 3, 1 / 3]], atol=1e-6)
    order, kept = posterior.rerank(np.array([[0.0, -np.inf, -np.inf]]), 2)
    assert order.tolist() == [[0, -1]] and kept[0, 0] == 0 and kept[0, 1] == -np.inf
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="posterior_alpha"):
            posterior.posterior_log_weights(SCORES, SCORES > 0, SCORES, 0.1, bad)


@pytest.mark.slow  # α 0 is REPLUG through the multiple-choice job below (core); this is the QA job's second check
def test_alpha_zero_is_replug_through_the_qa_job(files, smollm2, tmp_path):  # noqa: F811
    """α = 0, depth = k: the same passages, weights, answer NLL and predictions as REPLUG, from as many passes of
    as many tokens; the settings are in results.json."""
    lm = RecordingLM(smollm2)
    demos = tmp_path / "demos.jsonl"  # two demos for 16 shots: results say 2 (issue 38 item 5)
    demos.write_text("".join(json.dumps({"question": q, "answers": [a]}) + "\n" for q, a in
                             [("What is made in Karsk?", "glass"), ("Where is Velmora?", "in the hills")]))
    config = qa_config(files, methods=("replug", "replug_posterior"), posterior_alpha=0.0, temperature=0.1,
                       rerank_depth=0, demos=str(demos), shots=16, lm_cache=str(tmp_path / "lm.sqlite"))
    results = run_job(config, tmp_path / "run", lm)
    assert results["answer_nll"]["replug_posterior"] == pytest.approx(results["answer_nll"]["replug"], abs=1e-4)
    assert results["exact_match"]["replug_posterior"] == results["exact_match"]["replug"]
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "run", "predictions.jsonl"))]
    assert [r["replug_posterior"]["prediction"] for r in rows] == [r["replug"]["prediction"] for r in rows]
    replug_gen, posterior_gen = lm.generate_calls
    assert posterior_gen["contexts"] == replug_gen["contexts"]
    for a, b in zip(posterior_gen["log_weights"], replug_gen["log_weights"]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # the answer NLL: REPLUG's scoring call; the posterior's NLL scores the same passes (all from the LM cache). ℓ:
    # log p(x | d) from zero-shot passes of REPLUG's own text (passage, question block), one scoring call
    (replug_scored,), (posterior_scored,) = lm.score_calls, lm.query_calls
    assert posterior_scored["prefix"] == ""
    ell_passes = [c + q for c, q in zip(posterior_scored["contexts"], posterior_scored["queries"])]
    assert len(ell_passes) == len(set(ell_passes)) and set(ell_passes) == set(replug_scored["contexts"])
    assert set(posterior_scored["continuations"]) == {""}
    saved = json.load(open(os.path.join(tmp_path, "run", "results.json")))
    assert saved["posterior_alpha"] == 0.0 and saved["rerank_depth"] == config.k
    assert saved["shots"] == 2 and saved["methods"] == ["replug", "replug_posterior"]  # what ran
    assert saved["lm_requests"]["cache_misses"] == sum(len(c["contexts"]) for c in lm.score_calls + lm.query_calls)
    assert saved["config"]["demos"] == str(demos) and saved["config"]["corpus"] == files["corpus"]
    assert saved["config"]["methods"] == ["replug", "replug_posterior"] and saved["config"]["lm"] == "smollm2"
    history = os.listdir(os.path.join(tmp_path, "run", "history"))
    assert history == [f"results-{saved['run_id']}.json"]
    assert all(len(r["replug_posterior"]["question_logliks"]) == config.k for r in rows)


MC = [MCExample("m0", "Who is the mayor of Velmora?", ("Tobias Grint", "Karsk", "the Oster"), 0, "demo"),
      MCExample("m1", "Which river flows through Karsk?", ("Tobias Grint", "the Oster", "glass"), 1, "demo")]
MC_PREFIX = {"demo": "Question: What is made in Karsk?\nAnswer: glass\n\n"}


def _replug_option_logliks(lm, prompts, k):
    log_w = [option_text.log_lambda(s, k, 0.1) for s in SCORES]
    return option_text.option_predictions(lm, prompts, log_w, [option_text.continuations(q) for q in MC])["loglik"]


def test_multiple_choice_posterior_at_alpha_zero_is_replug_and_weighs_by_the_question(smollm2):
    """Option texts (sciq_mc's scoring) and OLMES's prepended passages: α = 0 over the same passages gives REPLUG's
    option log-likelihoods (the passes' tokens are REPLUG's, "\\n\\n" boundary included); α = 1 weighs by
    log p(question block | passage) as a float64 computation from the same rows does."""
    conts = [option_text.continuations(q) for q in MC]
    docs, blocks = option_text.cloze_passes(MC, PASSAGES, MC_PREFIX)
    prompts = mmlu.method_prompts("replug", MC, PASSAGES, MC_PREFIX, block=option_text.cloze_block)
    assert [[d + b for d in ds] for ds, b in zip(docs, blocks)] == prompts  # the job's prompts, split where x begins
    olmes_docs = [[multiple_choice.PASSAGE_BEFORE_CONTEXT.format(passage=p) for p in ps] for ps in PASSAGES]
    olmes_prompts = multiple_choice.prepended_prompts("replug", blocks, PASSAGES)
    for d, b, p in ((docs, blocks, prompts), (olmes_docs, blocks, olmes_prompts)):
        got = option_text.posterior_option_predictions(smollm2, d, b, SCORES, conts, temperature=0.1, alpha=0.0, k=3)
        np.testing.assert_allclose(got["loglik"], _replug_option_logliks(smollm2, p, 3), atol=2e-4)
    got = option_text.posterior_option_predictions(smollm2, docs, blocks, SCORES, conts, temperature=0.1, alpha=1.0,
                                                   k=2)
    for i, (ds, b) in enumerate(zip(docs, blocks)):
        ll = np.array([np.sum(v, dtype=np.float64) for v in smollm2.score(ds, [b] * len(ds))])
        z = SCORES[i].astype(np.float64) / 0.1 + ll
        kept = np.argsort(-z, kind="stable")[:2]
        assert got["kept"][i] == list(kept)
        np.testing.assert_allclose(got["log_weights"][i], z[kept] - np.logaddexp.reduce(z[kept]), atol=2e-5)
    assert [PASSAGES[i][got["kept"][i][0]][:9] for i in range(2)] == ["Velmora i", "The river"]  # the answering one


def test_accuracy_tables_of_finished_runs_equal_a_hand_count(tmp_path, monkeypatch):
    """experiments/posterior_tables.py: accuracy per row from each run's predictions.jsonl and the bootstrap
    interval of the per-question difference against the baseline row, the LM, τ, α and depth from its results.json
    (an LSR row's target from its retriever's); runs over other questions or of another LM, and labels naming
    settings other than the run's, are refused."""
    import importlib.util

    experiments = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")
    monkeypatch.syspath_prepend(experiments)
    spec = importlib.util.spec_from_file_location("posterior_tables", os.path.join(experiments, "posterior_tables.py"))
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    gold = [0, 1, 2, 3, 0, 1]
    runs = {"a": {"replug": [0, 1, 0, 0, 0, 0], "none": [1, 1, 1, 1, 1, 1]}, "b": {"replug_posterior": gold}}
    configs = {"a": {"lm": "smollm2", "k": 4, "temperature": 0.1, "posterior_alpha": 0.5, "rerank_depth": 0},
               "b": {"lm": "smollm2", "k": 4, "temperature": 0.1, "posterior_alpha": 1.0, "rerank_depth": 16}}
    for name, methods in runs.items():
        os.makedirs(tmp_path / name)
        with open(tmp_path / name / "results.json", "w") as f:
            json.dump({"config": configs[name]}, f)
        with open(tmp_path / name / "predictions.jsonl", "w") as f:
            for i, g in enumerate(gold):
                f.write(json.dumps({"id": f"q{i}", "answer": g, **{m: p[i] for m, p in methods.items()}}) + "\n")
    out = tmp_path / "table.md"
    numbers = tables.main(["--out", str(out), "--baseline", "REPLUG", "--row", f"none={tmp_path / 'a'}:none",
                           "--row", f"REPLUG={tmp_path / 'a'}:replug",
                           "--row", f"posterior={tmp_path / 'b'}:replug_posterior"])
    lm = {"lm": "smollm2"}
    assert [r["settings"] for r in numbers] == [{**lm, "k": 4}, {**lm, "k": 4, "temperature": 0.1},
                                                {**lm, "k": 4, "temperature": 0.1, "alpha": 1.0, "depth": 16}]
    assert out.read_text().startswith("6 questions, LM smollm2 (the runs' results.json)")
    assert [round(r["accuracy"], 6) for r in numbers] == [round(100 / 3, 6), 50.0, 100.0]  # 2, 3 and 6 of 6
    lo, hi = numbers[2]["diff_ci"]
    assert 0 < lo <= 50.0 <= hi <= 100.0  # three questions gained, none lost
    assert numbers[1]["diff_ci"] == [0.0, 0.0] and "| posterior | 0.1 | 1.0 | 16 → 4 | 100.0 | +50.0" in out.read_text()
    assert json.load(open(tmp_path / "table.json"))["rows"] == numbers
    for label, said in (("posterior α 0.5", "α 0.5"), ("posterior τ 1", "τ 1"), ("posterior re-rank 8 → 4", "re-rank 8"),
                        ("REPLUG α 1", "α 1")):  # what the run's config did not run
        run = "a:replug" if label.startswith("REPLUG") else "b:replug_posterior"
        with pytest.raises(SystemExit, match=f"says {said} but"):
            tables.main(["--out", str(out), "--baseline", label, "--row", f"{label}={tmp_path / run}"])
    os.makedirs(tmp_path / "retriever")  # an LSR row: its retriever's target, from the retriever's results.json
    with open(tmp_path / "retriever" / "results.json", "w") as f:
        json.dump({"lsr": {"lsr_target": "question"}}, f)
    with open(tmp_path / "a" / "results.json", "w") as f:
        json.dump({"config": {**configs["a"], "retriever_workdir": str(tmp_path / "retriever")}}, f)
    with pytest.raises(SystemExit, match="says question target but .* ran target=none"):  # REPLUG's, not LSR's
        tables.main(["--out", str(out), "--baseline", "LSR, question target",
                     "--row", f"LSR, question target={tmp_path / 'a'}:replug"])
    with open(tmp_path / "a" / "predictions.jsonl") as f:
        rows = [json.loads(line) for line in f]
    with open(tmp_path / "a" / "predictions.jsonl", "w") as f:
        f.writelines(json.dumps({**r, "replug_lsr": r["replug"]}) + "\n" for r in rows)
    lsr = tables.main(["--out", str(out), "--baseline", "LSR", "--row", f"LSR={tmp_path / 'a'}:replug_lsr"])
    assert lsr[0]["settings"] == {**lm, "k": 4, "temperature": 0.1, "target": "question"}
    with pytest.raises(SystemExit, match="says answer target but"):
        tables.main(["--out", str(out), "--baseline", "LSR, answer target",
                     "--row", f"LSR, answer target={tmp_path / 'a'}:replug_lsr"])
    with open(tmp_path / "b" / "results.json", "w") as f:  # another LM's run in the same table
        json.dump({"config": {**configs["b"], "lm": "qwen2.5-coder-0.5b"}}, f)
    with pytest.raises(SystemExit, match="rows from different LMs"):
        tables.main(["--out", str(out), "--baseline", "REPLUG", "--row", f"REPLUG={tmp_path / 'a'}:replug",
                     "--row", f"posterior={tmp_path / 'b'}:replug_posterior"])
    with open(tmp_path / "b" / "results.json", "w") as f:
        json.dump({"config": configs["b"]}, f)
    with open(tmp_path / "b" / "predictions.jsonl", "a") as f:
        f.write(json.dumps({"id": "q9", "answer": 0, "replug_posterior": 0}) + "\n")
    with pytest.raises(SystemExit, match="covers other questions"):
        tables.main(["--out", str(out), "--baseline", "REPLUG", "--row", f"REPLUG={tmp_path / 'a'}:replug",
                     "--row", f"posterior={tmp_path / 'b'}:replug_posterior"])


def test_qa_tables_of_finished_runs_against_a_chosen_baseline(tmp_path, monkeypatch):
    """experiments/posterior_qa.py reuses finished runs of the same config (another LM's or size's is refused) and
    measures every row against `--baseline RUN:METHOD`:
    the answer NLL's relative change and the exact-match difference equal a hand count, each row carries its run's
    answer recall; a baseline outside the chosen runs is refused before anything runs."""
    import importlib.util

    experiments = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")
    monkeypatch.syspath_prepend(experiments)
    spec = importlib.util.spec_from_file_location("posterior_qa", os.path.join(experiments, "posterior_qa.py"))
    qa_tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(qa_tables)
    runs = {"concat": ("concat", [2.0, 4.0, 6.0, 8.0], [1, 0, 0, 1], 75.0),
            "dev_posterior": ("replug_posterior", [1.0, 3.0, 6.0, 6.0], [1, 1, 0, 1], 100.0)}
    args = qa_tables.argparse.Namespace(lm="smollm2", questions=200, workdir=str(tmp_path), cache_dir="", lm_cache="",
                                        lsr_retrievers="")
    for name, (method, nll, em, recall) in runs.items():
        os.makedirs(tmp_path / name)
        config = json.loads(qa_tables.run_config(args, name).to_json_best_effort())
        with open(tmp_path / name / "results.json", "w") as f:
            json.dump({"seconds": 60.0, "answer_recall": {method: recall}, "config": config}, f)
        with open(tmp_path / name / "predictions.jsonl", "w") as f:
            for x, e in zip(nll, em):
                f.write(json.dumps({method: {"answer_nll": x, "exact_match": bool(e)}}) + "\n")
    rows = qa_tables.main(["--workdir", str(tmp_path), "--runs", "concat,dev_posterior", "--baseline",
                           "concat:concat"])
    assert [r["method"] for r in rows] == ["concat", "posterior α 0.5, τ 0.03, re-rank 16 → 4"]
    assert {r["baseline"] for r in rows} == {"concat"}
    assert rows[1]["nll_vs_baseline_percent"] == pytest.approx(100 * (16 / 20 - 1))  # mean 4.0 against 5.0
    assert rows[1]["exact_match"] == 75.0 and rows[0]["exact_match"] == 50.0
    assert [r["answer_recall"] for r in rows] == [75.0, 100.0]  # each run's own recall of its method's passages
    lo, hi = rows[1]["nll_diff_ci"]
    assert -2.0 <= lo < -1.0 < hi <= 0.0  # the differences -1, -1, 0, -2: the interval within their range, about -1
    table = (tmp_path / "table.md").read_text()
    assert "| concat | 50.0 |" in table and "| 100.0 | 1.0 |" in table  # recall, then minutes
    with pytest.raises(SystemExit, match="baseline"):
        qa_tables.main(["--workdir", str(tmp_path), "--runs", "concat", "--baseline", "tau0.1:replug"])
    with pytest.raises(SystemExit, match=r"another config: lm 'smollm2' \(wanted 'qwen2.5-coder-0.5b'\)"):
        qa_tables.main(["--workdir", str(tmp_path), "--runs", "concat,dev_posterior", "--baseline", "concat:concat",
                        "--lm", "qwen2.5-coder-0.5b"])  # another LM in the same workdir: refused, not mislabelled
    # every recorded key counts (a run with other k, shots, evidence, encoder or answer NLL was once reused), but not
    # where the run cached (results_file.NUMBER_FREE_KEYS)
    path, alone = tmp_path / "concat" / "results.json", ["--workdir", str(tmp_path), "--runs", "concat", "--baseline",
                                                         "concat:concat"]
    recorded = json.loads(path.read_text())
    ran = recorded["config"]
    for key, value in (("k", ran["k"] + 1), ("shots", ran["shots"] + 1),
                       ("answer_nll_demos", not ran["answer_nll_demos"]), ("posterior_evidence", "demos" if ran["posterior_evidence"] != "demos" else "question"),
                       ("encoder", "contriever" if ran["encoder"] != "contriever" else "minilm")):
        path.write_text(json.dumps({**recorded, "config": {**ran, key: value}}))
        with pytest.raises(SystemExit, match=f"another config: {key} "):
            qa_tables.main(alone)
    path.write_text(json.dumps({**recorded, "config": {**ran, "cache_dir": "/elsewhere", "lm_cache": "/elsewhere/c"}}))
    assert qa_tables.main(alone)[0]["exact_match"] == 50.0  # reused
    with pytest.raises(SystemExit, match="another config: max_questions 200"):
        qa_tables.main(["--workdir", str(tmp_path), "--runs", "concat", "--baseline", "concat:concat",
                        "--questions", "50"])
