"""One method, one number, whatever the path (issue 50): the standing path-equivalence matrix.

Every cell runs the same tiny inputs (a tiny GPT-2 trained for seconds on the cells' own texts, far from uniform,
whose byte-level BPE merges across whitespace, so that each cell kind's passage/x boundary falls inside a token
somewhere; a tiny BERT retriever over 8 documents) and compares with the local LM's number to 1e-4. The documents,
questions and answers are in several scripts (accented Latin, Cyrillic, CJK, emoji: characters split over byte
tokens; issue 69). So the cells
see token boundaries: an HTTP client that tokenised the passage and x apart (undoing REPLUG's own tokens), or that
moved x's first token into the passage, fails the LM-evaluation, QA, cloze and OLMES cells (tried by hand, 2026-11-28).

Weightings: `replug` (λ = softmax(s/τ)); `replug_posterior` α 0; α 1; α 1 re-ranked (the top 4 scored, 2 kept).
Paths:
  local        LocalLM
  http         HTTPLM on our server with the local tokenizer (token-id prompts)
  http_server  HTTPLM with the server's own /tokenize (pieces: exact token starts)
  http_ids     HTTPLM with a /tokenize that gives ids only (vLLM's): passes REPLUG's own tokens, so `replug` and α 0
               still equal local; windows, passages and ℓ's boundary are estimated, and the run says so
Cells (W: every weighting; P: local, http, http_server):
  LM evaluation   `evaluate_lm` W × P on windows and passages cut by each path's tokenizer (identical cuts);
                  the lm_eval job (none, replug, α 1 re-ranked) × {local, http_server}; its warning on http_ids
  QA              `qa_posterior.predict` and REPLUG's answer NLL W × P (answer NLL, λ, log p(x|d)), and the
                  re-ranked posterior with `posterior_evidence="demos"` × P; answer_nll on and off give the same
                  predictions and weights; the qa job (none, replug, α 1 re-ranked) × {local,
                  http, http_server}: answer NLL and the answers' texts, whole (no U+FFFD), and the local run's
                  retrieval.jsonl given back over http_server (--config.retrieval_file) the same; "concat"'s passages still in a window-cut prompt × P and http_ids
  multiple choice the project's cloze prompts and real OLMES arc_easy rc_5shot requests, W × P (options'
                  log-likelihoods, kept passages); x is the request's final question block; "concat"'s passages
                  still in a prompt the window cuts before its longest option (mmlu and OLMES prompts) × P and
                  http_ids
  REPLUG object   `REPLUG.score` W × P gives one number, `evaluate_lm`'s perplexity of the same window;
                  `REPLUG.answer` equals the QA job's prediction (local)
  lm-eval harness the `replug` model's loglikelihood, is_greedy and generate_until (replug, α 1 re-ranked) × P;
                  its log-likelihoods are `REPLUG.score_many`'s with the instance's question as the query; the
                  passages beside the example (passages=example_and_shots: `score_many(shots=)`,
                  `generations(shots=)`, the few-shot block before each passage) × P
  end of sequence an answer the LM ends at its end token, × {local, http, http_server, http_ids with no end token
                  named}, mixed and one pass: tests/test_generate_http.py (SmolLM2's chat answers end there; this
                  matrix's tiny GPT-2 never emits its end token)
  alone / listed  each method alone equals the same method beside the others (LM evaluation, QA);
                  a k sweep never changes the posterior (rerank_depth 0 means k)
  α 0             equals REPLUG bit for bit where the passes are shared (LM evaluation), to 1e-6 elsewhere
Two processes: tests/test_multiprocess.py runs the jobs in two processes against one (slow tier).
"""
import json
import os
import threading
import time

import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

import replug_jax as rj
from replug_jax.data.olmes import load_olmes, split_question_block
from replug_jax.data.records import MCExample, QAExample
from replug_jax.evaluate import answer_nll, concat_cuts, mmlu, multiple_choice, option_text, qa, qa_posterior
from replug_jax.evaluate import perplexity as lm_perplexity
from replug_jax.evaluate.windows import Window, document_windows
from replug_jax.lm import blackbox
from replug_jax.lm.http.client import HTTPLM, BlackBoxServerError
from replug_jax.method.passages import (DOC_TEMPLATE, QA_DOC_TEMPLATE, knowledge_line, passage_ids, passage_text,
                                       passages_of)
from replug_jax.retrieval.datastore import Document, chunk_documents
from replug_jax.retrieval.embeddings import embed_corpus
from replug_jax.retrieval.index import DenseIndex
from replug_jax.retrieval.retriever import DenseRetriever, index_meta
from replug_jax.server.app import BackgroundServer

from tests import hf_tiny

TOPICS = ["The river Avon flows to the sea past the old mill at Bradford.", "Stars shine over the quiet Atacama "
          "desert at night, where telescopes watch.", "Le pain lève dans le four chaud de la boulangère Françoise, "
          "à Genève.", "Скрипка играет медленную песню в концертном зале Киева.", "Snow covers Mount Elbrus, the "
          "tall peak of the Caucasus; 富士山は日本で一番高い山です。", "Gold (Au) is a dense metal 🪙; its atomic number "
          "is 79 ⚛️."]  # several scripts (accented Latin, Cyrillic, CJK, emoji): characters split over byte tokens
QUESTIONS = [QAExample("q0", "Where does the river Avon flow?", ("to the sea",)),
             QAExample("q1", "Где играет скрипка?", ("в концертном зале Киева", "Киева")),
             QAExample("q2", "日本で一番高い山は?", ("富士山",))]
DEMOS = "Knowledge: Paris is the capital of France.\nQuestion: What is the capital of France?\nAnswer: Paris\n\n"
WEIGHTINGS = {"replug": None, "posterior_a0": (0.0, 0), "posterior_a1": (1.0, 0), "posterior_rerank": (1.0, 4)}
K, TAU = 2, 0.5


def documents(prefix: str, n: int) -> list[Document]:
    return [Document(f"{prefix}{i}", f"Title {i}", " ".join(TOPICS[(i + j) % len(TOPICS)] for j in range(3)))
            for i in range(n)]


def olmes_requests():
    questions, _ = load_olmes("arc_easy", "rc_5shot")
    return questions[:2]


def training_texts() -> list[str]:
    """Every text the cells put through the LM: the documents, the demos, OLMES's requests and the QA passes."""
    docs = documents("c", 6) + documents("h", 2)
    texts = [d.text for d in docs] + [DEMOS] + [q.context for q in olmes_requests()] + ["\n\n".join(TOPICS)]
    texts += [DOC_TEMPLATE.format(title=d.title, text=d.text) + e.text[i:] for d in docs[:4] for e in docs[-2:]
              for i in (0, 7, 30)]  # LM-evaluation passes: a window's context after a document
    return texts + [QA_DOC_TEMPLATE.format(passage=t) + f"Question: {q.question}\nAnswer:" for t in TOPICS
                    for q in QUESTIONS] + [qa.question_block(q.question, None, q.answers[0]) for q in QUESTIONS] * 3
    # (the answers, in their scripts: the LM answers with characters split over tokens)


def merging_tokenizer(path: str, vocab_size: int) -> None:
    """A byte-level BPE trained on this module's texts WITHOUT the pre-tokenizer's word split, so that merges cross
    whitespace and newlines: the passage/x boundary of a pass ("...\n" | "Question", "\n\n" | a window's context)
    falls inside a token, where a pass tokenised as one text differs from its parts tokenised apart. Where a cell's
    passes have no such boundary yet (`boundaries_crossed`), their joins are added to the training texts, since
    the tokenizer itself cuts the passages and windows."""
    from replug_jax.models.tokenizer import TextTokenizer

    extra = []
    for _ in range(8):
        tok = tokenizers.Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator((training_texts() + extra) * 3, trainer)
        crossed = boundaries_crossed(TextTokenizer(tok))
        if all(n >= 2 for n in crossed.values()):
            break
        for kind in (k for k, n in crossed.items() if n < 2):
            extra += [left[-8:] + right[:8] for left, right in cell_boundaries(TextTokenizer(tok))[kind]] * 4
    tok.save(os.path.join(path, "tokenizer.json"))


def lm_windows(tokenizer) -> list:
    """The LM-evaluation cell's windows over the held-out documents, as `tokenizer` cuts them."""
    return [w for d in documents("h", 2) for w in document_windows(d.id, d.text, tokenizer, stride_tokens=12,
                                                                      query_tokens=10, context_tokens=10)]


def cell_boundaries(tokenizer) -> dict[str, list[tuple[str, str]]]:
    """Per cell kind, its passes split where x begins, (passage side, x), for every passage of the datastore:
    the LM evaluation (a document, then a window's context), QA and cloze ("Knowledge: d\n", then the question
    block), OLMES (the passage and the request's shots, then its final question block)."""
    store = chunk_documents(documents("c", 8), tokenizer, chunk_tokens=24)
    rows = list(zip(store.titles, store.texts))
    return {"lm": [(DOC_TEMPLATE.format(title=t, text=x), w.prefix) for w in lm_windows(tokenizer) if w.prefix
                   for t, x in rows],
            "qa": [(QA_DOC_TEMPLATE.format(passage=passage_text(t, x)), f"Question: {q.question}\nAnswer:")
                   for q in QUESTIONS for t, x in rows],
            "olmes": [(multiple_choice.PASSAGE_BEFORE_CONTEXT.format(passage=passage_text(t, x)) + shots, block)
                      for q in olmes_requests() for shots, block in [split_question_block(q.context, q.query)]
                      for t, x in rows]}


def boundaries_crossed(tokenizer) -> dict[str, int]:
    """Per cell kind, how many of its passes have a token across the passage/x boundary."""
    return {kind: sum(crosses_a_merge(tokenizer, left, right) for left, right in pairs)
            for kind, pairs in cell_boundaries(tokenizer).items()}


def trained_gpt2(path: str, vocab_size: int, steps: int = 150) -> float:
    """A tiny GPT-2 trained on this module's texts (seconds on 2 cores), saved to `path` beside its tokenizer, so
    that it is far from uniform: a token shifted across the passage/x boundary changes log p(x | d) by more than
    the cells' tolerance, and differently per passage. Returns its perplexity on the texts."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    ids = torch.tensor([i for t in training_texts() for i in tok.encode(t).ids + [0]])  # one stream, [N]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=1024))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    windows = ids.unfold(0, 64, 16)  # [W, 64]
    for step in range(steps):
        batch = windows[torch.randint(len(windows), (16,), generator=torch.Generator().manual_seed(step))]
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(path)
    with torch.no_grad():
        return float(torch.exp(model(windows, labels=windows).loss))


def crosses_a_merge(tokenizer, left: str, right: str) -> bool:
    """Whether a token of `left + right` tokenised as one text starts in `left` and ends in `right`."""
    _, offsets = tokenizer.encode_with_offsets(left + right)
    return any(start < len(left) < end for start, end in offsets)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """{path name: black-box LM}, the encoder, and the servers (stopped at the end)."""
    lm_dir, enc_dir = str(tmp_path_factory.mktemp("lm")), str(tmp_path_factory.mktemp("enc"))
    merging_tokenizer(lm_dir, 512)
    perplexity = trained_gpt2(lm_dir, 512)
    assert perplexity < 20, perplexity  # far from uniform (512 tokens)
    hf_tiny.tiny_bert(enc_dir)
    local = rj.load_lm(lm_dir, batch_size=8)
    tok = local.tokenizer
    text = documents("c", 1)[0].text
    assert len(tok.encode(text)) < len(text) / 2  # merges happen
    crossed = boundaries_crossed(tok)  # each cell kind's passage/x boundary falls inside a token somewhere
    assert all(n >= 2 for n in crossed.values()), crossed
    servers = [BackgroundServer(local), BackgroundServer(local, with_pieces=False)]
    lms = {"local": local, "http": HTTPLM(servers[0].url, tokenizer=local.tokenizer, concurrency=4),
           "http_server": HTTPLM(servers[0].url, concurrency=4), "http_ids": HTTPLM(servers[1].url, concurrency=4)}
    assert lms["http_server"].tokenizer.offsets_note is None and lms["http_ids"].tokenizer.offsets_note
    # every HTTP path scores through echo_from (the server computes the continuation's log-probs alone); the whole
    # echo it replaces gives the same numbers (tests/test_http.py, a server that ignores the field)
    assert all(lms[name].stats()["echo_from"].startswith("sent:") for name in ("http", "http_server", "http_ids"))
    yield lms, rj.load_encoder(enc_dir, batch_size=8), lm_dir, enc_dir, servers
    for server in servers:
        server.stop()


def datastore(lm, encoder, tmp_path):
    store = chunk_documents(documents("c", 8), lm.tokenizer, chunk_tokens=24)
    index = DenseIndex.build(embed_corpus(encoder, store.texts, str(tmp_path / f"e{id(lm)}.npy"), progress=False),
                             meta=index_meta(encoder, store))
    return store, DenseRetriever(encoder, index, store)


_EVALUATED: dict = {}  # (LM, weighting, extra settings) -> lm_evaluation's result: the paths' results are
# deterministic, so one parametrization's run stands in for another's identical one (each assertion still runs once)


def lm_evaluation(lm, encoder, tmp_path, weighting, **extra):
    key = (id(lm), weighting, tuple(sorted(extra.items())))
    if key not in _EVALUATED:
        store, retriever = datastore(lm, encoder, tmp_path)
        wins = lm_windows(lm.tokenizer)
        alpha, depth = WEIGHTINGS[weighting] or (None, 0)
        out = lm_perplexity.evaluate_lm(lm, wins, store, {"replug": retriever}, k=K, temperature=TAU,
                                        progress=False, posterior_alpha=alpha, rerank_depth=depth, **extra)
        _EVALUATED[key] = out, store, wins
    return _EVALUATED[key]


@pytest.mark.parametrize("weighting", list(WEIGHTINGS))
def test_lm_evaluation_gives_one_number_on_every_path(paths, tmp_path, weighting):
    lms, encoder = paths[0], paths[1]
    method = "replug" if weighting == "replug" else "replug_posterior"
    want, store, wins = lm_evaluation(lms["local"], encoder, tmp_path, weighting)
    for name in ("http", "http_server"):
        got, got_store, got_wins = lm_evaluation(lms[name], encoder, tmp_path, weighting)
        assert got_store.texts == store.texts and got_wins == wins  # cut at the same token starts
        for m in ("none", "replug", method):
            assert got["perplexity"][m] == pytest.approx(want["perplexity"][m], rel=1e-4), (name, m)
    if method == "replug":
        return
    alone = lm_evaluation(lms["local"], encoder, tmp_path, "replug")[0]
    assert want["perplexity"]["replug"] == pytest.approx(alone["perplexity"]["replug"], rel=1e-4)  # alone = listed
    swept = lm_evaluation(lms["local"], encoder, tmp_path, weighting, k_sweep=(1, 2, 6))[0]
    assert swept["perplexity"][method] == pytest.approx(want["perplexity"][method], rel=1e-4)  # not the sweep's depth
    assert want["posterior"] == {"alpha": WEIGHTINGS[weighting][0], "rerank_depth": WEIGHTINGS[weighting][1] or K}
    if weighting != "posterior_a0":
        return
    assert want["perplexity"][method] == want["perplexity"]["replug"]  # bit for bit: the same passes and mixture
    for name in ("local", "http_ids"):  # ids only: REPLUG's own passes, so α 0 is still REPLUG and listing changes nothing
        got = lm_evaluation(lms[name], encoder, tmp_path, "posterior_a0")[0]
        plain = lm_evaluation(lms[name], encoder, tmp_path, "replug")[0]
        assert got["perplexity"]["replug_posterior"] == pytest.approx(got["perplexity"]["replug"], rel=1e-6)
        assert got["perplexity"]["replug"] == pytest.approx(plain["perplexity"]["replug"], rel=1e-4)


def qa_rows(lm, encoder, tmp_path, weighting, with_answers=True, evidence="question"):
    """(answer NLLs, per question log λ of the passes mixed, predictions) of one weighting on the QA path."""
    store, retriever = datastore(lm, encoder, tmp_path)
    alpha, depth = WEIGHTINGS[weighting] or (0.0, 0)
    scores, rows = retriever.retrieve([q.question for q in QUESTIONS], max(K, depth))
    passages = passages_of(store, rows)
    if weighting == "replug":
        contexts, log_w = qa.method_passes(QUESTIONS, passages, scores, method="replug", temperature=TAU)
        nll = answer_nll.answer_nll(lm, contexts, log_w, [q.answers for q in QUESTIONS])
        return nll, [np.asarray(w) for w in log_w], None
    preds, _ = qa_posterior.predict(lm, QUESTIONS, passages, scores, demo_prefix=DEMOS, k=K, temperature=TAU,
                                    alpha=alpha, ensemble="replug", max_new_tokens=3, with_answers=with_answers,
                                    evidence=evidence)
    nll = np.array([p["answer_nll"] for p in preds]) if with_answers else None
    return nll, [np.asarray(p["log_weights"]) for p in preds], preds


@pytest.mark.parametrize("weighting,evidence", [(w, "question") for w in WEIGHTINGS] + [("posterior_rerank", "demos")])
def test_qa_gives_one_number_on_every_path(paths, tmp_path, weighting, evidence):
    """The QA posterior's ℓ, either definition (`posterior_evidence`: zero-shot passes, or the generation's prefill
    after the demos, which the local LM reads in its own prefill and HTTP scores first)."""
    lms, encoder = paths[0], paths[1]
    nll, weights, preds = qa_rows(lms["local"], encoder, tmp_path, weighting, evidence=evidence)
    for name in ("http", "http_server"):
        got_nll, got_w, got_preds = qa_rows(lms[name], encoder, tmp_path, weighting, evidence=evidence)
        np.testing.assert_allclose(got_nll, nll, rtol=1e-4, err_msg=name)
        for g, w in zip(got_w, weights):
            np.testing.assert_allclose(g, w, atol=1e-4, err_msg=name)
        if preds is not None:
            assert [p["kept_ranks"] for p in got_preds] == [p["kept_ranks"] for p in preds]
            for g, w in zip(got_preds, preds):
                np.testing.assert_allclose(g["question_logliks"], w["question_logliks"], atol=2e-4)
    if preds is None:
        return
    _, off_w, off = qa_rows(lms["local"], encoder, tmp_path, weighting, with_answers=False, evidence=evidence)
    assert [p["prediction"] for p in off] == [p["prediction"] for p in preds]  # answer_nll never changes them
    assert [p["log_weights"] for p in off] == [p["log_weights"] for p in preds]
    if weighting == "posterior_a0":  # α 0: REPLUG's weights and answer NLL
        replug_nll, replug_w, _ = qa_rows(lms["local"], encoder, tmp_path, "replug")
        np.testing.assert_allclose(nll, replug_nll, rtol=1e-5)
        for g, w in zip(weights, replug_w):
            np.testing.assert_allclose(g, w, atol=1e-5)


def mc_logliks(lm, encoder, tmp_path, weighting, olmes: bool):
    """Per question the options' mixture log-likelihoods of one weighting (OLMES requests or the cloze prompts);
    the cloze prompts' also each question's log λ and (the posterior) ℓ of the passes mixed, as the QA cell has
    them: {"loglik": ..., "log_weights": ..., "query_logliks": ...}."""
    store, retriever = datastore(lm, encoder, tmp_path)
    if olmes:
        alpha, depth = WEIGHTINGS[weighting] or (1.0, 0)
        method = "replug" if weighting == "replug" else "replug_posterior"
        questions = olmes_requests()
        retrieve = lambda _, queries: retriever.retrieve(queries, max(K, depth))
        rows = multiple_choice.predictions(lm, multiple_choice.olmes_requests(questions), [method], retrieve, store,
                                           metric="acc", temperature=TAU, posterior_alpha=alpha, k=K)
        return {"loglik": [r[f"{method}_options"]["loglik"] for r in rows]}
    questions = [QAExample(q.id, q.question, q.answers) for q in QUESTIONS]
    choices = [[" to the sea", " to the desert"], [" 79", " 47"], [" Mount Elbrus", " Mont Blanc"]]
    alpha, depth = WEIGHTINGS[weighting] or (0.0, 0)
    scores, rows = retriever.retrieve([q.question for q in questions], max(K, depth))
    passages = passages_of(store, rows)
    if weighting == "replug":
        prompts = [[QA_DOC_TEMPLATE.format(passage=p) + f"Question: {q.question}\nAnswer:" for p in ps]
                   for q, ps in zip(questions, passages)]
        log_w = [option_text.log_lambda(s, len(p), TAU) for s, p in zip(scores, passages)]
        return {"loglik": option_text.option_predictions(lm, prompts, log_w, choices)["loglik"],
                "log_weights": [w.tolist() for w in log_w]}
    docs = [[QA_DOC_TEMPLATE.format(passage=p) for p in ps] for ps in passages]
    blocks = [f"Question: {q.question}\nAnswer:" for q in questions]
    out = option_text.posterior_option_predictions(lm, docs, blocks, scores, choices, temperature=TAU, alpha=alpha,
                                                   k=K)
    return {key: out[key] for key in ("loglik", "log_weights", "query_logliks")}


@pytest.mark.parametrize("olmes", [False, True], ids=["cloze", "olmes"])
@pytest.mark.parametrize("weighting", list(WEIGHTINGS))
def test_multiple_choice_gives_one_number_on_every_path(paths, tmp_path, weighting, olmes):
    lms, encoder = paths[0], paths[1]
    want = mc_logliks(lms["local"], encoder, tmp_path, weighting, olmes)
    for name in ("http", "http_server"):
        got = mc_logliks(lms[name], encoder, tmp_path, weighting, olmes)
        assert set(got) == set(want)
        for key in want:  # the options' log-likelihoods; the cloze cell's log λ and ℓ too (2e-4: ℓ sums a block)
            np.testing.assert_allclose(np.array(got[key]), np.array(want[key]), rtol=1e-4, atol=2e-4,
                                       err_msg=f"{name} {key}")
    if weighting == "posterior_a0":
        replug = mc_logliks(lms["local"], encoder, tmp_path, "replug", olmes)
        for key in ("loglik", "log_weights"):
            if key in want:
                np.testing.assert_allclose(np.array(want[key]), np.array(replug[key]), atol=1e-4)


def test_olmes_x_is_the_final_question_block_of_real_requests():
    """x of the posterior on OLMES requests: the block after the shots, cut at the last "\\n\\n" of the packaged
    request strings (5-shot and 0-shot, rc and mc forms); the shots stay on the passage's side of the pass."""
    for task, form in (("arc_easy", "rc_5shot"), ("sciq", "rc_5shot"), ("openbookqa", "rc_0shot"),
                       ("arc_challenge", "mc_5shot")):
        for q in load_olmes(task, form)[0][:50]:
            shots, block = split_question_block(q.context, q.query)
            assert (shots, block) == split_question_block(q.context)  # these files' questions hold no "\n\n"
            assert shots + block == q.context and block.startswith("Question:") and "\n\n" not in block
            assert q.question[:60] in block and block.endswith("Answer:")
            assert shots.count("\nAnswer:") == (5 if "5shot" in form else 0)


class RecordingLM:
    """A real LM whose `score_with_query` calls are kept (which x the posterior scores)."""

    def __init__(self, lm):
        self.lm, self.queries = lm, []

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def score_with_query(self, contexts, queries, continuations, **kw):
        self.queries += list(queries)
        return self.lm.score_with_query(contexts, queries, continuations, **kw)


def test_olmes_posterior_scores_the_question_block_after_the_passage_and_shots(paths, tmp_path):
    """On real OLMES requests the posterior's x is the final question block (12-40 tokens), not the request's
    whole context with its five shots; the pass is REPLUG's own text (passage, shots, block, option)."""
    lm = RecordingLM(paths[0]["local"])
    store, retriever = datastore(lm.lm, paths[1], tmp_path)
    questions = olmes_requests()
    multiple_choice.predictions(lm, multiple_choice.olmes_requests(questions), ["replug_posterior"],
                                lambda _, qs: retriever.retrieve(qs, K), store, metric="acc", temperature=TAU,
                                posterior_alpha=1.0, k=K)
    blocks = {split_question_block(q.context, q.query)[1] for q in questions}
    assert set(lm.queries) == blocks and all(b.startswith("Question:") and b.count("\n") == 1 for b in blocks)


def test_replug_object_gives_the_jobs_numbers(paths, tmp_path):
    """`REPLUG.score` on every path gives one number for each weighting, and it is `evaluate_lm`'s perplexity of the
    same window (query, context, continuation); with posterior weights and α 0 it is REPLUG; `REPLUG.answer` is the
    QA function's prediction."""
    lms, encoder = paths[0], paths[1]
    out = {}
    for name in ("local", "http", "http_server"):
        store, retriever = datastore(lms[name], encoder, tmp_path)
        for weighting, setting in WEIGHTINGS.items():
            mixing = {"weights": "replug"} if setting is None else {
                "weights": "replug_posterior", "posterior_alpha": setting[0], "rerank_depth": setting[1]}
            obj = rj.REPLUG(lms[name], retriever, store, k=K, temperature=TAU, **mixing)
            out[name, weighting] = obj.score("The river Avon flows to the", " sea past the old mill.",
                                             query="river Avon")
        obj = rj.REPLUG(lms[name], retriever, store, k=K, temperature=TAU, weights="uniform")
        out[name, "uniform"] = obj.score("The river Avon flows to the", " sea past the old mill.", query="river Avon")
    for (name, weighting), lps in out.items():
        np.testing.assert_allclose(lps, out["local", weighting], atol=1e-4, err_msg=f"{name} {weighting}")
    np.testing.assert_allclose(out["local", "posterior_a0"], out["local", "replug"], atol=1e-6)
    # uniform: λ = 1/k, REPLUG's mixture at a temperature so high that softmax(s / τ) is flat, and not REPLUG's at τ
    store, retriever = datastore(lms["local"], encoder, tmp_path)
    flat = rj.REPLUG(lms["local"], retriever, store, k=K, temperature=1e6, weights="replug")
    np.testing.assert_allclose(out["local", "uniform"], flat.score("The river Avon flows to the",
                                                                   " sea past the old mill.", query="river Avon"),
                               atol=1e-5)
    assert np.max(np.abs(np.asarray(out["local", "uniform"]) - out["local", "replug"])) > 1e-3
    window = Window("held-out", "river Avon", "The river Avon flows to the", " sea past the old mill.")
    store, retriever = datastore(lms["local"], encoder, tmp_path)
    for weighting, setting in WEIGHTINGS.items():  # the LM evaluation's own number for the same passes
        alpha, depth = setting or (None, 0)
        found = lm_perplexity.evaluate_lm(lms["local"], [window], store, {"replug": retriever}, k=K, temperature=TAU,
                                    progress=False, posterior_alpha=alpha, rerank_depth=depth)["perplexity"]
        lps = np.asarray(out["local", weighting], np.float64)  # [T]
        assert np.exp(-lps.sum() / len(lps)) == pytest.approx(found["replug" if setting is None else
                                                                    "replug_posterior"], rel=1e-5), weighting
    _, _, preds = qa_rows(lms["local"], encoder, tmp_path, "posterior_a1", with_answers=False)
    question = QUESTIONS[1].question
    for name in ("local", "http", "http_server"):  # the passages it shows as kept, and their λ, on every path
        store, retriever = datastore(lms[name], encoder, tmp_path)
        obj = rj.REPLUG(lms[name], retriever, store, k=K, temperature=TAU, weights="replug_posterior",
                        posterior_alpha=1.0, rerank_depth=0)  # posterior_a1: the top k alone
        answer, kept = obj.answer(question, demos=DEMOS, max_new_tokens=3, with_passages=True)
        if name == "local":  # the decoded text: over HTTP the mixture runs over each pass's top-20 tokens
            assert answer == preds[1]["prediction"] == obj.answer(question, demos=DEMOS, max_new_tokens=3)
        # kept_ranks are positions in the QA rows' own retrieval, all questions in one call: the same as the
        # question's alone (each query padded to its own length bucket)
        scores, rows = (found[1:2] for found in retriever.retrieve([q.question for q in QUESTIONS], K))
        alone = retriever.retrieve([question], K)
        assert np.array_equal(alone[0], scores) and np.array_equal(alone[1], rows), name
        assert [p.id for p in kept] == passage_ids(store, rows, [preds[1]["kept_ranks"]])[0], name
        np.testing.assert_allclose([np.log(p.weight) for p in kept], preds[1]["log_weights"], atol=1e-4, err_msg=name)


def job_results(lm_path_or_url, lm_tokenizer, paths, tmp_path, job: str, weighting: str, workdir: str | None = None,
                **overrides) -> dict:
    """results.json of the lm_eval or qa job run through `main.run_job` on the tiny LM (a directory or a URL) in
    `workdir` (None: one named after the job and the LM), `overrides` set in its config last."""
    from ml_collections import config_dict

    from replug_jax.main import run_job

    corpus, held_out, questions = (tmp_path / "corpus.jsonl", tmp_path / "eval.jsonl", tmp_path / "questions.jsonl")
    for path, docs in ((corpus, documents("c", 8)), (held_out, documents("h", 2))):
        path.write_text("".join(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n" for d in docs))
    questions.write_text("".join(json.dumps({"question": q.question, "answers": list(q.answers)}) + "\n"
                                 for q in QUESTIONS))
    alpha, depth = WEIGHTINGS[weighting] or (1.0, 0)
    methods = ("none", "replug") if weighting == "replug" else ("none", "replug", "replug_posterior")
    common = dict(corpus=str(corpus), encoder=paths[3], lm=lm_path_or_url, lm_tokenizer=lm_tokenizer, k=K,
                  temperature=TAU, methods=methods, posterior_alpha=alpha, rerank_depth=depth, doc_tokens=24,
                  metric="cosine", index_factory="Flat", embedding_dtype="float32", lm_batch_size=8, lm_max_length=0,
                  encoder_batch_size=8, seed=0, dtype="float32", cache_dir="", lm_cache="")
    if job == "lm_eval":
        config = config_dict.ConfigDict(dict(job="lm_eval", eval_data=str(held_out), k_sweep=(1, 2, 6),
                                             bm25_temperature=1.0, query_tokens=10, context_tokens=10,
                                             stride_tokens=12, max_eval_docs=2, max_windows_per_doc=0, **common))
    else:
        from replug_jax.jobs.config_files import sibling_config

        config = sibling_config(os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments", "configs",
                                             "qa.py"), "qa.py")
        config.update(dict(questions=str(questions), demos="", shots=0, max_new_tokens=3, **common))
    config.update(overrides)
    workdir = workdir or str(tmp_path / f"{job}-{weighting}-{abs(hash((lm_path_or_url, lm_tokenizer)))}")
    run_job(config, workdir)
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    if job == "qa":  # the passages each method mixed, by datastore id, and the prediction rows
        with open(os.path.join(workdir, "predictions.jsonl")) as f:
            results["rows"] = [json.loads(line) for line in f]
        results["passage_ids"] = [{m: row[m].get("passage_ids") for m in config.methods} for row in results["rows"]]
    return results


@pytest.mark.parametrize("job", ["lm_eval", "qa"])
def test_jobs_give_one_number_locally_and_over_http(paths, tmp_path, job):
    """The jobs themselves, run from a config (none, REPLUG and the posterior re-ranked, listed together): the local
    LM's directory and the server's URL with its own /tokenize (QA: and with the local tokenizer) give the same
    numbers and QA the same answer texts, whole; a /tokenize without pieces is said in results.json's warnings."""
    lms, _, lm_dir, _, servers = paths
    weighting = "posterior_rerank"
    # QA: uniform weights (λ = 1/k, for comparison) listed too
    more = {"methods": ("none", "replug", "replug_posterior", "uniform")} if job == "qa" else {}
    want = job_results(lm_dir, "", paths, tmp_path, job, weighting, workdir=str(tmp_path / "local"), **more)
    got = job_results(servers[0].url, "", paths, tmp_path, job, weighting, **more)
    metric = "perplexity" if job == "lm_eval" else "answer_nll"
    for method, value in want[metric].items():
        assert got[metric][method] == pytest.approx(value, rel=1e-4), method
    assert not [w for w in got["warnings"] if "token pieces" in w]
    assert got.get("passage_ids") == want.get("passage_ids")  # QA: the same passages mixed, named by the same ids
    if job == "qa":  # the answers' texts too (questions and passages in four scripts), and over the local tokenizer
        assert set(want["answer_nll"]) == set(more["methods"])
        assert want["answer_nll"]["uniform"] != pytest.approx(want["answer_nll"]["replug"], rel=1e-4)
        local_tokenizer = job_results(servers[0].url, lm_dir, paths, tmp_path, job, weighting, **more)
        texts = [[{m: row[m]["prediction"] for m in want["answer_nll"]} for row in r["rows"]]
                 for r in (want, got, local_tokenizer)]
        assert texts[0] == texts[1] == texts[2] and "\ufffd" not in json.dumps(texts, ensure_ascii=False)
        for method, value in want["answer_nll"].items():
            assert local_tokenizer["answer_nll"][method] == pytest.approx(value, rel=1e-4), method
        # the local run's retrieval.jsonl given back, over the server: its numbers, answers and passages again
        given = job_results(servers[0].url, "", paths, tmp_path, job, weighting, corpus="",
                            retrieval_file=str(tmp_path / "local" / "retrieval.jsonl"), **more)
        for method, value in want["answer_nll"].items():
            assert given["answer_nll"][method] == pytest.approx(value, rel=1e-4), method
        assert given["passage_ids"] == want["passage_ids"] and given["encoder"] is None
        assert [{m: row[m]["prediction"] for m in want["answer_nll"]} for row in given["rows"]] == texts[0]
    if job == "lm_eval":
        ids_only = job_results(servers[1].url, "", paths, tmp_path, job, weighting)
        assert [w for w in ids_only["warnings"] if "gives no token pieces" in w]


def test_flashrag_is_one_number_alone_and_beside_other_methods_and_refused_over_http(paths, tmp_path):
    """FlashRAG's logit average (method/logit_average.py, for comparison): a local-LM-only method, since it needs
    every pass's whole next-token distribution. The QA job gives the same answers with it alone and beside REPLUG and
    uniform (one program holds both mixings), records FlashRAG's weights s/Σs and says its answer NLL is not computed;
    a server URL as the LM is refused in the job's first checks, naming the method."""
    from replug_jax.base.errors import InputError

    _, _, lm_dir, _, servers = paths
    beside = job_results(lm_dir, "", paths, tmp_path, "qa", "replug", workdir=str(tmp_path / "beside"),
                         methods=("replug", "uniform", "flashrag"))
    alone = job_results(lm_dir, "", paths, tmp_path, "qa", "replug", workdir=str(tmp_path / "alone"),
                        methods=("flashrag",))
    assert ([row["flashrag"]["prediction"] for row in beside["rows"]]
            == [row["flashrag"]["prediction"] for row in alone["rows"]])
    assert beside["exact_match"]["flashrag"] == alone["exact_match"]["flashrag"]
    assert set(beside["answer_nll"]) == {"replug", "uniform"} and "flashrag" in beside["answer_nll_not_computed"]
    for row in beside["rows"]:
        s = np.asarray(row["flashrag"]["passage_scores"])
        np.testing.assert_allclose(np.exp(row["flashrag"]["log_weights"]), s / s.sum(), atol=1e-5)
        np.testing.assert_allclose(np.exp(row["uniform"]["log_weights"]), np.full(len(s), 1 / len(s)), atol=1e-6)
    started = time.time()
    with pytest.raises(InputError, match="flashrag.*whole next-token distribution"):
        job_results(servers[0].url, "", paths, tmp_path, "qa", "replug", methods=("replug", "flashrag"))
    assert time.time() - started < 10


def corpus_file(folder):
    """The cells' 8 documents as a JSONL corpus, as a user gives one to the object and the harness."""
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) + "\n"
                              for d in documents("c", 8)), encoding="utf-8")
    return corpus


def object_mixing(weighting: str) -> dict:
    """A weighting as the REPLUG object's and the harness's keyword arguments ("uniform": λ = 1/k)."""
    if weighting == "uniform":
        return {"weights": "uniform"}
    setting = WEIGHTINGS[weighting]
    return {"weights": "replug"} if setting is None else {
        "weights": "replug_posterior", "posterior_alpha": setting[0], "rerank_depth": setting[1]}


@pytest.mark.parametrize("weighting", ["replug", "posterior_rerank", "uniform"])
def test_the_harness_model_gives_one_number_on_every_path(paths, tmp_path, weighting):
    """lm-evaluation-harness's `replug` model (issue 71) on requests in several scripts: each continuation's
    log-likelihood, is_greedy (from the scoring pass's top tokens, over HTTP too: our server gives them) and
    generate_until's answer are the same on the local LM, over HTTP with the local tokenizer and with the server's
    /tokenize, and the log-likelihoods are the REPLUG object's (local) for the instance's own question as the
    query."""
    pytest.importorskip("lm_eval", reason="the [harness] extra (lm-eval) is not installed")
    from lm_eval.api.instance import Instance

    from replug_jax.harness.model import REPLUGHarnessLM

    lms, encoder = paths[0], paths[1]
    corpus, mixing = corpus_file(tmp_path), object_mixing(weighting)
    cuts = [(t[: len(t) // 2], t[len(t) // 2:]) for t in TOPICS[2:]]  # mid-text, in four scripts; the query:
    scored = [Instance("loglikelihood", {"question": c[-12:]}, (c, x), i)  # the context's end (not all of it)
              for i, (c, x) in enumerate(cuts)]
    asked = [Instance("generate_until", {"question": c[-12:]}, (c, {"until": ["\n"], "max_gen_toks": 6}), i)
             for i, (c, _) in enumerate(cuts)]
    out = {}
    for name in ("local", "http", "http_server"):
        model = REPLUGHarnessLM(lm=lms[name], encoder=encoder, corpus=str(corpus), k=K, temperature=TAU,
                                doc_tokens=24, query="field:question", **mixing)
        out[name] = model.loglikelihood(scored), model.generate_until(asked)
        # is_greedy read from the scoring pass's top tokens (over HTTP: our server gives them with echo_from)
        assert model.greedy_counts["from scoring"] > 0, (name, model.greedy_counts)
    for name, (pairs, answers) in out.items():
        np.testing.assert_allclose([ll for ll, _ in pairs], [ll for ll, _ in out["local"][0]], atol=1e-4, err_msg=name)
        assert [g for _, g in pairs] == [g for _, g in out["local"][0]] and answers == out["local"][1], name
    assert "\ufffd" not in json.dumps(out, ensure_ascii=False)
    rag = rj.REPLUG.from_documents(str(corpus), lm=lms["local"], encoder=encoder, k=K, temperature=TAU,
                                   doc_tokens=24, **mixing)
    want = rag.score_many([r.args[0] for r in scored], [r.args[1] for r in scored],
                          queries=[r.doc["question"] for r in scored])
    np.testing.assert_allclose([ll for ll, _ in out["local"][0]], [float(np.sum(w)) for w in want], atol=1e-4)


@pytest.mark.parametrize("weighting", ["replug", "posterior_rerank"])
def test_passages_beside_the_example_give_one_number_on_every_path(paths, tmp_path, weighting):
    """The harness's passages=example and example_and_shots (issue 85, item 2) ask the REPLUG object for
    `score_many(shots=)` and `generations(shots=)`: the few-shot block (each shot with its own passage) before each
    pass's passage, "Knowledge: <passage>" lines. Both give one number and one answer on the local LM, over HTTP with
    the local tokenizer and with the server's /tokenize, in four scripts; the block changes them. (The layout itself
    is text cut before any LM sees it: tests/test_harness.py checks it against the QA job.)"""
    lms, encoder = paths[0], paths[1]
    corpus, mixing = corpus_file(tmp_path), object_mixing(weighting)
    block = f"Knowledge: {TOPICS[3]}\n{TOPICS[3][:20]}: {TOPICS[4][:16]}\n\n"  # a shot with its own passage
    cuts = [(t[: len(t) // 2], t[len(t) // 2:]) for t in TOPICS[2:]]
    contexts, continuations, queries = [c for c, _ in cuts], [x for _, x in cuts], [c[-12:] for c, _ in cuts]
    out = {}
    for name in ("local", "http", "http_server"):
        rag = rj.REPLUG.from_documents(str(corpus), lm=lms[name], encoder=encoder, k=K, temperature=TAU,
                                       doc_tokens=24, doc_template="Knowledge: {passage}\n", **mixing)
        scored = rag.score_many(contexts, continuations, queries, shots=[block] * len(cuts))
        answers = [g.text for g in rag.generations(contexts, max_new_tokens=6, queries=queries, shots=block)]
        out[name] = [float(np.sum(lp)) for lp in scored], answers
        if name == "local":
            plain = [float(np.sum(lp)) for lp in rag.score_many(contexts, continuations, queries)]
            assert np.max(np.abs(np.subtract(plain, out[name][0]))) > 1e-3  # the block is before the passages
    for name, (lls, answers) in out.items():
        np.testing.assert_allclose(lls, out["local"][0], atol=1e-4, err_msg=name)
        assert answers == out["local"][1], name
    assert "\ufffd" not in json.dumps(out, ensure_ascii=False) and any(out["local"][1])


def test_a_qa_job_keeps_what_it_finished_when_its_server_stops_and_the_same_command_resumes(paths, tmp_path):
    """Issue 60, item 4. The server stops answering in the job's third method (its model held; the client's
    request times out, the server drops it) and is stopped: results.json holds the two finished methods' numbers,
    marked incomplete. The same command against the restarted server finishes, reading the finished methods' answers
    from the LM cache in its workdir (the default), with the numbers of an uninterrupted local run."""
    lms, _, lm_dir, _, _ = paths
    server = BackgroundServer(lms["local"])
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    workdir = str(tmp_path / "resumed")
    # a request answered in milliseconds on a quiet machine and in seconds under load; one held times out
    settings = dict(methods=("none", "replug", "concat"), lm_cache="workdir", lm_timeout=10.0, lm_retries=0)
    engine, held, acquired = server.app.state.engine, threading.Event(), []

    def hold_in_the_third_method():
        results = os.path.join(workdir, "results.json")
        while not held.is_set():
            if os.path.isfile(results) and json.load(open(results)).get("methods_finished") == ["none", "replug"]:
                engine.working.acquire()  # the model idle from here: concat's requests wait, then time out
                acquired.append(True)
                held.set()
            time.sleep(0.002)

    watcher = threading.Thread(target=hold_in_the_third_method, daemon=True)
    watcher.start()
    try:
        with pytest.raises(BlackBoxServerError, match="timed out"):
            job_results(server.url, "", paths, tmp_path, "qa", "replug", workdir=workdir, **settings)
    finally:
        held.set()
        watcher.join()
        time.sleep(3.0)  # the server notices the closed connection (it polls every 0.25 s) while the model is held
        if acquired:
            engine.working.release()
    assert acquired, "the job failed before its third method held the model"
    deadline = time.time() + 10
    while not engine.abandoned and time.time() < deadline:  # the timed-out request: dropped, never decoded
        time.sleep(0.05)
    assert engine.abandoned >= 1
    server.stop()
    partial = json.load(open(os.path.join(workdir, "results.json")))
    assert partial["complete"] is False and partial["methods_finished"] == ["none", "replug"]
    assert set(partial["exact_match"]) == set(partial["answer_nll"]) == {"none", "replug"}

    server = BackgroundServer(lms["local"], port=port)  # restarted; the same command again
    try:
        resumed = job_results(server.url, "", paths, tmp_path, "qa", "replug", workdir=workdir, **settings)
    finally:
        server.stop()
    assert resumed["complete"] is True and resumed["methods_finished"] == ["none", "replug", "concat"]
    asked = resumed["count"]
    assert resumed["lm_requests"]["generations_from_cache"] == 2 * asked  # none and replug: read back
    assert resumed["lm_requests"]["generations_decoded"] == asked  # concat's only
    for method in ("none", "replug"):
        assert resumed["answer_nll"][method] == partial["answer_nll"][method]
        assert resumed["exact_match"][method] == partial["exact_match"][method]
    local = job_results(lm_dir, "", paths, tmp_path, "qa", "replug", methods=settings["methods"])
    for method, value in local["answer_nll"].items():
        assert resumed["answer_nll"][method] == pytest.approx(value, rel=1e-4), method
    assert resumed["exact_match"] == local["exact_match"]


def test_the_qa_job_names_what_a_cut_concat_prompt_kept_locally_and_over_http(paths, tmp_path):
    """The qa job with a window that cuts "concat"'s Knowledge line (k = 4): the local LM's directory and the
    server's URL give the same answers, the same kept passages and cut counts, and the same warning."""
    lms, _, lm_dir, _, servers = paths
    cut = dict(methods=("none", "concat"), k=4, lm_max_length=60)  # the question and about two 24-token passages
    want = job_results(lm_dir, "", paths, tmp_path, "qa", "replug", **cut)
    got = job_results(servers[0].url, "", paths, tmp_path, "qa", "replug", **cut)
    rows = [r["concat"] for r in want["rows"]]
    assert [{k: r[k] for k in ("prediction", "passage_ids", "passages_cut")} for r in rows] == \
        [{k: r[k] for k in ("prediction", "passage_ids", "passages_cut")} for r in (g["concat"] for g in got["rows"])]
    assert all(0 < len(r["passage_ids"]) < 4 and r["passages_cut"] == 4 - len(r["passage_ids"]) for r in rows)
    assert got["answer_nll"]["concat"] == pytest.approx(want["answer_nll"]["concat"], rel=1e-4)
    said = [w for w in want["warnings"] if w.startswith("concat: the LM's window cut the prompt of 3 of 3 questions")]
    assert said and said == [w for w in got["warnings"] if w.startswith("concat:")]


def test_http_posterior_generation_refuses_a_pass_that_does_not_end_with_its_query(paths):
    """The black-box route of `posterior.generate` cuts x off each pass's end: a pass that does not end with it is
    refused (it scored "Knowledge:" as the passage), as the local prefill route refuses it."""
    from replug_jax.method import posterior

    for name in ("local", "http"):
        with pytest.raises(ValueError, match="does not end with its query"):
            posterior.generate(paths[0][name], [["Knowledge: a\nQuestion: b?\nAnswer:", "Knowledge: c\nQuestion:"]],
                               ["Question: b?\nAnswer:"], [np.log([0.5, 0.5])], alpha=1.0, keep=1, max_new_tokens=2)


def test_concat_passages_kept_in_a_cut_prompt_are_one_number_on_every_path(paths):
    """"concat" in a prompt the window cuts (long demos, more new tokens, less room): the passages still in it,
    at least in part, are the truth of the prompt each path sends (`generation_prompt_ids` on the local tokenizer,
    every context token count through) on every path with character offsets, and within one passage of it with a
    server's ids alone (a token may cross a passage's end); the QA job's records and warning follow them."""
    lms = paths[0]
    local = lms["local"]
    passages = [TOPICS[i] for i in (0, 3, 4, 5)]  # best first: the concat prompt puts the best last, next to the
    # question; four scripts, each passage over 20 tokens (the merges learnt some topics whole), so the cuts land in each
    context = qa.question_block(QUESTIONS[0].question, knowledge_line(passages))
    demos = DEMOS * ((local.max_length - len(local.tokenizer.encode(context))) // len(local.tokenizer.encode(DEMOS)))
    ends = [len(context) - len(context.split(p, 1)[1]) for p in passages]  # where each passage ends
    counts = {}  # truth: max_new_tokens
    for max_new in range(4, local.max_length - len(local.tokenizer.encode(demos)), 6):  # room: from all to 1 token
        ids = blackbox.generation_prompt_ids(local.tokenizer, demos, context, local.max_length, max_new,
                                             local.start_id)[1]
        decoded = local.tokenizer.decode(ids)
        kept_text = decoded.lstrip("\ufffd")  # a cut inside a character: its last bytes decode as U+FFFD
        assert context.endswith(kept_text)
        start = len(context) - len(kept_text) - (kept_text != decoded)  # the first character kept, if only in part
        truth = sum(end > start for end in ends)
        kept = {name: concat_cuts.kept_in_generation(lms[name], QUESTIONS[0].question, passages, demos, max_new)
                for name in ("local", "http", "http_server", "http_ids")}
        assert {kept[name] for name in ("local", "http", "http_server")} == {truth}, (max_new, kept)
        assert abs(kept["http_ids"] - truth) <= 1, (max_new, kept)  # ids alone: a token across a passage's end
        counts.setdefault(truth, max_new)
    assert set(counts) == {0, 1, 2, 3, 4}  # from all four kept to none
    preds = [{"passage_ids": ["c0", "c1", "c2", "c3"]}, {"passage_ids": ["c0"]}]  # the second prompt fits
    concat_cuts.mark_generations(local, QUESTIONS[:2], [passages, passages[:1]], preds, demos, counts[2])
    assert preds == [{"passage_ids": ["c0", "c1"], "passages_cut": 2}, {"passage_ids": ["c0"]}]
    said = concat_cuts.warning([{"concat": p} for p in preds])
    assert said.startswith("concat: the LM's window cut the prompt of 1 of 2 questions, 2 passage(s) in all")
    assert concat_cuts.warning([{"concat": preds[1]}, {"none": {}}]) is None


@pytest.mark.parametrize("form", ["mmlu", "olmes"])
def test_concat_passages_kept_before_every_option_are_one_number_on_every_path(paths, form):
    """Multiple-choice "concat" (the mmlu job's cloze prompt after its shots; an OLMES request after the passages)
    where the window cuts the prompt before a long option (longer options, less room): the passages still in it, at
    least in part, before every option are the truth of the pairs each path scores (`pair_token_ids` on the local
    tokenizer, every context token count through) on every path with character offsets, within one passage of it
    with a server's ids alone; the rows' marks and the warning follow them."""
    lms = paths[0]
    local = lms["local"]
    passages = [TOPICS[i] for i in (0, 3, 4, 5)]  # best first: the Knowledge line puts the best last (as above)
    if form == "olmes":
        context = multiple_choice.prepended_prompts("concat", [olmes_requests()[0].context], [passages])[0][0]
    else:
        question = MCExample("m0", QUESTIONS[0].question, ("to the sea", "to the desert"), 0, "geography")
        context = mmlu.method_prompts("concat", [question], [passages], {"geography": DEMOS * 3},
                                      block=option_text.cloze_block)[0][0]
    ends = [context.rindex(knowledge_line(passages)) + len(knowledge_line(passages[i:])) for i in range(4)]
    filler = local.tokenizer.encode(" ".join(TOPICS[:2]) * 80)  # ASCII: an option cut anywhere is whole text
    counts = {}  # truth: the long option's tokens
    for n in range(1, local.max_length - 1, 17):  # room: from the whole prompt to 1 token
        options = [" A", local.tokenizer.decode(filler[:n])]
        truth = len(passages)
        for option in options:
            ids = blackbox.pair_token_ids(local.tokenizer, context, option, local.max_length, local.start_id)[0]
            decoded = local.tokenizer.decode(ids)
            kept_text = decoded.lstrip("\ufffd")  # a cut inside a character: its last bytes decode as U+FFFD
            assert context.endswith(kept_text)
            start = len(context) - len(kept_text) - (kept_text != decoded)  # the first character kept, maybe in part
            truth = min(truth, sum(end > start for end in ends))
        kept = {name: concat_cuts.kept_in_scoring(lms[name], context, passages, options)
                for name in ("local", "http", "http_server", "http_ids")}
        assert {kept[name] for name in ("local", "http", "http_server")} == {truth}, (n, kept)
        assert abs(kept["http_ids"] - truth) <= 1, (n, kept)  # ids alone: a token across a passage's end
        counts.setdefault(truth, options)
    assert set(counts) == {0, 1, 2, 3, 4}  # from all four kept to none
    rows = [{"concat_passage_ids": ["c0", "c1", "c2", "c3"]}, {"concat_passage_ids": ["c0", "c1", "c2", "c3"]}]
    concat_cuts.mark_options(local, rows, [[context], [context]], [passages, passages], [counts[1], counts[4]])
    assert rows == [{"concat_passage_ids": ["c0"], "concat_passages_cut": 3},
                    {"concat_passage_ids": ["c0", "c1", "c2", "c3"]}]
    said = concat_cuts.warning(rows)
    assert said.startswith("concat: the LM's window cut the prompt of 1 of 2 questions, 3 passage(s) in all")
    assert concat_cuts.warning(rows[1:]) is None


def mc_job_rows(lm_path_or_url, paths, tmp_path, questions: str, max_length: int) -> tuple[dict, list[dict]]:
    """(results.json, prediction rows) of the mmlu job (none and concat, k = 4, option texts scored) on the tiny LM
    cut to `max_length` tokens: the questions a JSONL file ("mmlu") or an OLMES request file."""
    from replug_jax.jobs.config_files import sibling_config
    from replug_jax.main import run_job

    corpus, mc = tmp_path / "corpus.jsonl", tmp_path / "mc.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n"
                              for d in documents("c", 8)))
    mc.write_text("".join(json.dumps({"question": q.question, "choices": [a, "the other one"], "answer": 0,
                                      "subject": "geography"}) + "\n" for q in QUESTIONS for a in q.answers[:1]))
    config = sibling_config(os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments", "configs",
                                         "mmlu.py"), "mmlu.py")
    config.update(dict(questions=str(mc) if questions == "mmlu" else questions, demos="", shots=0, max_questions=2,
                       scoring="options", option_metric="acc", corpus=str(corpus), encoder=paths[3],
                       lm=lm_path_or_url, lm_tokenizer="", k=4, temperature=TAU, methods=("none", "concat"),
                       doc_tokens=24, metric="cosine", index_factory="Flat", embedding_dtype="float32",
                       lm_batch_size=8, lm_max_length=max_length, encoder_batch_size=8, seed=0, dtype="float32",
                       cache_dir="", lm_cache=""))
    workdir = str(tmp_path / f"mc-{abs(hash((lm_path_or_url, questions)))}")
    run_job(config, workdir)
    with open(os.path.join(workdir, "results.json")) as f, open(os.path.join(workdir, "predictions.jsonl")) as g:
        return json.load(f), [json.loads(line) for line in g]


@pytest.mark.parametrize("questions", ["mmlu", "olmes:arc_easy:rc_0shot"])
def test_the_mmlu_job_names_what_a_cut_concat_prompt_kept_on_every_path(paths, tmp_path, questions):
    """The mmlu job (its own cloze prompt; an OLMES request file) with a window that cuts "concat"'s passages: each
    row lists the passages still before every option and counts the others, the same through the local LM and the
    server's URL, with the same option log-likelihoods, and results.json says how many were cut."""
    lms, _, lm_dir, _, servers = paths
    tokens = lambda text: len(lms["local"].tokenizer.encode(text))
    window = 60  # the cloze prompt: the question and about two of the four 24-token passages
    if questions != "mmlu":  # the request and its longest option whole, and some 40 tokens of passages before it
        requests = load_olmes(*questions.split(":")[1:])[0][:2]
        window = max(tokens(q.context) + max(map(tokens, q.continuations)) for q in requests) + 40
    want, rows = mc_job_rows(lm_dir, paths, tmp_path, questions, window)
    got, http_rows = mc_job_rows(servers[0].url, paths, tmp_path, questions, window)
    assert [r["concat_passage_ids"] for r in http_rows] == [r["concat_passage_ids"] for r in rows]
    assert [r.get("concat_passages_cut") for r in http_rows] == [r.get("concat_passages_cut") for r in rows]
    for r, h in zip(rows, http_rows):
        np.testing.assert_allclose(h["concat_options"]["loglik"], r["concat_options"]["loglik"], rtol=1e-4)
    cut = [r for r in rows if "concat_passages_cut" in r]
    assert cut and all(r["concat_passages_cut"] == 4 - len(r["concat_passage_ids"]) > 0 for r in cut)
    assert any(r["concat_passage_ids"] for r in cut)  # a passage kept, at least in part, before every option
    said = [w for w in want["warnings"] if w.startswith(f"concat: the LM's window cut the prompt of {len(cut)} of 2 ")]
    assert said and said == [w for w in got["warnings"] if w.startswith("concat:")]
