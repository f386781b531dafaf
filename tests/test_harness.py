"""REPLUG inside lm-evaluation-harness (replug_jax/harness/), checked against third parties and against the object:
  * with retrieval off, every request's (log-likelihood, is_greedy) and the accuracy equal lm-eval's own `hf` backend
    on the same SmolLM2 weights (transformers' PyTorch);
  * with retrieval on, every log-likelihood equals `REPLUG.score` of the same context and continuation, retrieved for
    the instance's own example ("Question: ..\\nAnswer:", not the few-shot block), for replug and replug_posterior;
  * generate_until equals `REPLUG.generate`, and with the QA job's passage line, `REPLUG.answer`;
  * through the project's server the numbers are the local ones.
All on the offline SciQ tasks (harness/offline_tasks.py), no network."""
import copy
import json
import os

import numpy as np
import pytest

pytest.importorskip("lm_eval", reason="the [harness] extra (lm-eval) is not installed")

import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

import replug_jax as rj  # noqa: E402
from replug_jax.evaluate.windows import document_windows  # noqa: E402
from replug_jax.harness import offline_tasks  # noqa: E402
from replug_jax.harness.model import REPLUGHarnessLM  # noqa: E402
from replug_jax.harness.queries import QueryResolver  # noqa: E402

MC, QA = "replug_sciq_mc", "replug_sciq_qa"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """(the tasks' folder, its TaskManager): 6 SciQ questions, their support paragraphs as the corpus."""
    folder = offline_tasks.write_tasks(str(tmp_path_factory.mktemp("harness_tasks")), limit=6)
    return folder, TaskManager(include_path=folder, include_defaults=False)


def evaluate(model, tasks, names, *, limit, shots, **more):
    """lm-eval's own evaluation of `model` (a name with args, or an object): {task: [sample, ...]}, results."""
    folder, manager = tasks
    kwargs = dict({"model_args": model[1]} if isinstance(model, tuple) else {}, **more)
    out = lm_eval.simple_evaluate(model=model[0] if isinstance(model, tuple) else model, tasks=list(names),
                                  task_manager=manager, limit=limit, num_fewshot=shots, log_samples=True,
                                  random_seed=0, numpy_random_seed=0, torch_random_seed=0, **kwargs)
    return out["samples"], out["results"]


def harness_model(tasks, lm, **args):
    corpus = None if args.get("k") == 0 else os.path.join(tasks[0], offline_tasks.CORPUS_FILE)
    return REPLUGHarnessLM(lm=lm, corpus=corpus, include_path=tasks[0], **args)


def own_text(sample) -> str:
    """The instance's own example, written here from its doc (the task's prompt)."""
    return f"Question: {sample['doc']['question']}\nAnswer:"


def test_without_retrieval_every_request_equals_lm_evals_hf_backend(tasks, smollm2, torch_smollm2):
    """k=0: lm-eval's `hf` backend (PyTorch, the same GGUF) and ours give each option's log-likelihood to float32
    rounding, the same is_greedy and the same accuracy, 1-shot. The backend is handed the session's transformers
    model of the GGUF (float32, CPU) rather than the GGUF's path: loading it again took 41 s, 34 of them gguf-py
    reading the file's metadata four times."""
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    model, tokenizer = torch_smollm2
    hf_lm = get_model("hf")(pretrained=model, tokenizer=copy.deepcopy(tokenizer))  # its pad token set on a copy
    ours_lm = harness_model(tasks, smollm2, k=0)
    hf, hf_results = evaluate(hf_lm, tasks, [MC], limit=3, shots=1)
    ours, results = evaluate(ours_lm, tasks, [MC], limit=3, shots=1)
    assert len(hf[MC]) == len(ours[MC]) == 3
    for h, o in zip(hf[MC], ours[MC]):
        assert h["arguments"] == o["arguments"]  # the same prompts, shots included
        got = np.array([float(r[0][0]) for r in o["resps"]])
        want = np.array([float(r[0][0]) for r in h["resps"]])
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-4)
        assert [bool(r[0][1]) for r in o["resps"]] == [bool(r[0][1]) for r in h["resps"]]
    assert results[MC]["acc,none"] == hf_results[MC]["acc,none"]
    pairs = [("1, 2, 3, 4, 5, 6,", " 7, 8"), ("Monday, Tuesday, Wednesday,", " Thursday"),
             ("The capital of France is", " Paris"), ("Monday, Tuesday, Wednesday,", " Sunday"),
             ("The capital of France is ", "Paris"),  # contexts ending in whitespace: lm-eval moves it (issue 85)
             ("English sentence: The cat sleeps.\nFrench sentence: ", "Le chat dort."),
             ("Question: What is the capital of France?\nAnswer:\n", "Paris")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    got, want = ours_lm.loglikelihood(requests), hf_lm.loglikelihood(requests)
    np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], atol=2e-3, rtol=1e-4)
    assert [g[1] for g in got] == [bool(w[1]) for w in want]
    assert any(g[1] for g in got) and not all(g[1] for g in got)  # is_greedy compared both ways
    assert ours_lm.greedy_counts["from scoring"] >= len(requests)  # read from the scoring pass, not decoded


def test_a_chat_template_is_applied_as_lm_evals_hf_backend_applies_it(tasks, smollm2, torch_smollm2):
    """--apply_chat_template with the shots as turns and a system instruction, k=0: our model renders the GGUF's
    template to the very prompts lm-eval's hf backend builds with transformers' tokenizer, and scores them alike."""
    from lm_eval.api.registry import get_model

    model, tokenizer = torch_smollm2
    assert tokenizer.chat_template  # the GGUF's own, as transformers read it
    hf_lm = get_model("hf")(pretrained=model, tokenizer=copy.deepcopy(tokenizer))
    chat = dict(apply_chat_template=True, fewshot_as_multiturn=True, system_instruction="Answer in one word.")
    hf, _ = evaluate(hf_lm, tasks, [MC], limit=1, shots=1, **chat)
    ours, _ = evaluate(harness_model(tasks, smollm2, k=0), tasks, [MC], limit=1, shots=1, **chat)
    assert len(hf[MC]) == len(ours[MC]) == 1
    for h, o in zip(hf[MC], ours[MC]):
        assert h["arguments"] == o["arguments"]  # the templated prompts, character for character
        context = o["arguments"][0][0]  # the first option's (context, continuation)
        assert context.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\n"), context
        assert context.count("<|im_start|>assistant") == 2  # the shot's answer as a turn, and the request's
        np.testing.assert_allclose([float(r[0][0]) for r in o["resps"]], [float(r[0][0]) for r in h["resps"]],
                                   atol=2e-3, rtol=1e-4)


@pytest.fixture(scope="module")
def rag_of(tasks, smollm2, minilm):
    """A REPLUG object built apart from the harness's, over the same corpus and settings."""
    def build(**mixing):
        return rj.REPLUG.from_documents(os.path.join(tasks[0], offline_tasks.CORPUS_FILE), lm=smollm2,
                                        encoder=minilm, **mixing)
    return build


@pytest.mark.parametrize("weights", ["replug", pytest.param("replug_posterior", marks=pytest.mark.slow)])
def test_with_retrieval_every_loglikelihood_is_replug_score_for_the_example(tasks, smollm2, minilm, rag_of, weights):
    """1-shot SciQ: each option's log-likelihood is REPLUG.score's, retrieval for "Question: <q>\\nAnswer:" alone; the
    whole context (shot included) as the query would give other numbers, so the test would see it. (replug_posterior
    is `slow`: test_path_equivalence.py holds the harness's posterior to the object's on every path.)"""
    mixing = {"k": 2, "temperature": 0.1, "weights": weights}
    if weights == "replug_posterior":
        mixing.update(posterior_alpha=0.5, rerank_depth=4)
    model = harness_model(tasks, smollm2, encoder=minilm, is_greedy=weights == "replug", **mixing)
    samples, _ = evaluate(model, tasks, [MC], limit=2, shots=1)
    rag = rag_of(**mixing)
    pairs = [(c, x, own_text(sample)) for sample in samples[MC] for c, x in sample["arguments"]]
    got = [(float(resp[0][0]), bool(resp[0][1])) for sample in samples[MC] for resp in sample["resps"]]
    contexts, continuations, queries = (list(t) for t in zip(*pairs))
    assert all(c.endswith(q) and c != q for c, q in zip(contexts, queries))  # a shot before the example
    want = [float(np.sum(lp, dtype=np.float64)) for lp in rag.score_many(contexts, continuations, queries)]
    np.testing.assert_allclose([g for g, _ in got], want, atol=1e-4)
    one = float(np.sum(rag.score(contexts[0], continuations[0], query=queries[0]), dtype=np.float64))
    assert abs(one - want[0]) < 1e-4  # the object's one-pair call, as the batch
    if weights == "replug":  # is_greedy: REPLUG's own greedy decoding gives the continuation's tokens
        ids = [smollm2.tokenizer.encode(x) for x in continuations]
        decoded = rag.generations(contexts, max_new_tokens=max(map(len, ids)), stop=(), queries=queries)
        for i, (want_ids, greedy) in enumerate(zip(ids, decoded)):
            assert got[i][1] == (list(greedy.token_ids[: len(want_ids)]) == list(want_ids))
        assert any(g for _, g in got) and not all(g for _, g in got)
        assert model.greedy_counts["from scoring"] > model.greedy_counts["decoded"]  # the scoring pass decided
    whole = [float(np.sum(lp, dtype=np.float64)) for lp in rag.score_many(contexts, continuations, contexts)]
    differs = np.abs(np.array(whole) - np.array(want)).max() > 1e-3
    assert differs, "the query source makes no difference on these questions: the test would not see it"


def test_generate_until_is_replug_generate_and_with_the_knowledge_line_replug_answer(tasks, smollm2, minilm, rag_of):
    """generate_until: REPLUG.generate of the request's context (stop "\\n", 16 tokens); with the QA job's passage
    line ("Knowledge: <passage>\\n") and 0 shots, REPLUG.answer's answer to the question."""
    mixing = {"k": 2, "temperature": 0.1, "weights": "replug"}
    samples, _ = evaluate(harness_model(tasks, smollm2, encoder=minilm, **mixing), tasks, [QA], limit=2, shots=1)
    rag = rag_of(**mixing)
    for sample in samples[QA]:
        context = sample["arguments"][0][0]
        assert sample["resps"][0][0] == rag.generate(context, max_new_tokens=16, stop=("\n",),
                                                     query=own_text(sample))
    samples, _ = evaluate(harness_model(tasks, smollm2, encoder=minilm, doc_template="Knowledge: {passage}\n",
                                        **mixing), tasks, [QA], limit=2, shots=0)
    with pytest.warns(UserWarning, match="zero-shot"):
        answers = [rag.answer(s["doc"]["question"], max_new_tokens=16) for s in samples[QA]]
    assert [s["resps"][0][0].strip() for s in samples[QA]] == answers
    assert any(answers)


def test_passages_beside_the_example_give_the_qa_jobs_answers(tasks, smollm2, minilm, rag_of):
    """passages=example_and_shots: each passage between the few-shot block and the instance's own text, each shot
    with its own top passage before it, "Knowledge: <passage>\n" lines: an lm-eval generation task gives
    `REPLUG.answer`'s answer with the request's shots as demos, which is the QA job's (tests/test_path_equivalence.py
    `test_replug_object_gives_the_jobs_numbers`); and the multiple-choice log-likelihoods are `score_many`'s with the
    same block before each passage. passages=context (the default) puts the shot after the passage and answers
    otherwise on these questions."""
    import re

    from replug_jax.method.passages import passage_text

    mixing = {"k": 2, "temperature": 0.1, "weights": "replug"}
    layout = dict(doc_template="Knowledge: {passage}\n", query="field:question", **mixing)
    beside = harness_model(tasks, smollm2, encoder=minilm, passages="example_and_shots", **layout)
    samples, _ = evaluate(beside, tasks, [QA], limit=4, shots=1)
    rag = rag_of(**mixing, doc_template="Knowledge: {passage}\n")
    demos = [re.match(r"Question: (.*)\nAnswer: (.*)\n\n", s["arguments"][0][0]).groups() for s in samples[QA]]
    want = [rag.answer(s["doc"]["question"], max_new_tokens=16, demos=[d]) for s, d in zip(samples[QA], demos)]
    assert [s["resps"][0][0].strip() for s in samples[QA]] == want
    assert any(want)
    before, _ = evaluate(harness_model(tasks, smollm2, encoder=minilm, **layout), tasks, [QA], limit=4, shots=1)
    assert [s["resps"][0][0].strip() for s in before[QA]] != want  # the layout changes what the LM sees
    from lm_eval.api.instance import Instance

    odd = Instance("generate_until", samples[QA][0]["doc"], ("Another prompt\nAnswer:", {}), 0, (QA, 0, 1))
    with pytest.raises(ValueError, match="is not in the request's context"):  # nowhere to put the passage: said
        beside._layout([odd], [odd.args[0]])
    mc, _ = evaluate(beside, tasks, [MC], limit=1, shots=1)
    context, _ = mc[MC][0]["arguments"][0]
    block, own = context[: context.rindex("Question: ")], context[context.rindex("Question: "):]
    shot_doc = rag.passages(re.match(r"Question: (.*)\n", block).group(1))[0]
    block = f"Knowledge: {passage_text(shot_doc[1], shot_doc[2])}\n" + block  # the shot's own top passage
    options = [x for _, x in mc[MC][0]["arguments"]]
    got = [float(r[0][0]) for r in mc[MC][0]["resps"]]
    lps = rag.score_many([own] * len(options), options, [mc[MC][0]["doc"]["question"]] * len(options),
                         shots=[block] * len(options))
    np.testing.assert_allclose(got, [float(np.sum(lp, dtype=np.float64)) for lp in lps], atol=1e-4)


def test_a_retrieval_file_gives_the_numbers_of_the_retrieval_it_holds(tasks, smollm2, minilm, rag_of, tmp_path):
    """retrieval=FILE (DPR's format, retrieval/given.py): each request's passages are its query's row of the file, so
    a file written from the corpus's own retrieval gives corpus='s very log-likelihoods at the same k and τ."""
    from replug_jax.evaluate import retrieval_results

    args = {"k": 2, "temperature": 0.1, "weights": "replug", "query": "field:question", "is_greedy": False}
    own, _ = evaluate(harness_model(tasks, smollm2, encoder=minilm, **args), tasks, [MC], limit=2, shots=1)
    rag = rag_of(k=2, temperature=0.1, weights="replug")
    questions = [sample["doc"]["question"] for sample in own[MC]]
    scores, rows = rag.retriever.retrieve(questions, 3)
    ctxs = retrieval_results.contexts(rag.datastore, [[] for _ in questions], scores, rows)
    path = retrieval_results.write([{"question": q, "ctxs": c} for q, c in zip(questions, ctxs)], str(tmp_path))
    model = REPLUGHarnessLM(lm=smollm2, retrieval=path, include_path=tasks[0], **args)
    given, _ = evaluate(model, tasks, [MC], limit=2, shots=1)
    assert [s["resps"] for s in given[MC]] == [s["resps"] for s in own[MC]]
    assert model.get_model_info()["retrieval"] == path
    with pytest.raises(ValueError, match="give one"):
        REPLUGHarnessLM(lm="no-such-lm-would-fail-to-load", retrieval=path, corpus=path, **args)
    with pytest.raises(ValueError, match=f"k=4 is more than the 3 passages {path}, line 1 gives"):
        REPLUGHarnessLM(lm="no-such-lm-would-fail-to-load", retrieval=path, **{**args, "k": 4})


@pytest.mark.slow  # the HTTP client's equality with the local LM is the core suite's (test_http, test_path_equivalence)
@pytest.mark.parametrize("chat", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["plain", "chat_template"])
def test_through_the_server_the_numbers_are_the_local_ones(tasks, smollm2, minilm, chat):
    """lm=<our server's URL> (token-id prompts by the local tokenizer): the same log-likelihoods and answers as the
    local LM, retrieval on; and so with the chat template applied (the local tokenizer's, tokenizer=smollm2)."""
    from replug_jax.serve import BackgroundServer

    mixing = {"k": 2, "temperature": 0.1, "weights": "replug_posterior", "rerank_depth": 3, "is_greedy": False}
    more = {"apply_chat_template": True} if chat else {}
    local, _ = evaluate(harness_model(tasks, smollm2, encoder=minilm, **mixing), tasks, [MC, QA], limit=2, shots=1,
                        **more)
    with BackgroundServer(smollm2) as server:
        with pytest.warns(UserWarning, match="is_greedy=false"):
            remote, _ = evaluate(harness_model(tasks, server.url, tokenizer="smollm2", encoder=minilm, **mixing),
                                 tasks, [MC, QA], limit=2, shots=1, **more)
    assert ("<|im_start|>" in str(local[MC][0]["arguments"])) == chat
    for a, b in zip(local[MC], remote[MC]):
        np.testing.assert_allclose([float(r[0][0]) for r in b["resps"]], [float(r[0][0]) for r in a["resps"]],
                                   atol=1e-3)
    assert [s["resps"] for s in remote[QA]] == [s["resps"] for s in local[QA]]


def test_loglikelihood_rolling_scores_every_token(smollm2, minilm, tasks):
    """The windows cover the whole text; a text within one window is the LM's own log-likelihood after the
    document start (no retrieval: its first stretch has no query), and a longer one retrieves for the later
    stretches."""
    from lm_eval.api.instance import Instance

    text = " ".join(f"Wetlands are areas of land {i} wet for all or part of the year." for i in range(12))
    windows = document_windows("t", text, smollm2.tokenizer, stride_tokens=64, query_tokens=64, context_tokens=64,
                               whole=True)
    assert "".join(w.continuation for w in windows) == text and not windows[0].query and windows[1].query
    short = "Wetlands are wet."
    none = harness_model(tasks, smollm2, k=0, stride_tokens=64, query_tokens=64, context_tokens=64)
    requests = [Instance("loglikelihood_rolling", {}, (t,), 0) for t in (short, text)]
    got_none = none.loglikelihood_rolling(requests)
    assert abs(got_none[0] - float(np.sum(smollm2.score([""], [short])[0], dtype=np.float64))) < 1e-4
    rag = harness_model(tasks, smollm2, encoder=minilm, k=2, weights="replug", stride_tokens=64, query_tokens=64,
                        context_tokens=64)
    got = rag.loglikelihood_rolling(requests)
    assert abs(got[0] - got_none[0]) < 1e-4 and abs(got[1] - got_none[1]) > 1e-3


def test_query_sources_and_mistakes_named_before_any_model_loads(tasks, tmp_path):
    from lm_eval.api.instance import Instance

    small = str(tmp_path / "small.jsonl")  # at most 2 passages by its bytes
    with open(small, "w") as f:
        f.write(json.dumps({"text": "Wetlands are wet."}) + "\n" + json.dumps({"text": "Deserts are dry."}) + "\n")

    doc = {"question": "What is wet?", "choices": ["a"], "label": 0}
    inst = Instance("loglikelihood", doc, ("shot\n\nQuestion: What is wet?\nAnswer:", " a"), 0,
                    (MC, 0, 1))
    assert QueryResolver("doc_to_text", include_path=tasks[0])(inst) == "Question: What is wet?\nAnswer:"
    assert QueryResolver("field:question")(inst) == "What is wet?"
    assert QueryResolver("context")(inst) == inst.args[0]
    with pytest.raises(ValueError, match="no field 'query'"):
        QueryResolver("field:query")(inst)
    with pytest.raises(ValueError, match="query='doc'"):
        QueryResolver("doc")
    for args, match in (({"k": 2, "temperature": 0.1, "weights": "replug", "batch": 3}, "batch"),
                        ({"k": 2, "weights": "bm25"}, "weights='bm25'"),
                        ({"k": 2, "weights": "replug", "corpus": None}, "needs corpus"),
                        ({"k": 2, "weights": "replug", "corpus": "/no/such.jsonl"}, "no/such"),
                        ({"k": 50, "weights": "replug", "corpus": small}, r"k=50 is larger than the datastore"),
                        ({"k": 2, "weights": "replug", "corpus": small, "passages": "shots"}, "passages='shots'")):
        with pytest.raises(ValueError, match=match):
            REPLUGHarnessLM(lm="no-such-lm-would-fail-to-load", **args)


def test_a_workdir_reuses_the_index_and_resumes_from_the_lms_cache(tasks, smollm2, minilm, tmp_path):
    """workdir=: the first model embeds into WORKDIR/index_dense and caches the LM's scores; a second one (a rerun)
    reuses both and gives the same numbers, as does a model without a workdir."""
    from lm_eval.api.instance import Instance

    requests = [Instance("loglikelihood", {"question": "What is an area of land that is wet all year?"},
                         ("Question: What is an area of land that is wet all year?\nAnswer:", x), i)
                for i, x in enumerate([" wetland", " tundra"])]
    args = {"k": 2, "temperature": 0.1, "weights": "replug", "encoder": minilm, "query": "context"}
    plain = harness_model(tasks, smollm2, **args).loglikelihood(requests)
    first = harness_model(tasks, smollm2, workdir=str(tmp_path), **args)
    assert first.loglikelihood(requests) == plain
    built = os.path.getmtime(tmp_path / "index_dense")
    second = harness_model(tasks, smollm2, workdir=str(tmp_path), **args)
    assert os.path.getmtime(tmp_path / "index_dense") == built  # reused, not rebuilt
    assert second.loglikelihood(requests) == plain
    assert second.lm.hits > 0 and second.lm.misses == 0  # every score read back from WORKDIR/lm_cache.sqlite


def test_a_corpus_document_without_text_is_refused_or_left_out_and_a_new_workdir_made(tasks, smollm2, minilm,
                                                                                     tmp_path):
    """The jobs' rule for documents without text in the harness's corpus= (issue 85: dropped without a word), and a
    workdir= not made yet with cache=false made (it failed after embedding the corpus)."""
    from replug_jax.retrieval.datastore import EmptyDocuments

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "wet", "text": "A wetland is land that is wet all year."}) + "\n"
                      + json.dumps({"id": "blank", "text": ""}) + "\n")
    args = {"k": 1, "weights": "replug", "encoder": minilm, "include_path": tasks[0]}
    with pytest.raises(EmptyDocuments, match=r"1 document without text \(id 'blank'\)"):
        REPLUGHarnessLM(lm=smollm2, corpus=str(corpus), **args)
    workdir = tmp_path / "new" / "run"
    with pytest.warns(UserWarning, match=r"left out 1 document without text \(id 'blank'\)"):
        model = REPLUGHarnessLM(lm=smollm2, corpus=str(corpus), drop_empty_documents=True, workdir=str(workdir),
                                cache=False, **args)
    assert set(model.rag.datastore.sources) == {"wet"} and (workdir / "index_dense").exists()


@pytest.mark.slow  # lm-eval's command line indexes its 14,000 tasks (about 20 s) before it runs
def test_the_documented_command_prints_lm_evals_table(tmp_path):
    """docs/harness.md's command: `python -m replug_jax.harness --model replug ...` writes the offline tasks on first
    use, puts them on lm-eval's include path and prints lm-eval's own results table."""
    import subprocess
    import sys

    env = dict(os.environ, REPLUG_JAX_HARNESS_TASKS=str(tmp_path / "tasks"), HF_DATASETS_OFFLINE="1",
               HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "replug_jax.harness", "--model", "replug", "--model_args",
                          "lm=smollm2,weights=none", "--tasks", "replug_sciq_mc", "--limit", "2", "--output_path",
                          str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=600,
                         cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr[-2000:]  # weights=none, which lm-eval's parser hands over as None
    assert "|replug_sciq_mc|" in run.stdout and "acc" in run.stdout, run.stdout[-2000:]
    assert (tmp_path / "tasks" / "replug_sciq_mc.yaml").is_file()
    assert os.listdir(tmp_path / "out") == ["replug-smollm2"]  # named after the LM, not a random id


@pytest.mark.slow  # lm-eval's command line indexes its 14,000 tasks (about 20 s) before it runs
def test_a_doc_template_from_the_command_line_in_the_json_form_reaches_the_model(tmp_path):
    """--model_args as one JSON object, the form lm-eval's parser keeps `{}` and a newline in: the run's record holds
    the doc_template as given, newline included."""
    import subprocess
    import sys

    env = dict(os.environ, REPLUG_JAX_HARNESS_TASKS=str(tmp_path / "tasks"), HF_DATASETS_OFFLINE="1",
               HF_HUB_OFFLINE="1")
    args = json.dumps({"lm": "smollm2", "corpus": "sciq_support", "k": 1, "doc_template": "Knowledge: {passage}\n"})
    run = subprocess.run([sys.executable, "-m", "replug_jax.harness", "--model", "replug", "--model_args", args,
                          "--tasks", "replug_sciq_mc", "--limit", "1", "--output_path", str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=900, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr[-2000:]
    (record,) = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "out") for f in files if f.endswith(".json")]
    with open(record) as f:
        model_args = json.load(f)["config"]["model_args"]
    assert model_args["doc_template"] == "Knowledge: {passage}\n", model_args  # the newline itself


@pytest.mark.slow  # lm-eval's command line indexes its 14,000 tasks (about 20 s), and again for the close names
def test_a_misspelt_task_is_one_line_with_the_closest_names(tmp_path):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "replug_jax.harness", "--model", "replug", "--model_args",
                          "lm=smollm2,k=0", "--tasks", "replug_sciq_mcc"], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, REPLUG_JAX_HARNESS_TASKS=str(tmp_path)))
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 2 and len(errors) == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "unknown task 'replug_sciq_mcc' (close: replug_sciq_mc" in errors[0], errors


def test_the_commands_mistakes_are_one_line_in_the_first_seconds(tmp_path):
    """A mistyped argument, ignored posterior settings, a missing corpus and k above the corpus's passages: exit 2
    and one line, before lm-eval indexes its tasks or a model loads."""
    import subprocess
    import sys

    three = tmp_path / "three.jsonl"  # 3 passages, while the bytes' bound allows 6: counted by the LM's tokenizer
    three.write_text("".join(json.dumps({"id": f"d{i}", "text": " ".join([f"word{i}"] * 40)}) + "\n" for i in range(3)))
    for args, words in (("lm=smollm2,k=2,wieghts=replug", "wieghts"),
                        ("lm=smollm2,corpus=/no/such.jsonl,k=2,weights=replug", "/no/such.jsonl"),
                        ("lm=smollm2,corpus=/no/such.jsonl,k=2,weights=replug,posterior_alpha=0.5", "ignored"),
                        (f"lm=smollm2,corpus={three},k=5,weights=replug",
                         "k=5 is larger than the datastore (3 passages"),
                        ("lm=http://127.0.0.1:9/v1,k=0 --apply_chat_template", "has no chat template"),
                        ("lm=smollm2,doc_template={title}:{text}", "in the JSON form"),
                        (f"lm=smollm2,corpus={three},k=2,weights=replug,passages=shots", "passages='shots'")):
        model_args, *more = args.split(" ")
        run = subprocess.run([sys.executable, "-m", "replug_jax.harness", "--model", "replug", "--model_args",
                              model_args, "--tasks", "replug_sciq_mc", *more], capture_output=True, text=True,
                             timeout=120, env=dict(os.environ, REPLUG_JAX_HARNESS_TASKS=str(tmp_path)))
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and words in lines[0], run.stderr[-1500:]


@pytest.mark.slow  # starts llama-cpp-python's server
def test_generate_until_through_the_llama_cpp_server(tasks, smollm2, minilm, tmp_path):
    """The third-party llama.cpp server (llama-cpp-python) as the harness model's LM, passed from Python as an HTTPLM
    with its text-only settings (its echoed log-probs are shifted by one position, so the client refuses it for
    scoring: tests/test_http.py): generate_until with retrieval gives REPLUG.generate's answers through the same
    server, and the local LM's first tokens (llama.cpp's own kernels may part from ours at a near-tie later on)."""
    pytest.importorskip("llama_cpp.server.app", reason="pip install 'llama-cpp-python[server]==0.3.36'")
    from lm_eval.api.instance import Instance

    from replug_jax.lm.http.client import HTTPLM
    from replug_jax.models.registry import packaged_path
    from tests.test_http import free_port, start, stop, wait_for

    # mid-sentence contexts: llama-cpp-python leaves a generated EOS out of its tokens and log-probs, so a pass whose
    # greedy next token is EOS (after "Answer:", at times) gives the mixture nothing to read, and the client refuses it
    contexts = ["An area of land that is wet all year is called a", "Plants use sunlight to make food by"]
    asked = [Instance("generate_until", {"question": c}, (c, {"until": ["\n"], "max_gen_toks": 6}), i)
             for i, c in enumerate(contexts)]
    args = {"k": 2, "temperature": 0.1, "weights": "replug", "encoder": minilm, "query": "context"}
    port, log = free_port(), tmp_path / "llama.log"
    proc = start(["-m", "llama_cpp.server", "--model", packaged_path("smollm2"), "--host", "127.0.0.1",
                  "--port", str(port), "--n_ctx", "1024", "--n_threads", "2"], log)
    try:
        wait_for(f"http://127.0.0.1:{port}/v1/models", proc, 60, log)
        remote = HTTPLM(f"http://127.0.0.1:{port}/v1", tokenizer=smollm2.tokenizer, probe=False, token_prompts=False)
        model = harness_model(tasks, remote, **args)
        got = model.generate_until(asked)
        direct = [model.rag.generate(r.args[0], query=r.args[0], max_new_tokens=6, stop=("\n",)) for r in asked]
    finally:
        stop(proc)
    local = harness_model(tasks, smollm2, **args).generate_until(asked)
    assert got == direct and all(got), got
    for g, w in zip(got, local):
        assert smollm2.tokenizer.encode(g)[:2] == smollm2.tokenizer.encode(w)[:2], (g, w)
