"""The language-modelling evaluation: windows, the ensemble over retrieved passes, the k-sweep reuse, the job."""
import json
import os

import numpy as np
import pytest
from ml_collections import config_dict

import replug_jax as rj
from replug_jax.evaluate import perplexity as lm_perplexity
from replug_jax.jobs import lm_eval as run
from replug_jax.jobs.prepare import read_documents
from replug_jax.jobs import report
from replug_jax.evaluate.windows import Window, document_windows, retrieval_shortfall
from replug_jax.method.passages import format_docs
from replug_jax.retrieval import build
from replug_jax.retrieval.bm25 import BM25Index
from replug_jax.retrieval.datastore import Document, chunk_documents
from replug_jax.retrieval.embeddings import embed_corpus
from replug_jax.retrieval.index import DenseIndex
from replug_jax.retrieval.retriever import BM25Retriever, DenseRetriever, RandomRetriever, index_meta

from tests import hf_tiny

TOPICS = ["the river flows to the sea past the old mill", "stars shine over the quiet desert at night",
          "bread rises in the warm kitchen oven", "the violin plays a slow sad song", "snow covers the tall mountain peak"]


def docs(prefix, n):
    return [Document(f"{prefix}{i}", f"Title {i}", " ".join([TOPICS[(i + j) % 5] for j in range(4)]) + ".") for i in range(n)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    lm_dir, enc_dir = tmp_path_factory.mktemp("lm"), tmp_path_factory.mktemp("enc")
    hf_tiny.tiny_gpt2(str(lm_dir), positions=256)
    hf_tiny.tiny_bert(str(enc_dir))
    return str(lm_dir), str(enc_dir), rj.load_lm(str(lm_dir), batch_size=8), rj.load_encoder(str(enc_dir), batch_size=8)


def test_windows_tile_the_document(tiny):
    lm = tiny[2]
    text = "One two three four five six seven eight nine ten. " * 3
    wins = document_windows("d", text, lm.tokenizer, stride_tokens=16, query_tokens=10, context_tokens=20)
    assert "".join(w.continuation for w in wins) == text
    assert wins[0].query == wins[0].prefix == ""
    for a, w in zip(range(16, 10**6, 16), wins[1:]):  # window a starts at token a
        assert len(lm.tokenizer.encode(w.query)) == min(10, a) and len(lm.tokenizer.encode(w.prefix)) == min(20, a)
        assert text.index(w.query + w.continuation) >= 0
    assert len(document_windows("d", text, lm.tokenizer, stride_tokens=16, query_tokens=10, context_tokens=20,
                                max_windows=2)) == 2


def test_a_document_of_one_stride_or_less_gets_a_retrieval_window(tiny):
    """With the defaults (128 tokens each), a ~100-token document was one window without retrieval."""
    tok = tiny[2].tokenizer
    text = "One two three four five six seven eight nine ten. " * 2
    n = len(tok.encode(text))
    assert 40 < n <= 128
    (w,) = document_windows("d", text, tok, stride_tokens=128, query_tokens=128, context_tokens=128)
    assert w.query == w.prefix and w.query + w.continuation == text  # first half: query and context; rest scored
    assert len(tok.encode(w.query)) == n // 2
    (w,) = document_windows("d", text, tok, stride_tokens=n, query_tokens=10, context_tokens=6)
    assert len(tok.encode(w.query)) == 10 and len(tok.encode(w.prefix)) == 6 and w.query + w.continuation == text
    longer = document_windows("d", text, tok, stride_tokens=n - 5, query_tokens=10, context_tokens=6)
    assert [bool(x.query) for x in longer] == [False, True]  # longer documents: as before, tiled from token 0
    assert "".join(x.continuation for x in longer) == text
    assert len(tok.encode("A")) == 1
    (one_token,) = document_windows("d", "A", tok, stride_tokens=128, query_tokens=128, context_tokens=128)
    assert one_token.query == "" and one_token.continuation == "A"


def test_a_run_mostly_without_retrieval_is_warned_about():
    """Under half the scored bytes, or under half the documents, with retrieval: a warning naming the keys to
    change, kept in results.json and printed under the table."""
    first, later = Window("a", "", "", "x" * 100), Window("a", "query", "prefix", "y" * 120)
    assert retrieval_shortfall([first, later]) is None
    warning = retrieval_shortfall([first, Window("a", "query", "prefix", "y" * 80)])
    assert "2 windows" in warning and "0 of 1 documents" in warning
    assert all(key in warning for key in ("stride_tokens", "query_tokens", "max_windows_per_doc"))
    only_first = [Window(d, "", "", "x" * 10) for d in "bcd"]  # e.g. max_windows_per_doc=1, or 1-token documents
    assert "3 of 4 documents" in retrieval_shortfall([first, later, Window("a", "q", "p", "y" * 500), *only_first])
    results = {"perplexity": {"none": 2.0}, "bits_per_byte": {"none": 1.0}, "tokens": 4, "bytes": 10, "windows": 4,
               "windows_with_retrieval": 0, "k": 2, "warnings": [warning]}
    assert report.markdown_table(results).endswith(f"Warning: {warning}\n")
    # the console: each warning was said as the job found it; under the table one line points to them
    shown = report.for_console(report.markdown_table(results), [warning])
    assert warning not in shown and shown.endswith("1 warning said above, also under the table in results.md\n")


def test_the_temperature_table_holds_no_constant_row():
    """A retriever whose scores are all equal (random) gives the same perplexity at every τ: its row is left out of
    the τ table and said in one line; a row that τ moves stays."""
    metrics = lambda ppl: {"perplexity": ppl, "bits_per_byte": 1.0}  # noqa: E731
    results = {"perplexity": {"none": 2.0, "replug": 1.9, "random": 1.95},
               "bits_per_byte": {"none": 1.0, "replug": 0.9, "random": 0.95},
               "tokens": 4, "bytes": 10, "windows": 4, "windows_with_retrieval": 4, "k": 2,
               "temperature_sweep": {"replug": {"0.1": metrics(1.8), "1.0": metrics(1.9)},
                                     "random": {"0.1": metrics(1.95), "1.0": metrics(1.95)}}}
    table = report.markdown_table(results).split("ensemble temperature", 1)[1]
    assert "| replug | 1.800 | 1.900 |" in table and "| random |" not in table
    assert "The same at every τ, so left out: random (1.950)" in table


def _corpus_and_windows(tiny, tmp_path):
    """(the tiny LM, a 6-document datastore, its exact dense retriever, the windows of 2 held-out documents)."""
    _, _, lm, enc = tiny
    store = chunk_documents(docs("c", 6), lm.tokenizer, chunk_tokens=32)
    index = DenseIndex.build(embed_corpus(enc, store.texts, str(tmp_path / "e.npy"), progress=False),
                             meta=index_meta(enc, store))
    wins = []
    for d in docs("h", 2):
        wins += document_windows(d.id, d.text, lm.tokenizer, stride_tokens=24, query_tokens=16, context_tokens=16)
    return lm, store, DenseRetriever(enc, index, store), wins


def test_ensemble_and_k_sweep_reuse_match_direct_scoring(tiny, tmp_path):
    """Every REPLUG number equals a mixture computed by hand from separate lm.score calls."""
    lm, store, retriever, wins = _corpus_and_windows(tiny, tmp_path)
    tau, other_tau = 0.5, 0.05
    results = lm_perplexity.evaluate_lm(lm, wins, store, {"replug": retriever}, k=3, k_sweep=(1, 3), temperature=tau,
                                  temperature_sweep=(other_tau,), progress=False)
    queried = [w for w in wins if w.query]
    scores, rows = retriever.retrieve([w.query for w in queried], 3, exclude_sources=[[w.doc_id] for w in queried])
    base = {w: lm.score([w.prefix], [w.continuation])[0] for w in wins}
    for k, tau in ((1, tau), (3, other_tau), (3, tau)):
        total, tokens = 0.0, 0
        for w in wins:
            if not w.query:
                lps = base[w]
            else:
                i = queried.index(w)
                docs_text = format_docs(store, rows[i, :k])
                per_doc = np.stack(lm.score([d + w.prefix for d in docs_text], [w.continuation] * k)).astype(np.float64)
                lam = np.exp(scores[i, :k] / tau) / np.exp(scores[i, :k] / tau).sum()
                lps = np.log((lam[:, None] * np.exp(per_doc)).sum(0))
            total, tokens = total + lps.sum(), tokens + len(lps)
        if tau == other_tau:  # the temperature sweep re-weights the same passes
            swept = results["temperature_sweep"]["replug"][str(other_tau)]["perplexity"]
            assert swept == pytest.approx(np.exp(-total / tokens), rel=1e-5)
            assert swept != results["perplexity"]["replug"]  # τ changed the mixture (slightly: a tiny random LM)
            continue
        assert results["k_sweep"]["replug"][str(k)]["perplexity"] == pytest.approx(np.exp(-total / tokens), rel=1e-5)
        if k == 3:
            replug_total, replug_tokens = total, tokens
    none = sum(v.sum() for v in base.values()) / sum(len(v) for v in base.values())
    assert results["perplexity"]["none"] == pytest.approx(np.exp(-none), rel=1e-5)
    nbytes = sum(len(w.continuation.encode()) for w in wins)
    # the headline REPLUG numbers (k=3) against the hand mixture, not against the sweep's own totals
    assert results["perplexity"]["replug"] == pytest.approx(np.exp(-replug_total / replug_tokens), rel=1e-5)
    assert results["bits_per_byte"]["replug"] == pytest.approx(-replug_total / (np.log(2) * nbytes), rel=1e-5)
    assert results["bytes"] == nbytes
    assert results["bits_per_byte"]["none"] == pytest.approx(-none * results["tokens"] / np.log(2) / nbytes, rel=1e-6)


def test_posterior_is_the_lms_posterior_over_replugs_own_passes(tiny, tmp_path):
    """replug_posterior: λ ∝ exp(s/τ + α log p(prefix | document)) over the top rerank_depth documents, the k best
    mixed, by hand from the LM's scores of REPLUG's own tokens (the prefix's: those from its first character on);
    α = 0 is REPLUG; REPLUG's numbers are the same whether its passes also score the prefix or not."""
    lm, store, retriever, wins = _corpus_and_windows(tiny, tmp_path)
    run_with = lambda alpha, evidence=None: lm_perplexity.evaluate_lm(  # noqa: E731
        lm, wins, store, {"replug": retriever}, k=2, temperature=0.5, progress=False, posterior_alpha=alpha,
        rerank_depth=4, evidence=evidence)
    rows_out = []
    results = run_with(1.0, rows_out)  # the plain run retrieves the same top 4 (its k sweep's), as ties order by depth
    plain = lm_perplexity.evaluate_lm(lm, wins, store, {"replug": retriever}, k=2, k_sweep=(4,), temperature=0.5,
                                progress=False)
    assert results["perplexity"]["replug"] == pytest.approx(plain["perplexity"]["replug"], rel=1e-6)
    queried = [w for w in wins if w.query]
    scores, rows = retriever.retrieve([w.query for w in queried], 4, exclude_sources=[[w.doc_id] for w in queried])
    total, tokens = 0.0, 0
    for w in wins:
        lps = lm.score([w.prefix], [w.continuation])[0].astype(np.float64)
        if w.query:
            i = queried.index(w)
            evidence, per_doc = [], []
            for d in format_docs(store, rows[i]):
                ids, offsets = lm.tokenizer.encode_with_offsets(d + w.prefix)
                n = sum(start < len(d) for start, _ in offsets)
                evidence.append(np.sum(lm.score_token_pairs([(ids[:n], ids[n:])])[0], dtype=np.float64))
                per_doc.append(lm.score([d + w.prefix], [w.continuation])[0].astype(np.float64))
            z = scores[i].astype(np.float64) / 0.5 + np.array(evidence)
            kept = np.argsort(-z, kind="stable")[:2]
            lam = np.exp(z[kept] - z[kept].max()) / np.exp(z[kept] - z[kept].max()).sum()
            lps = np.log(lam @ np.exp(np.stack([per_doc[j] for j in kept])))
        total, tokens = total + lps.sum(), tokens + len(lps)
    assert results["perplexity"]["replug_posterior"] == pytest.approx(np.exp(-total / tokens), rel=1e-5)
    assert run_with(0.0)["perplexity"]["replug_posterior"] == pytest.approx(plain["perplexity"]["replug"], rel=1e-6)
    # each window's evidence (windows.jsonl): the posterior's 2 kept of 4, best λ first, with log p(prefix | d);
    # the summed log-probabilities give the table's perplexities
    assert len(rows_out) == len(wins) and sum(r["tokens"] for r in rows_out) == results["tokens"]
    for method in ("none", "replug", "replug_posterior"):
        logprob = sum(r["logprob"].get(method, r["logprob"]["none"]) for r in rows_out)
        assert np.exp(-logprob / results["tokens"]) == pytest.approx(results["perplexity"][method], rel=1e-9)
    for r, w in zip(rows_out, wins):
        if not w.query:
            assert "replug" not in r
            continue
        post = r["replug_posterior"]
        assert len(post["passage_ids"]) == len(post["log_p_context"]) == 2 == len(r["replug"]["passage_ids"])
        assert post["log_weights"] == sorted(post["log_weights"], reverse=True)
        assert sum(np.exp(post["log_weights"])) == pytest.approx(1, abs=1e-5)


def test_concat_and_bm25_match_direct_scoring(tiny, tmp_path):
    """concat: one prompt of the top-k dense documents (best last), cut from the left by the LM's window;
    bm25: a REPLUG mixture over BM25 rows with its own temperature. Both against lm.score by hand.
    The held-out documents are in the datastore too (under other titles), so excluding them matters."""
    lm_dir, _, _, enc = tiny
    window = 64
    lm = rj.load_lm(lm_dir, batch_size=8, max_length=window)
    heldout = [Document(f"h{i}", f"Held {i}", d.text) for i, d in enumerate(docs("h", 2))]
    store = chunk_documents(docs("c", 6) + heldout, lm.tokenizer, chunk_tokens=32)
    index = DenseIndex.build(embed_corpus(enc, store.texts, str(tmp_path / "e.npy"), progress=False),
                             meta=index_meta(enc, store))
    dense = DenseRetriever(enc, index, store)
    bm25 = BM25Retriever(BM25Index.build(store.texts), store)
    wins = []
    for d in heldout:
        wins += document_windows(d.id, d.text, lm.tokenizer, stride_tokens=24, query_tokens=16, context_tokens=16)
    k, tau, bm25_tau = 2, 0.5, 0.25
    told: list[dict] = []  # issue 60: each method's numbers as it finishes, for a run that fails later
    results = lm_perplexity.evaluate_lm(lm, wins, store, {"replug": dense, "bm25": bm25}, k=k, concat_retriever="replug",
                                  temperature=tau, temperatures={"bm25": bm25_tau}, progress=False,
                                  method_finished=told.append)
    assert [sorted(t["perplexity"]) for t in told] == [["none"], ["concat", "none", "replug"],
                                                       ["bm25", "concat", "none", "replug"]]
    for metric in ("perplexity", "bits_per_byte"):
        assert all(t[metric][m] == results[metric][m] for t in told for m in t[metric])
    assert results["temperature"] == {"replug": tau, "bm25": bm25_tau}
    queried = [w for w in wins if w.query]
    assert 0 < len(queried) < len(wins)
    exclude = [[w.doc_id] for w in queried]
    base = {w: lm.score([w.prefix], [w.continuation])[0].astype(np.float64) for w in wins}
    nbytes = sum(len(w.continuation.encode()) for w in wins)

    def metrics(by_window):
        lps = [by_window.get(w, base[w]) for w in wins]
        total, tokens = sum(x.sum() for x in lps), sum(len(x) for x in lps)
        return np.exp(-total / tokens), -total / (np.log(2) * nbytes)

    # concat: the top-k dense documents in one prompt, the best closest to the input
    _, dense_rows = dense.retrieve([w.query for w in queried], k, exclude_sources=exclude)
    concat, cut = {}, 0
    for w, row in zip(queried, dense_rows):
        assert (row >= 0).all()
        context = "".join(format_docs(store, row[::-1])) + w.prefix
        cut += len(lm.tokenizer.encode(context)) > window  # the LM must cut this prompt from the left
        concat[w] = lm.score([context], [w.continuation])[0].astype(np.float64)
    assert cut > 0
    ppl, bpb = metrics(concat)
    assert results["perplexity"]["concat"] == pytest.approx(ppl, rel=1e-5)
    assert results["bits_per_byte"]["concat"] == pytest.approx(bpb, rel=1e-5)

    # bm25: REPLUG ensemble, lambda = softmax(score / bm25_tau) over the retrieved documents
    scores, rows = bm25.retrieve([w.query for w in queried], k, exclude_sources=exclude)
    assert not (rows == bm25.retrieve([w.query for w in queried], k)[1]).all()  # a window would retrieve itself
    mixed = {}
    for w, s, row in zip(queried, scores.astype(np.float64), rows):
        valid = row >= 0
        assert valid.any()
        per_doc = np.stack(lm.score([d + w.prefix for d in format_docs(store, row[valid])],
                                    [w.continuation] * int(valid.sum()))).astype(np.float64)  # [n, T]
        lam = np.exp((s[valid] - s[valid].max()) / bm25_tau)
        lam /= lam.sum()
        mixed[w] = np.log((lam[:, None] * np.exp(per_doc)).sum(0))
    ppl, bpb = metrics(mixed)
    assert results["perplexity"]["bm25"] == pytest.approx(ppl, rel=1e-5)
    assert results["bits_per_byte"]["bm25"] == pytest.approx(bpb, rel=1e-5)


def test_lm_eval_job_writes_results_and_reuses_the_index(tiny, tmp_path, monkeypatch):
    lm_dir, enc_dir, _, _ = tiny
    for name, part in (("corpus", docs("c", 8)), ("heldout", docs("h", 2))):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            for d in part:
                own = {"source": f"book {d.id}", "page": 3} if name == "corpus" else {}  # a user's own fields
                f.write(json.dumps({"id": d.id, "title": d.title, "text": d.text, **own}) + "\n")
    config = config_dict.ConfigDict(dict(
        job="lm_eval", corpus=str(tmp_path / "corpus.jsonl"), eval_data=str(tmp_path / "heldout.jsonl"),
        encoder=enc_dir, lm=lm_dir, k=2, k_sweep=(1, 2), temperature=1.0, bm25_temperature=1.0, doc_tokens=24,
        query_tokens=16, context_tokens=16, stride_tokens=24, max_eval_docs=2, max_windows_per_doc=3,
        methods=("replug", "random", "concat", "bm25"), metric="cosine", index_factory="Flat",
        embedding_dtype="float16", lm_batch_size=8, lm_max_length=0, encoder_batch_size=8, seed=0, dtype="float32"))
    workdir = str(tmp_path / "run")
    results = run.run_lm_eval(config, workdir)
    saved = json.load(open(os.path.join(workdir, "results.json")))
    for key in ("none", "replug", "random", "concat", "bm25"):
        assert np.isfinite(saved["perplexity"][key]) and np.isfinite(saved["bits_per_byte"][key])
    assert set(saved["k_sweep"]) == {"replug", "random"} and set(saved["k_sweep"]["replug"]) == {"1", "2"}
    assert saved["tokens"] == results["tokens"] > 0 and saved["k"] == 2
    assert saved["complete"] is True and saved["methods_finished"] == sorted(saved["perplexity"])
    assert "| replug |" in open(os.path.join(workdir, "results.md")).read()
    assert os.path.getsize(os.path.join(workdir, "perplexity_vs_k.png")) > 1000
    assert saved["lm_mesh"] == {"data": 8, "model": 1}
    windows = [json.loads(line) for line in open(os.path.join(workdir, "windows.jsonl"))]
    mixed = [r[m] for r in windows for m in ("replug", "concat", "bm25") if m in r]
    assert mixed and all(r["passage_fields"] == [{"source": f"book {i.split('#')[0]}", "page": 3}
                                                 for i in r["passage_ids"]] for r in mixed)  # issue 69, item 2
    # a second run with the same workdir reuses datastore, embeddings and index; its LM split over 4 devices
    monkeypatch.setattr(build, "embed_corpus_split", lambda *a, **k: pytest.fail("re-embedded a valid corpus"))
    again = run.run_lm_eval(config_dict.ConfigDict({**config.to_dict(), "lm_model_parallel": 4}), workdir)
    assert again["perplexity"] == pytest.approx(results["perplexity"], rel=1e-5)
    latest = json.load(open(os.path.join(workdir, "results.json")))
    assert latest["lm_mesh"] == {"data": 2, "model": 4}
    # what ran is recorded, and the first run's results are kept beside the second's (issue 38 item 5)
    assert {key: latest["config"][key] for key in ("corpus", "eval_data", "encoder", "lm", "methods")} == {
        "corpus": config.corpus, "eval_data": config.eval_data, "encoder": enc_dir, "lm": lm_dir,
        "methods": ["replug", "random", "concat", "bm25"]}
    history = sorted(os.listdir(os.path.join(workdir, "history")))
    assert history == sorted(f"results-{r['run_id']}.json" for r in (saved, latest)) and len(history) == 2
    assert json.load(open(os.path.join(workdir, "history", f"results-{saved['run_id']}.json")))["lm_mesh"] == {
        "data": 8, "model": 1}
    # runs sharing cache_dir (datastore and index) and lm_cache: the second one neither embeds nor scores anything
    monkeypatch.undo()
    shared = dict(cache_dir=str(tmp_path / "shared"), lm_cache=str(tmp_path / "shared" / "lm.sqlite"))
    first = run.run_lm_eval(config_dict.ConfigDict({**config.to_dict(), **shared}), str(tmp_path / "a"))
    asked = first["lm_requests"]["cache_misses"] + first["lm_requests"]["cache_hits"]
    assert first["lm_requests"]["cache_misses"] > 0
    assert os.path.isdir(tmp_path / "shared" / "index_dense") and not os.path.exists(tmp_path / "a" / "index_dense")
    monkeypatch.setattr(build, "embed_corpus_split", lambda *a, **k: pytest.fail("re-embedded a shared corpus"))
    second = run.run_lm_eval(config_dict.ConfigDict({**config.to_dict(), **shared}), str(tmp_path / "b"))
    assert second["lm_requests"]["cache_misses"] == 0 and second["lm_requests"]["cache_hits"] == asked
    assert second["perplexity"] == first["perplexity"]  # from the cache, exactly
    assert second["perplexity"] == pytest.approx(results["perplexity"], rel=1e-6)  # what the uncached run gave


def test_random_documents_are_uniformly_weighted(tiny):
    _, _, lm, _ = tiny
    store = chunk_documents(docs("c", 4), lm.tokenizer, chunk_tokens=32)
    scores, rows = RandomRetriever(store, seed=1).retrieve(["q"], 3)
    assert (scores == 0).all() and len(set(rows[0])) == 3


def test_bad_eval_inputs(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        read_documents(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="no document source"):
        read_documents("")


CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "configs")


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(CONFIGS) if f.endswith(".py")))
def test_every_config_loads_with_the_documented_keys(name):
    from replug_jax.jobs.config_files import sibling_config

    c = sibling_config(os.path.join(CONFIGS, name), name)
    if c.job in ("qa", "mmlu"):  # the downstream jobs' documented keys (issue 8)
        for key in ("questions", "demos", "corpus", "encoder", "lm", "k", "shots", "max_new_tokens", "max_questions",
                    "ensemble", "methods", "retriever_workdir", "temperature"):
            assert key in c, f"{name} lacks {key}"
        from replug_jax.jobs.input_checks import job_methods

        assert c.ensemble in ("replug", "vote") and job_methods(c) == tuple(c.methods)
        return
    if c.job == "lsr" and c.train_data in ("sciq", "nq_open", "trivia_qa"):  # LSR on question-answer pairs
        from replug_jax.train.loop import LSRSettings

        for key in ("corpus", "encoder", "lm", "k", "train_split", "train_offset", "steps", "batch_size", "gamma",
                    "beta", "lm_score", "direction", "train_documents", "doc_tokens", "max_passages"):
            assert key in c, f"{name} lacks {key}"
        LSRSettings.from_mapping(c)
        return
    for key in ("corpus", "eval_data", "encoder", "lm", "k", "doc_tokens", "query_tokens", "stride_tokens", "max_eval_docs"):
        assert key in c, f"{name} lacks {key}"
    assert (c.get("eval_k") or c.k) <= max(c.k_sweep) and c.job in ("lm_eval", "lsr")
    if c.job == "lsr":
        for key in ("train_data", "steps", "batch_size", "refresh_every", "learning_rate", "gamma", "beta",
                    "train_query_tokens", "train_continuation_tokens"):
            assert key in c, f"{name} lacks {key}"
        from replug_jax.train.loop import LSRSettings

        LSRSettings.from_mapping(c)  # every LSR key maps onto LSRSettings


def test_every_config_key_the_readmes_name_exists():
    """README = code: each `--config.KEY` / `config.KEY` in the READMEs is a key of some config, and every key
    listed in the README's configs table is a key of the config that row names."""
    import re

    from replug_jax.jobs.config_files import sibling_config

    root = os.path.dirname(CONFIGS.rstrip("/").rsplit("/", 1)[0])
    configs = {n: sibling_config(os.path.join(CONFIGS, n), n) for n in os.listdir(CONFIGS) if n.endswith(".py")}
    known = set().union(*(set(c.keys()) for c in configs.values()))
    for readme in ("README.md", "experiments/README.md", "benchmarks/README.md", "tests/README.md",
                   *sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs")))):
        text = open(os.path.join(root, readme), encoding="utf-8").read()
        # "temprature": the misspelt key of tests/README.md's table of mistakes, on purpose
        named = set(re.findall(r"(?<![\w.])-?-?config\.([a-z_]+)", text)) - {"json", "temprature"}
        assert named <= known, f"{readme} names config keys no config has: {sorted(named - known)}"
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    rows = re.findall(r"^\| `experiments/configs/([a-z_0-9]+\.py)` \| (.*) \|$", readme, flags=re.M)
    assert rows
    for name, text in rows:
        listed = {k for k in re.findall(r"`([a-z_]+)`", text) if not k.startswith(("cosine", "ip", "faiss", "device",
                                                                                        "auto"))}
        assert listed <= set(configs[name].keys()), f"{name} lacks {sorted(listed - set(configs[name].keys()))}"
