"""The retrieval layer: chunking, datastore files, resumable corpus embedding, FAISS and BM25 indexes, retrievers.

Real FAISS and bm25s on tiny data; the end-to-end test uses the packaged MiniLM encoder.
"""
import json
import os

import faiss
import numpy as np
import pytest

import replug_jax as rj

from replug_jax.models.tokenizer import from_hf_dir
from replug_jax.retrieval import embeddings
from replug_jax.retrieval.bm25 import BM25Index
from replug_jax.retrieval.datastore import (Datastore, Document, EmptyDocuments, chunk_documents, read_jsonl,
                                           read_text_files)
from replug_jax.retrieval.index import DenseIndex, IndexRefused
from replug_jax.retrieval.retriever import BM25Retriever, DenseRetriever, RandomRetriever, index_meta

from tests.hf_tiny import save_tiny_tokenizer

SENTENCES = [
    "Paris is the capital and largest city of France.",
    "The cat slept on the warm windowsill all afternoon.",
    "Photosynthesis converts sunlight into chemical energy in plants.",
    "The Pacific Ocean is the largest and deepest ocean on Earth.",
    "Beethoven composed nine symphonies.",
    "A bicycle has two wheels and is powered by pedals.",
    "Mount Everest is the highest mountain above sea level.",
    "Python is a popular programming language.",
    "The Great Wall of China stretches thousands of kilometres.",
    "Bread is baked from flour, water and yeast.",
]


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory):
    """One token per byte: re-encoding a chunk gives exactly its token count."""
    path = tmp_path_factory.mktemp("tok")
    save_tiny_tokenizer(str(path), vocab_size=257)
    return from_hf_dir(str(path))


def sentence_store() -> Datastore:
    return Datastore([f"s{i}#0" for i in range(len(SENTENCES))], [""] * len(SENTENCES), list(SENTENCES),
                     [f"s{i}" for i in range(len(SENTENCES))])


# ---------------------------------------------------------------- datastore


def test_chunks_are_exact_windows_that_tile_the_document(byte_tokenizer):
    docs = [Document("a", "A", "x" * 100), Document("b", "", "short"), Document("empty", "", " \n"),
            Document("c", "C", "y" * 70)]
    with pytest.raises(EmptyDocuments, match=r"1 document without text \(id 'empty'\): give it text, or leave it out "
                       "with drop_empty_documents"):  # the jobs' rule, on every source (issue 85)
        chunk_documents(docs, byte_tokenizer, chunk_tokens=32, min_tokens=8)
    with pytest.warns(UserWarning, match=r"left out 1 document without text \(id 'empty'\)"):
        ds = chunk_documents(docs, byte_tokenizer, chunk_tokens=32, min_tokens=8, drop_empty=True)
    # a: 32+32+36 (the 4-token tail merged); b: one short chunk; empty: left out; c: 32+32+6 -> 32+38
    assert ds.ids == ["a#0", "a#1", "a#2", "b#0", "c#0", "c#1"]
    assert [len(byte_tokenizer.encode(t)) for t in ds.texts] == [32, 32, 36, 5, 32, 38]
    assert ds.sources == ["a", "a", "a", "b", "c", "c"] and ds.titles[:3] == ["A"] * 3
    for doc in docs[:2] + docs[3:]:
        assert "".join(t for t, s in zip(ds.texts, ds.sources) if s == doc.id) == doc.text
    assert chunk_documents(docs, byte_tokenizer, 32, 8, drop_empty=True).ids == ds.ids  # stable


def test_a_documents_own_fields_are_kept_through_the_datastore_file(byte_tokenizer, tmp_path):
    """A document row's keys besides id, title and text (a user's own "source" too) ride with each of its chunks,
    through datastore.jsonl and back, and beside each passage id in a job's records; a store without any leaves
    records unchanged."""
    from replug_jax.retrieval.datastore import Datastore, document_from_record, with_passage_fields

    rows = [{"id": "a", "text": "x" * 70, "source": "atlas", "tags": ["é", 2]}, {"id": "b", "text": "short"}]
    docs = [document_from_record(r, str(i)) for i, r in enumerate(rows)]
    ds = chunk_documents(docs, byte_tokenizer, chunk_tokens=32, min_tokens=8)
    ds.save(str(tmp_path / "ds.jsonl"))
    loaded = Datastore.load(str(tmp_path / "ds.jsonl"))
    assert loaded.fields == ds.fields == {"a": {"source": "atlas", "tags": ["é", 2]}}
    assert loaded.sources == ["a", "a", "b"]  # the project's column, beside the user's own "source"
    record = {"replug": {"passage_ids": ["b#0", "a#1"]}, "mc_passage_ids": ["a#0"], "passage_scores": [1.0]}
    assert with_passage_fields(record, loaded) == {
        "replug": {"passage_ids": ["b#0", "a#1"], "passage_fields": [{}, {"source": "atlas", "tags": ["é", 2]}]},
        "mc_passage_ids": ["a#0"], "mc_passage_fields": [{"source": "atlas", "tags": ["é", 2]}],
        "passage_scores": [1.0]}
    plain = chunk_documents([docs[1]], byte_tokenizer, chunk_tokens=32)
    assert with_passage_fields(record, plain) is record


def test_chunks_with_a_real_wordpiece_tokenizer(minilm):
    text = " ".join(SENTENCES * 3) + "  Ünïcödé tail…"
    ds = chunk_documents([Document("d", "", text)], minilm.tokenizer, chunk_tokens=24)
    assert "".join(ds.texts) == text
    assert all(t in text for t in ds.texts)
    for chunk in ds.texts[:-1]:  # a window may start inside a word: re-encoding it can shift by a token
        assert abs(len(minilm.tokenizer.encode(chunk)) - 24) <= 2


class EncodeOnly:
    """What a server's /tokenize gives a client (lm/http/tokenization.py): ids, no character offsets, no decode."""

    def __init__(self, tokenizer):
        self.encode = tokenizer.encode


def test_chunks_with_a_tokenizer_without_offsets(byte_tokenizer, minilm):
    """Cut by `piece_token_starts` (each word with the whitespace before it encoded alone): still exact substrings
    that tile the document; the same chunks as the offsets give where a word is one token per character."""
    docs = [Document("a", "A", "x" * 100), Document("b", "", "short"), Document("c", "C", " ".join(SENTENCES))]
    assert chunk_documents(docs, EncodeOnly(byte_tokenizer), 32, 8) == chunk_documents(docs, byte_tokenizer, 32, 8)
    text = " ".join(SENTENCES * 3) + "  Ünïcödé tail…\n"
    ds = chunk_documents([Document("d", "", text)], EncodeOnly(minilm.tokenizer), chunk_tokens=24)
    assert "".join(ds.texts) == text and len(ds) == len(chunk_documents([Document("d", "", text)], minilm.tokenizer,
                                                                         chunk_tokens=24))
    for chunk in ds.texts[:-1]:
        assert abs(len(minilm.tokenizer.encode(chunk)) - 24) <= 2


def reference_chunks(documents, tokenizer, chunk_tokens, min_tokens=16) -> list[tuple[str, str]]:
    """The chunking before batch encoding (issue 52), document by document from `encode_with_offsets`: (id, text)."""
    out = []
    for doc in documents:
        if not doc.text.strip():  # a document without text (only whitespace) holds no passage (issue 69)
            continue
        _, offsets = tokenizer.encode_with_offsets(doc.text)
        starts = [a for a, _ in offsets]
        for i in range(1, len(starts)):
            starts[i] = max(starts[i], starts[i - 1])
        n = len(starts)
        if n == 0:
            continue
        firsts = list(range(0, n, chunk_tokens))
        if len(firsts) > 1 and n - firsts[-1] < min_tokens:
            firsts.pop()
        bounds = sorted({0, len(doc.text), *(starts[t] for t in firsts[1:])})
        out += [(f"{doc.id}#{j}", doc.text[a:b]) for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    return out


EDGE_TEXTS = ["", " ", "\n\n", "a", "  leading and trailing  ", "tabs\tand\r\nnewlines\n\n\nmany",
              "漢字とかなの文章です。" * 40, "emoji 👩‍👩‍👧 family 🇫🇷 flag " * 30, "combining e\u0301 a\u0300 " * 60,
              "Ünïcödé tail…", "x" * 3000, "   " + "word " * 400 + "   ", "\u200b zero\u200bwidth " * 50]


@pytest.mark.parametrize("name", ["smollm2", "minilm"])
def test_batch_encoded_chunks_are_the_document_by_document_chunks(name, monkeypatch):
    """chunk_documents tokenises documents in batches (the tokenizer's own batch encoding, every core): the same
    chunks bit for bit as encoding each document alone, on real Wikipedia text and unicode and whitespace edges,
    across batch boundaries; byte-level BPE (SmolLM2) and WordPiece with normalisation (MiniLM)."""
    import replug_jax as rj
    from replug_jax.data.wiki import load_wiki_articles
    from replug_jax.retrieval import datastore

    tokenizer = rj.load_tokenizer(name)
    docs = [Document(a.id, a.title, a.text) for a in load_wiki_articles()[:40]]
    docs += [Document(f"edge{i}", "", text) for i, text in enumerate(EDGE_TEXTS)]
    monkeypatch.setattr(datastore, "CHUNK_BATCH", 7)  # many batches, documents of every kind at their edges
    for chunk_tokens in (16, 128):
        with pytest.warns(UserWarning, match="without text"):  # the whitespace edges, left out as asked
            store = chunk_documents(docs, tokenizer, chunk_tokens=chunk_tokens, drop_empty=True)
        assert list(zip(store.ids, store.texts)) == reference_chunks(docs, tokenizer, chunk_tokens)


def test_datastore_round_trip_and_errors(tmp_path, byte_tokenizer):
    ds = chunk_documents([Document("a", "Title é", "some text " * 20), Document("b", "", "b\n\"quoted\"")],
                         byte_tokenizer, chunk_tokens=40)
    path = str(tmp_path / "ds.jsonl")
    ds.save(path)
    back = Datastore.load(path)
    assert (back.ids, back.titles, back.texts, back.sources) == (ds.ids, ds.titles, ds.texts, ds.sources)
    assert back.fingerprint() == ds.fingerprint() and len(back) == len(ds)
    assert os.listdir(tmp_path) == ["ds.jsonl"]  # no temp file left behind
    assert sorted(back.rows_of_sources(["b", "nope"]).tolist()) == [len(ds) - 1]
    with pytest.raises(ValueError, match="empty corpus"), pytest.warns(UserWarning, match="left out 1 document"):
        chunk_documents([Document("e", "", "")], byte_tokenizer, drop_empty=True)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty corpus"):
        Datastore.load(str(tmp_path / "empty.jsonl"))
    with pytest.raises(ValueError, match="duplicate chunk id"):
        chunk_documents([Document("a", "", "x"), Document("a", "", "y")], byte_tokenizer)


def test_readers(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "one"}\n\n{"text": "two", "title": "T", "id": "x"}\n')
    assert list(read_jsonl(str(good))) == [Document("1", "", "one"), Document("x", "T", "two")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "one"}\n{"title": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: .*\"text\""):
        list(read_jsonl(str(bad)))
    bad.write_text('{"text": "one"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2, column 2: not valid JSON \(Expecting property name"):
        list(read_jsonl(str(bad)))
    (tmp_path / "Paris.txt").write_text("Paris text")
    assert list(read_text_files([str(tmp_path / "Paris.txt")])) == [Document("Paris", "", "Paris text")]


# ---------------------------------------------------------------- corpus embeddings


class FakeEncoder:
    """Deterministic embeddings from the text bytes; counts the rows it embedded."""

    dim = 6

    def __init__(self, name="fake"):
        self.name, self.rows = name, 0

    def fingerprint(self):
        return self.name

    def embed(self, texts):
        self.rows += len(texts)
        return np.array([[len(t), sum(t.encode()) % 97, t.count("1"), t.count("2"), 1.0, -1.0] for t in texts],
                        np.float32)


def test_embed_corpus_resumes_and_reuses(tmp_path, monkeypatch):
    texts = [f"text {i} " * (i % 5 + 1) for i in range(23)]
    reference = FakeEncoder().embed(texts)
    path = str(tmp_path / "emb.npy")
    enc = FakeEncoder()
    real_embed, calls = enc.embed, []

    def failing(block):
        calls.append(len(block))
        if len(calls) == 3:
            raise KeyboardInterrupt("interrupted")
        return real_embed(block)

    monkeypatch.setattr(enc, "embed", failing)
    with pytest.raises(KeyboardInterrupt):
        embeddings.embed_corpus(enc, texts, path, block_size=5, progress=False)
    assert json.load(open(embeddings.sidecar_path(path)))["rows_done"] == 10  # the resume point on disk
    monkeypatch.setattr(enc, "embed", real_embed)
    enc.rows = 0
    out = embeddings.embed_corpus(enc, texts, path, block_size=5, progress=False)
    assert enc.rows == 13 and isinstance(out, np.memmap) and out.shape == (23, 6)
    np.testing.assert_array_equal(out, reference)
    again = embeddings.embed_corpus(enc, texts, path, block_size=5, progress=False)
    assert enc.rows == 13  # reused, nothing recomputed
    np.testing.assert_array_equal(again, reference)
    other = FakeEncoder("other")  # another encoder: recomputed from scratch
    embeddings.embed_corpus(other, texts, path, block_size=5, progress=False)
    assert other.rows == 23
    half = embeddings.embed_corpus(other, texts[:-1], path, dtype="float16", block_size=50, progress=False)
    assert other.rows == 45 and half.dtype == np.float16
    np.testing.assert_allclose(half, reference[:-1], rtol=1e-3)


# ---------------------------------------------------------------- dense index


def brute_force(emb, queries, k, cosine=True, exclude=None):
    if cosine:
        emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
        queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    sims = queries @ emb.T  # [Q, N]
    for q, rows in enumerate(exclude or []):
        sims[q, list(rows or [])] = -np.inf
    rows = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sims, rows, 1), rows


@pytest.fixture(params=["gemm", "faiss"])
def search_path(request, monkeypatch):
    """A flat index's candidates from the blocked GEMMs or from FAISS's own search (forced at any query count)."""
    from replug_jax.retrieval import exact_search

    monkeypatch.setattr(exact_search, "FAISS_MIN_QUERIES", 1)
    monkeypatch.setattr(exact_search, "_chosen", lambda size: request.param)
    return request.param


@pytest.fixture(scope="module")
def vectors():
    rng = np.random.default_rng(0)
    return rng.normal(size=(300, 16)).astype(np.float32), rng.normal(size=(7, 16)).astype(np.float32) * 3


@pytest.mark.parametrize("metric", ["cosine", "ip"])
def test_flat_index_matches_brute_force(vectors, metric):
    emb, queries = vectors
    index = DenseIndex.build(emb * np.arange(1, 301)[:, None] ** 0.3, metric=metric)
    scores, rows = index.search(queries, 10)
    want_scores, want_rows = brute_force(emb * np.arange(1, 301)[:, None] ** 0.3, queries, 10, metric == "cosine")
    assert scores.dtype == np.float32 and rows.dtype == np.int64 and rows.shape == (7, 10)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-4)


def test_exclusion_matches_brute_force_and_runs_out(vectors):
    emb, queries = vectors
    index = DenseIndex.build(emb)
    _, top = brute_force(emb, queries, 60)
    exclude = [set(top[q, : 5 * q].tolist()) for q in range(7)]  # query 6 loses its 30 best rows
    scores, rows = index.search(queries, 8, exclude=exclude)
    want_scores, want_rows = brute_force(emb, queries, 8, exclude=exclude)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    as_callable = index.search(queries, 8, exclude=lambda q, r: np.isin(r, list(exclude[q])))
    np.testing.assert_array_equal(as_callable[1], want_rows)
    # everything but 3 rows excluded: 3 results, then -1 / -inf
    scores, rows = index.search(queries[:1], 5, exclude=[set(range(297))])
    assert rows[0, :3].tolist() == (brute_force(emb[297:], queries[:1], 3)[1][0] + 297).tolist()
    assert rows[0, 3:].tolist() == [-1, -1] and np.isneginf(scores[0, 3:]).all()


def test_exact_search_ranks_as_brute_force(vectors, monkeypatch, tmp_path, search_path):
    """A flat index searched by blocked GEMMs or FAISS's own search (exact_search.py): the brute force's rows and
    scores, excluded rows masked, across GEMM blocks, from a memory-mapped index; ties go to the lower row
    (duplicated vectors)."""
    from replug_jax.retrieval import exact_search

    monkeypatch.setattr(exact_search, "BLOCK_SCORES", 7 * 64)  # blocks of 64 rows for 7 queries: six over 340 rows
    emb, queries = vectors
    emb = np.concatenate([emb, emb[:40]])  # rows 300..339 repeat rows 0..39: equal scores
    index = DenseIndex.build(emb, metric="cosine")
    index.save(str(tmp_path / "index"))
    for searched in (index, DenseIndex.load(str(tmp_path / "index"), mmap=True)):
        scores, rows = searched.search(queries, 12)
        want_scores, want_rows = brute_force(emb, queries, 12)
        np.testing.assert_array_equal(rows, want_rows)
        np.testing.assert_allclose(scores, want_scores, atol=1e-5)
        exclude = [set(want_rows[q, : 2 * q].tolist()) for q in range(7)]
        scores, rows = searched.search(queries, 6, exclude=exclude)
        np.testing.assert_array_equal(rows, brute_force(emb, queries, 6, exclude=exclude)[1])
    n = len(emb)
    matrix, unit = exact_search.flat_rows(index.index), queries / np.linalg.norm(queries, axis=1)[:, None]
    got = exact_search.search(matrix, unit, n, block_scores=7 * 64)  # every row, in rank order
    exact = unit.astype(np.float64) @ matrix.T.astype(np.float64)  # float64: twins tie exactly, the lower row first
    np.testing.assert_array_equal(got[1], np.stack([np.lexsort((np.arange(n), -e)) for e in exact]))
    with pytest.raises(ValueError, match=f"k={n + 1} must be between 1 and the {n} rows"):
        exact_search.search(matrix, queries, n + 1)
    assert exact_search.flat_rows(DenseIndex.build(emb, factory="SQ8").index) is None
    none = index.search(queries[:0], 3)  # no query at all (a prompt without demos retrieves for none)
    assert none[0].shape == (0, 3) and none[1].shape == (0, 3) and none[1].dtype == np.int64


def test_an_l2_flat_index_is_refused(vectors):
    """DenseIndex ranks by inner product: an L2 flat index wrapped in it is refused, never ranked by inner product."""
    import faiss

    l2 = faiss.IndexFlatL2(16)
    l2.add(vectors[0])
    with pytest.raises(IndexRefused, match="ranks by metric 1 .*inner product"):
        DenseIndex(l2, {"metric": "ip"})
    assert exact_search_rows(l2) is None


def exact_search_rows(index):
    from replug_jax.retrieval import exact_search

    return exact_search.flat_rows(index)


@pytest.mark.parametrize("queries", [1, 10, 600])
def test_a_tie_group_of_any_size_goes_to_its_lowest_rows(queries, search_path):
    """30 identical rows scattered among others, k 4: the four lowest of the group, for one query, ten and 600 at once
    (argpartition kept arbitrary members of a tie group past the 8 rows the rescoring margin covered)."""
    rng = np.random.default_rng(3)
    emb = rng.normal(size=(4000, 32)).astype(np.float32)
    query = rng.normal(size=32).astype(np.float32)
    twins = np.sort(rng.choice(4000, 30, replace=False))
    emb[twins] = query * 5 + rng.normal(size=32).astype(np.float32) * 0.1  # the best rows for `query`, all equal
    index = DenseIndex.build(emb, metric="cosine")
    batch = np.concatenate([query[None], rng.normal(size=(queries - 1, 32)).astype(np.float32)])
    scores, rows = index.search(batch, 4)
    assert rows[0].tolist() == twins[:4].tolist() and len(set(scores[0].tolist())) == 1
    _, excluded = index.search(batch, 4, exclude=[twins[:2].tolist()] + [None] * (queries - 1))
    assert excluded[0].tolist() == twins[2:6].tolist()


@pytest.mark.parametrize("queries", [1, 64])
def test_near_ties_rank_by_their_float64_scores(queries, search_path):
    """200 rows whose scores lie closer together than float32's rounding: the best 4 by their float64 sums over the
    stored rows, for a query alone and among 63 others (every row within the GEMM's error bound of the 4th best is a
    candidate, not just the float32 top 4)."""
    rng = np.random.default_rng(5)
    emb = rng.normal(size=(3000, 64)).astype(np.float32)
    query = rng.normal(size=64).astype(np.float32)
    emb[1000:1200] = query * 3 + rng.normal(size=(200, 64)).astype(np.float32) * 1e-6
    index = DenseIndex.build(emb, metric="ip")
    batch = np.concatenate([query[None], rng.normal(size=(queries - 1, 64)).astype(np.float32)])
    exact = emb[1000:1200].astype(np.float64) @ query.astype(np.float64)
    float32 = (emb @ query)[1000:1200]
    assert not np.array_equal(np.argsort(-float32)[:4], np.argsort(-exact)[:4])  # float32 alone ranks them otherwise
    assert index.search(batch, 4)[1][0].tolist() == (1000 + np.argsort(-exact, kind="stable")[:4]).tolist()


def test_the_faster_path_is_timed_once_per_size_where_it_runs(vectors, monkeypatch, tmp_path):
    """From FAISS_MIN_QUERIES queries on, the first search of a size class times the GEMM and FAISS paths and keeps the
    faster for that class (the crossover moves with the host and the corpus), stored for the machine so that a later
    process times nothing; either path answers the same."""
    from replug_jax.retrieval import exact_search

    monkeypatch.setenv(exact_search.ENV_CHOICES, str(tmp_path / "choices.json"))
    monkeypatch.setattr(exact_search, "_CHOSEN", {})
    monkeypatch.setattr(exact_search, "_STORED", {"loaded": False})
    monkeypatch.setattr(exact_search, "FAISS_MIN_QUERIES", 4)
    emb, queries = vectors
    index = DenseIndex.build(emb, metric="cosine")
    first = index.search(queries[:3], 5)  # below the minimum: the GEMM, nothing timed
    assert exact_search.chosen_paths() == {}
    together = index.search(queries, 5)  # 7 queries over 300 rows: size class 4 x 256, timed
    chosen = exact_search.chosen_paths()
    assert list(chosen) == ["4x256"] and set(chosen.values()) <= {"gemm", "faiss"}
    np.testing.assert_array_equal(together[1][:3], first[1])
    np.testing.assert_array_equal(index.search(queries, 5)[1], together[1])
    np.testing.assert_array_equal(together[1], brute_force(emb, queries, 5)[1])
    stored = json.loads((tmp_path / "choices.json").read_text())
    assert stored == {exact_search.machine(): {"2x8": chosen["4x256"]}}
    monkeypatch.setattr(exact_search, "_CHOSEN", {})  # a later process on this machine: the stored choice, no timing
    monkeypatch.setattr(exact_search, "_STORED", {"loaded": False})

    class NoClock:
        def perf_counter(self):
            raise AssertionError("timed again")

    monkeypatch.setattr(exact_search, "time", NoClock())
    np.testing.assert_array_equal(index.search(queries, 5)[1], together[1])
    assert exact_search.chosen_paths() == chosen


def test_exclusion_costs_its_own_length_not_depth_times_width():
    """A query excluding 5,000 rows: the flat index masks them in its GEMM blocks, so the search's peak memory grows
    by the list (its row numbers) alone, never by [queries, depth, D] gathered vectors; other indexes search each
    query to k plus its own list's length, not the longest list's."""
    import tracemalloc

    from replug_jax.retrieval.index import search_excluding

    rng = np.random.default_rng(0)
    emb, queries = rng.normal(size=(20_000, 256)).astype(np.float32), rng.normal(size=(64, 256)).astype(np.float32)
    index = DenseIndex.build(emb, metric="cosine")

    def peak(exclude):
        tracemalloc.start()
        found = index.search(queries, 8, exclude=exclude)
        size = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return size, found

    _, want = brute_force(emb, queries, 8, exclude=[range(5000)] + [None] * 63)
    without, _ = peak(None)
    with_list, (_, rows) = peak([list(range(5000))] + [None] * 63)
    np.testing.assert_array_equal(rows, want)
    assert with_list - without < 1_000_000, (without, with_list)  # [64, 5008, 256] float64 would be 656 MB
    asked = []

    def search_fn(todo, depth):
        asked.append((todo.tolist(), depth))
        return index.search(queries[todo], depth)

    search_excluding(search_fn, len(emb), 3, 4, [list(range(100)), None, [7]])
    assert sorted(asked) == [([0], 128), ([1], 4), ([2], 8)]


def test_a_query_ranks_the_same_alone_as_among_others(vectors, search_path):
    """A flat index's candidates are ranked by float64 sums: a query's scores and rows are the same bit for bit
    alone, among the others and in another order (BLAS rounds a query's scores by the GEMM's shape otherwise), on
    the GEMM path and FAISS's, and duplicated rows tie to the lower row on both."""
    emb, queries = vectors
    index = DenseIndex.build(np.concatenate([emb, emb[:40]]), metric="cosine")  # rows 300..339 repeat 0..39
    together = index.search(queries, 40)
    backwards = index.search(queries[::-1], 40)
    alone = [index.search(queries[i : i + 1], 40) for i in range(7)]
    assert together[0].dtype == np.float32 and together[1].dtype == np.int64
    np.testing.assert_array_equal(np.concatenate([s for s, _ in alone]), together[0])
    np.testing.assert_array_equal(np.concatenate([r for _, r in alone]), together[1])
    np.testing.assert_array_equal(backwards[0][::-1], together[0])
    np.testing.assert_array_equal(backwards[1][::-1], together[1])
    twins = [(list(r).index(a), list(r).index(a + 300)) for r in together[1] for a in r if a < 40 and a + 300 in r]
    assert twins and all(first < second for first, second in twins)  # equal scores: the lower row first
    np.testing.assert_array_equal(together[1], brute_force(np.concatenate([emb, emb[:40]]), queries, 40)[1])


def test_ivf_and_hnsw_recall_on_clustered_vectors():
    rng = np.random.default_rng(1)
    centers = rng.normal(size=(20, 16)) * 4
    emb = (centers[rng.integers(0, 20, 2000)] + rng.normal(size=(2000, 16))).astype(np.float32)
    queries = (centers[rng.integers(0, 20, 50)] + rng.normal(size=(50, 16))).astype(np.float32)
    _, want = brute_force(emb, queries, 10)
    for factory, params in (("IVF20,Flat", {"nprobe": 4}), ("HNSW16", {"efSearch": 64})):
        index = DenseIndex.build(emb, factory=factory, train_size=1000)
        index.set_search_params(**params)
        _, rows = index.search(queries, 10)
        recall = np.mean([len(set(r) & set(w)) / 10 for r, w in zip(rows, want)])
        assert recall >= 0.9, (factory, recall)


@pytest.mark.parametrize("factory", ["Flat", "IVF8,Flat", "HNSW8", "SQ8"])
def test_stored_vectors_are_what_the_search_scores(vectors, factory):
    """`vectors(rows)` returns the stored rows (normalised for cosine; exact for Flat, IVF and HNSW), and every
    returned score is the query's inner product with the vector of its row, also for a compressed index."""
    emb, queries = vectors
    index = DenseIndex.build(emb, metric="cosine", factory=factory)
    if factory != "SQ8":
        np.testing.assert_allclose(index.vectors(np.array([0, 5, 299])),
                                   emb[[0, 5, 299]] / np.linalg.norm(emb[[0, 5, 299]], axis=1, keepdims=True), atol=1e-6)
    scores, rows = index.search(queries, 5)
    unit_queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    recomputed = np.einsum("qkd,qd->qk", index.vectors(rows.reshape(-1)).reshape(7, 5, -1), unit_queries)
    np.testing.assert_allclose(recomputed, scores, atol=1e-4)
    assert index.vectors(np.zeros(0, np.int64)).shape == (0, 16)
    with pytest.raises(IndexError, match=r"rows must lie in \[0, 300\)"):
        index.vectors(np.array([300]))


def test_index_errors(vectors):
    emb, queries = vectors
    index = DenseIndex.build(emb[:20])
    with pytest.raises(ValueError, match=r"k=21 is larger than the corpus \(20 rows\)"):
        index.search(queries, 21)
    with pytest.raises(ValueError, match="k must be >= 1"):
        index.search(queries, 0)
    with pytest.raises(ValueError, match=r"\[Q, 16\]"):
        index.search(queries[:, :8], 3)
    with pytest.raises(ValueError, match="empty embeddings"):
        DenseIndex.build(np.zeros((0, 16), np.float32))
    with pytest.raises(ValueError, match="per-query"):
        index.search(queries, 3, exclude=[{1}])


def test_index_save_load_refusal_and_atomicity(tmp_path, vectors, monkeypatch):
    emb, queries = vectors
    meta = {"encoder": "enc1", "datastore": "ds1"}
    index = DenseIndex.build(emb, factory="IVF4,Flat", meta=meta)
    index.set_search_params(nprobe=4)
    path = str(tmp_path / "index")
    index.save(path)
    loaded = DenseIndex.load(path, expected={**meta, "dimension": 16, "metric": "cosine"})
    assert loaded.meta["count"] == 300 and loaded.meta["factory"] == "IVF4,Flat"
    for a, b in zip(loaded.search(queries, 5), index.search(queries, 5)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(IndexRefused, match="encoder is 'enc1', expected 'enc2'"):
        DenseIndex.load(path, expected={"encoder": "enc2"})
    with pytest.raises(IndexRefused, match="dimension"):
        DenseIndex.load(path, expected={"dimension": 8})

    def broken_write(*args):
        raise OSError("disk full")

    monkeypatch.setattr(faiss, "write_index", broken_write)
    with pytest.raises(OSError, match="disk full"):
        DenseIndex.build(emb[:10], meta={"encoder": "new"}).save(path)
    monkeypatch.undo()
    assert DenseIndex.load(path, expected=meta).count == 300  # the old index is intact
    DenseIndex.build(emb[:10], meta={"encoder": "new"}).save(path)  # a good save replaces it
    assert DenseIndex.load(path, expected={"encoder": "new"}).count == 10
    assert os.listdir(tmp_path) == ["index"]  # no temp or old folders left behind
    with open(os.path.join(path, "meta.json")) as f:
        assert json.load(f)["encoder"] == "new"


# ---------------------------------------------------------------- BM25 and retrievers


def test_bm25_finds_the_obvious_document_and_honours_exclusion(tmp_path):
    index = BM25Index.build(SENTENCES, meta={"datastore": "ds"})
    scores, rows = index.search_texts(["Which city is the capital of France?", "symphonies Beethoven"], 3)
    assert rows[:, 0].tolist() == [0, 4] and scores[0, 0] > scores[0, 1]
    _, rows = index.search_texts(["capital of France", "zzz unknown"], 3, exclude=[{0}, None])
    assert 0 not in rows[0] and rows.shape == (2, 3) and (rows >= 0).all()
    index.save(str(tmp_path / "bm25"))
    loaded = BM25Index.load(str(tmp_path / "bm25"), expected={"datastore": "ds"})
    np.testing.assert_array_equal(loaded.search_texts(["Everest mountain"], 2)[1], index.search_texts(["Everest mountain"], 2)[1])
    with pytest.raises(IndexRefused, match="datastore"):
        BM25Index.load(str(tmp_path / "bm25"), expected={"datastore": "other"})


def test_dense_retriever_end_to_end(tmp_path, minilm):
    ds = sentence_store()
    emb = embeddings.embed_corpus(minilm, ds.texts, str(tmp_path / "emb.npy"), progress=False)
    index = DenseIndex.build(emb, meta=index_meta(minilm, ds))
    index.save(str(tmp_path / "index"))
    retriever = DenseRetriever(minilm, DenseIndex.load(str(tmp_path / "index"), index_meta(minilm, ds)), ds)
    queries = ["What is the capital of France?", "Who wrote symphonies?"]
    scores, rows = retriever.retrieve(queries, 3)
    assert rows[:, 0].tolist() == [0, 4] and (np.diff(scores, axis=1) <= 1e-6).all() and scores.max() <= 1 + 1e-5
    _, rows = retriever.retrieve(queries, 3, exclude_sources=[["s0"], []])
    assert 0 not in rows[0] and rows[1, 0] == 4
    with pytest.raises(IndexRefused, match="datastore"):
        DenseRetriever(minilm, index, Datastore(ds.ids, ds.titles, ds.texts[::-1], ds.sources))
    _, rows = BM25Retriever(BM25Index.build(ds.texts), ds).retrieve(["capital of France"], 2, [["s0"]])
    assert 0 not in rows[0]


@pytest.mark.parametrize("devices,batch_size", [(8, 8), (8, 64), (1, 32)])
def test_a_text_embeds_the_same_alone_as_among_others(minilm, devices, batch_size):
    """Every row is padded to its own length bucket, never to a longer neighbour's, so its embedding is the same bit
    for bit alone, among 40 texts of mixed lengths and in another order: a query ranks near-tied passages the same in
    a job's batch as in the REPLUG object's single question (XLA's CPU programs round differently at another padded
    length, and did swap such a pair). A batch's rows are padded to a power of two, at least two per device: with
    8 devices and batches of 64, and with one device and batches of 32, a text meets 2 to 64 rows around it (one row
    per device at 8 tokens rounds differently)."""
    import jax

    from replug_jax.parallel import sharding

    encoder = minilm if batch_size == 8 else rj.load_encoder(
        "minilm", batch_size=batch_size, mesh=sharding.data_mesh(jax.devices()[:devices]))
    words = "rivers stars bread violins snow gold mountain desert oven song".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, rng.integers(1, 60))) for _ in range(40)] + ["snow", "gold oven", "song"]
    together = encoder.embed(texts)
    assert np.array_equal(encoder.embed(texts[::-1])[::-1], together)
    alone = [0, 1, 2, 40, 41, 42] + list(range(3, 12))
    assert np.array_equal(np.stack([encoder.embed([texts[i]])[0] for i in alone]), together[alone])
    rows = encoder.tokenize(texts)
    bucket = lambda n: sharding.length_bucket(n, encoder.length_multiple, encoder.max_length)
    # a call runs about 512 padded tokens (at most the batch size, a multiple of the devices), not 32 rows of 128;
    # texts of up to 32 tokens share one bucket
    assert [encoder.rows_per_call(n) for n in (32, 128)] == {1: [16, 4], 8: [min(batch_size, 16), 8]}[devices]
    assert sum(encoder.padded_length(len(r)) == 32 for r in rows) >= 3 and encoder.padded_length(3) == 32
    for own in (True, False):  # own_bucket: one bucket per batch, each at most 8 rows; without it, mixed
        batches = list(sharding.bucketed_batches(rows, 8, encoder.length_multiple, encoder.max_length, 0,
                                                 own_bucket=own))
        assert sorted(i for idx, _, _ in batches for i in idx) == list(range(len(texts)))
        mixed = [len({bucket(len(rows[i])) for i in idx}) > 1 for idx, _, _ in batches]
        assert max(len(idx) for idx, _, _ in batches) == 8 and any(mixed) != own


def test_random_retriever_honours_exclusion():
    ds = sentence_store()
    retriever = RandomRetriever(ds, seed=0)
    scores, rows = retriever.retrieve(["a", "b"], 4, exclude_sources=[[f"s{i}" for i in range(6)], None])
    assert (scores == 0).all() and sorted(rows[0].tolist()) == [6, 7, 8, 9]
    assert len(set(rows[1].tolist())) == 4
    queries = [f"query {i}" for i in range(20)]
    _, together = retriever.retrieve(queries, 4)
    alone = np.concatenate([retriever.retrieve([q], 4)[1] for q in queries[::-1]])[::-1]
    assert np.array_equal(together, alone)  # a query's draw depends on its text, not its batch or position
    assert len({tuple(r) for r in together.tolist()}) > 10
    assert not np.array_equal(together, RandomRetriever(ds, 1).retrieve(queries, 4)[1])
