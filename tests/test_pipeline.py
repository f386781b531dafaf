"""The REPLUG object of the public API: its numbers are the paper's computed by hand (per-token mixture, Table 5
prompts and λ for answers, the LM's own ensembled decoding), with retrieval or posterior weights; bad k, τ and
documents are refused before any model loads; documents may be texts, {"text", "title"} dicts, Documents or a
path."""
import json

import numpy as np
import pytest

import replug_jax as rj
from replug_jax.method.passages import DOC_TEMPLATE, passage_text

DOCS = ["Velmora is a small town in the hills. Its mayor is Tobias Grint, elected in 2019.",
        "The river Oster flows through Karsk, a city known for its glass factories.",
        "Glass from Karsk is exported to many countries; the factories date from 1850.",
        "Tobias Grint was a teacher before he became the mayor of Velmora."]


@pytest.fixture(scope="module")
def rag(smollm2, minilm):
    return rj.REPLUG.from_documents(DOCS, lm=smollm2, encoder=minilm, k=2, temperature=0.5, weights="replug")


def test_score_is_the_per_token_mixture_of_the_passes(rag, smollm2):
    context, continuation = "The mayor of Velmora is", " Tobias Grint"
    got = rag.score(context, continuation)
    scores, rows = rag.retrieve([context])
    assert rows.shape == (1, 2) and (rows >= 0).all()
    passes = [DOC_TEMPLATE.format(title=rag.datastore.titles[r], text=rag.datastore.texts[r]) + context
              for r in rows[0]]
    per_pass = np.stack([np.asarray(x, np.float64) for x in smollm2.score(passes, [continuation] * 2)])  # [2, T]
    lam = np.exp(scores[0] / 0.5 - np.max(scores[0] / 0.5))
    lam /= lam.sum()
    expected = np.log(np.sum(lam[:, None] * np.exp(per_pass), axis=0))
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert [t for _, _, t in rag.passages(context)][0] == rag.datastore.texts[rows[0][0]]


def _hand_weights(scores, tau, evidence=None, alpha=0.0, k=None):
    """(kept positions, normalised λ) in float64: softmax(s/τ + α·evidence), the k highest kept."""
    z = np.asarray(scores, np.float64) / tau + (alpha * np.asarray(evidence) if evidence is not None else 0.0)
    kept = np.argsort(-z, kind="stable")[: k or len(z)]
    lam = np.exp(z[kept] - np.max(z[kept]))
    return kept, lam / lam.sum()


def test_answer_and_generate_are_the_paper_prompts_and_weights(rag, smollm2):
    """answer: Table 5's prompt per passage, λ = softmax(s/τ) by hand, the LM's own ensembled decoding; generate:
    each passage (doc template) then the prompt."""
    question = "Who is the mayor of Velmora?"
    scores, rows = rag.retrieve([question])
    _, lam = _hand_weights(scores[0], 0.5)
    passes = [f"Knowledge: {passage_text(rag.datastore.titles[r], rag.datastore.texts[r])}\nQuestion: {question}\n"
              "Answer:" for r in rows[0]]
    want = smollm2.generate([passes], [np.log(lam)], max_new_tokens=6, stop=("\n",))[0].text.strip()
    assert rag.answer(question, max_new_tokens=6) == want
    prompt = "Velmora's mayor"
    scores, rows = rag.retrieve([prompt])
    _, lam = _hand_weights(scores[0], 0.5)
    passes = [DOC_TEMPLATE.format(title=rag.datastore.titles[r], text=rag.datastore.texts[r]) + prompt for r in rows[0]]
    want = smollm2.generate([passes], [np.log(lam)], max_new_tokens=4, stop=())[0].text
    assert rag.generate(prompt, max_new_tokens=4, stop=()) == want and want


def test_posterior_weights_are_the_lms_posterior_over_the_top_passages(rag, smollm2):
    """weights="replug_posterior": λ ∝ exp(s/τ + α log p(input | passage)) over the top rerank_depth, the k best
    kept, by hand from the LM's scores of the same tokens (the input's tokens: those from its first character on)."""
    post = rj.REPLUG(rag.lm, rag.retriever, rag.datastore, k=2, temperature=0.5, weights="replug_posterior",
                     posterior_alpha=0.5, rerank_depth=4)
    context, continuation = "The mayor of Velmora is", " Tobias Grint"
    scores, rows = rag.retriever.retrieve([context], 4)
    docs = [DOC_TEMPLATE.format(title=rag.datastore.titles[r], text=rag.datastore.texts[r]) for r in rows[0]]
    tok = smollm2.tokenizer
    evidence = []
    for d in docs:
        ids, offsets = tok.encode_with_offsets(d + context)
        n = sum(start < len(d) for start, _ in offsets)
        evidence.append(np.sum(smollm2.score_token_pairs([(ids[:n], ids[n:])])[0], dtype=np.float64))
    kept, lam = _hand_weights(scores[0], 0.5, evidence, 0.5, 2)
    per_pass = np.stack([np.asarray(x, np.float64) for x in smollm2.score([docs[j] + context for j in kept],
                                                                           [continuation] * 2)])
    np.testing.assert_allclose(post.score(context, continuation), np.log(lam @ np.exp(per_pass)), atol=1e-4)
    shown = post.kept_passages(context)  # the weights a user sees are the ones mixed, best first
    by_weight = kept[np.argsort(-lam, kind="stable")]
    assert [p.id for p in shown] == [rag.datastore.ids[rows[0][j]] for j in by_weight]
    np.testing.assert_allclose([p.weight for p in shown], np.sort(lam)[::-1], atol=1e-5)
    np.testing.assert_allclose([p.log_p_input for p in shown], np.asarray(evidence)[by_weight], atol=1e-3)
    np.testing.assert_allclose([p.score for p in shown], scores[0][by_weight], atol=1e-6)
    question = "Who is the mayor of Velmora?"
    scores, rows = rag.retriever.retrieve([question], 4)
    texts = [passage_text(rag.datastore.titles[r], rag.datastore.texts[r]) for r in rows[0]]
    block = f"Question: {question}\nAnswer:"
    evidence = [np.sum(x, dtype=np.float64) for x in smollm2.score([f"Knowledge: {t}\n" for t in texts], [block] * 4)]
    kept, lam = _hand_weights(scores[0], 0.5, evidence, 0.5, 2)
    want = smollm2.generate([[f"Knowledge: {texts[j]}\n{block}" for j in kept]], [np.log(lam)], max_new_tokens=6,
                            stop=("\n",))[0].text.strip()
    answer, shown = post.answer(question, max_new_tokens=6, with_passages=True)
    assert answer == want == post.answer(question, max_new_tokens=6)
    by_weight = kept[np.argsort(-lam, kind="stable")]
    assert [p.title for p in shown] == [rag.datastore.titles[rows[0][j]] for j in by_weight]
    np.testing.assert_allclose([p.weight for p in shown], np.sort(lam)[::-1], atol=1e-5)
    np.testing.assert_allclose([p.log_p_input for p in shown], np.asarray(evidence)[by_weight], atol=1e-3)
    with pytest.raises(ValueError, match="weights='prior': use one of replug, replug_posterior"):
        rj.REPLUG(rag.lm, rag.retriever, rag.datastore, k=2, weights="prior")
    with pytest.raises(ValueError, match="weights='posterior' is now weights='replug_posterior', the method's name"):
        rj.REPLUG(rag.lm, rag.retriever, rag.datastore, k=2, weights="posterior")  # one name, as in the jobs
    with pytest.raises(ValueError, match="rerank_depth=1 must be 0"):
        rj.REPLUG(rag.lm, rag.retriever, rag.datastore, k=2, weights="replug_posterior", rerank_depth=1)


def test_kept_passages_are_the_retrieval_weights_mixed(rag, minilm):
    """With the paper's weights every top-k passage is kept: its id, title and score as retrieved, no posterior,
    λ = softmax(s/τ) by hand; `answer(with_passages=True)` shows the same passages for a question. A document's
    own fields (its row's keys besides id, title and text; "source" too) come with each of its passages."""
    context = "The mayor of Velmora is"
    scores, rows = rag.retrieve([context])
    _, lam = _hand_weights(scores[0], 0.5)
    shown = rag.kept_passages(context)
    order = np.argsort(-lam, kind="stable")
    assert [p.id for p in shown] == [rag.datastore.ids[r] for r in rows[0][order]]
    assert [p.text for p in shown] == [rag.datastore.texts[r] for r in rows[0][order]]
    assert all(p.log_p_input is None for p in shown) and isinstance(shown[0], rj.KeptPassage)
    np.testing.assert_allclose([p.weight for p in shown], lam[order], atol=1e-6)
    question = "Who is the mayor of Velmora?"
    scores, rows = rag.retrieve([question])
    _, shown = rag.answer(question, max_new_tokens=2, with_passages=True)
    assert sorted(p.id for p in shown) == sorted(rag.datastore.ids[r] for r in rows[0])
    assert sum(p.weight for p in shown) == pytest.approx(1.0, abs=1e-6)
    own = [{"id": f"d{i}", "text": d, **({"source": "register", "page": i} if i % 2 else {})} for i, d in enumerate(DOCS)]
    with_fields = rj.REPLUG.from_documents(own, lm=rag.lm, encoder=minilm, k=2, temperature=0.5, weights="replug")
    shown = with_fields.kept_passages(context)
    assert {p.id.split("#")[0] for p in shown} & {"d1", "d3"}  # a passage with fields of its own is shown
    for p in shown:
        index = int(p.id.split("#")[0][1:])
        assert p.fields == ({"source": "register", "page": index} if index % 2 else {})


def test_answer_takes_demo_pairs_shown_as_the_qa_job_shows_them(rag):
    """demos=[(question, answer)]: each pair with its own top passage (the QA job's demo_passages "top1"), then the
    question; the same answer as the block written out by hand; anything else is refused."""
    demo_q, demo_a = "Which river flows through Karsk?", "the Oster"
    _, rows = rag.retrieve([demo_q])
    top = rows[0][0]
    block = (f"Knowledge: {passage_text(rag.datastore.titles[top], rag.datastore.texts[top])}\nQuestion: {demo_q}\n"
             f"Answer: {demo_a}\n\n")
    assert rag.demo_block([(demo_q, demo_a)]) == block
    question = "Who is the mayor of Velmora?"
    assert rag.answer(question, max_new_tokens=6, demos=[(demo_q, demo_a)]) == rag.answer(question, max_new_tokens=6,
                                                                                          demos=block)
    with pytest.raises(ValueError, match=r"demos\[0\] = 'Which river': give \(question, answer\) pairs"):
        rag.answer(question, demos=["Which river"])
    with pytest.raises(ValueError, match=r"demos='demos.jsonl' is a file name: give \(question, answer\) pairs"):
        rag.answer(question, demos="demos.jsonl")


def test_the_project_files_read_into_what_the_object_takes(rag, smollm2, minilm, tmp_path):
    """rj.read_documents and rj.read_questions read the jobs' own files; from_documents takes the documents and
    answer(demos=) the question rows (or the files' dicts) as they come: the same answer as (question, answer)
    pairs. Without demos, one warning says the prompt is zero-shot, once per object."""
    import warnings

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "title": f"T{i}", "text": text}) + "\n"
                            for i, text in enumerate(DOCS)))
    rows = [{"id": "river", "question": "Which river flows through Karsk?", "answers": ["the Oster", "Oster"],
             "gold_doc": "d1"}, {"question": "Who is the mayor of Velmora?", "answer": "Tobias Grint"}]
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = rj.read_documents(str(docs))
    assert [(d.id, d.title) for d in read] == [(f"d{i}", f"T{i}") for i in range(len(DOCS))]
    demos = rj.read_questions(str(questions))
    assert [(d.id, d.question, d.answers) for d in demos] == [("river", rows[0]["question"], ("the Oster", "Oster")),
                                                              ("2", rows[1]["question"], ("Tobias Grint",))]
    assert dict(demos[0].fields) == {"gold_doc": "d1"}
    again = rj.REPLUG.from_documents(read, lm=smollm2, encoder=minilm, k=2, temperature=0.5, weights="replug")
    assert again.datastore.texts == rag.datastore.texts
    question, pairs = "Where was Marisol Fenn born?", [(r.question, r.answers[0]) for r in demos]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with demos: no warning
        want = rag.answer(question, max_new_tokens=6, demos=pairs)
        assert rag.answer(question, max_new_tokens=6, demos=demos) == want
        assert rag.answer(question, max_new_tokens=6, demos=rows) == want
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again.answer(question, max_new_tokens=2)
        again.answer(question, max_new_tokens=2)
    said = [str(w.message) for w in caught if "zero-shot" in str(w.message)]
    assert len(said) == 1 and "Knowledge: <passage>\\nQuestion: <question>\\nAnswer:" in said[0]


def test_a_workdir_not_made_yet_is_made_and_its_index_read_back(smollm2, minilm, tmp_path):
    """`workdir=` naming folders that do not exist yet (the harness's workdir= with cache=false passes it on): made,
    as the jobs make theirs, the index saved there and read back by the next object (the same passages)."""
    workdir = tmp_path / "not" / "yet"
    first = rj.REPLUG.from_documents(DOCS, lm=smollm2, encoder=minilm, k=2, workdir=str(workdir))
    assert (workdir / "index_dense").exists()
    again = rj.REPLUG.from_documents(DOCS, lm=smollm2, encoder=minilm, k=2, workdir=str(workdir))
    query = ["Who painted the ceiling?"]
    assert first.retriever.retrieve(query, 2)[1].tolist() == again.retriever.retrieve(query, 2)[1].tolist()


def test_a_document_without_text_is_refused_naming_it_or_left_out_with_a_warning(smollm2, minilm):
    """The jobs' rule in the REPLUG object (issue 85: it dropped them without a word)."""
    from replug_jax.retrieval.datastore import EmptyDocuments

    docs = [{"id": "kept", "text": DOCS[0]}, {"id": "blank", "text": "  "}]
    with pytest.raises(EmptyDocuments, match=r"1 document without text \(id 'blank'\)"):
        rj.REPLUG.from_documents(docs, lm=smollm2, encoder=minilm, k=1)
    with pytest.warns(UserWarning, match=r"left out 1 document without text \(id 'blank'\)"):
        rag = rj.REPLUG.from_documents(docs, lm=smollm2, encoder=minilm, k=1, drop_empty_documents=True)
    assert set(rag.datastore.sources) == {"kept"}


def test_an_empty_answer_is_warned_about(smollm2, minilm):
    """Zero-shot, SmolLM2 ends its answer at once: the empty answer says so and names demos."""
    import replug_jax as rj

    docs = ["Velmora is a harbour town whose lighthouse keeper is Ada Quill.", "A violin has four strings."]
    r = rj.REPLUG.from_documents(docs, lm=smollm2, encoder=minilm, k=2, weights="replug")
    with pytest.warns(UserWarning, match="empty answer.*demos="):
        assert r.answer("Who is the lighthouse keeper of Velmora?") == ""


def test_k_larger_than_the_datastore_is_refused(rag):
    with pytest.raises(ValueError, match="k=9 must be between 1 and the datastore's"):
        rj.REPLUG(rag.lm, rag.retriever, rag.datastore, k=9)


def test_bad_settings_and_a_bare_string_are_refused_before_any_model_loads():
    from replug_jax.retrieval.datastore import Datastore

    store = Datastore(ids=["p0"], titles=[""], texts=["Velmora is a town."], sources=["d0"])
    for temperature in (0.0, -1.0):  # λ = softmax(s / τ) needs τ > 0: refused here, not at the first call
        with pytest.raises(ValueError, match=rf"^temperature={temperature}: must be a number, above 0"):
            rj.REPLUG(None, None, store, temperature=temperature, k=1)
        with pytest.raises(ValueError, match=rf"^temperature={temperature}: must be a number, above 0"):
            rj.REPLUG.from_documents(DOCS, lm="/no/such/lm", temperature=temperature)
    with pytest.raises(ValueError, match="^k=0: must be a whole number, at least 1"):
        rj.REPLUG.from_documents(DOCS, lm="/no/such/lm", k=0)
    with pytest.raises(ValueError, match="^doc_tokens=0: must be a whole number, at least 1"):
        rj.REPLUG.from_documents(DOCS, lm="/no/such/lm", doc_tokens=0)
    with pytest.raises(ValueError, match=r"posterior_alpha=3 and rerank_depth=16 would be ignored: only "
                                         r"weights=\"replug_posterior\" reads them"):
        rj.REPLUG(None, None, store, k=1, weights="replug", posterior_alpha=3, rerank_depth=16)
    with pytest.raises(ValueError, match="rerank_depth=2 would be ignored"):
        rj.REPLUG.from_documents(DOCS, lm="/no/such/lm", k=1, weights="replug", rerank_depth=2)
    with pytest.raises(ValueError, match="rerank_depth=2 must be 0"):  # the default weights: the posterior's
        rj.REPLUG.from_documents(DOCS, lm="/no/such/lm", k=4, rerank_depth=2)
    with pytest.raises(ValueError, match=r"documents='Velmora is a small town.*' is not a file or folder: pass a list "
                                         "of texts"):
        rj.REPLUG.from_documents(DOCS[0], lm="/no/such/lm")


def test_documents_may_be_texts_dicts_documents_or_a_path(smollm2, minilm, tmp_path):
    from replug_jax.replug import as_documents
    from replug_jax.retrieval.datastore import Document

    given = [DOCS[1], {"title": "Velmora", "text": DOCS[0]}, {"id": "k2", "text": DOCS[2]},
             Document("t", "Grint", DOCS[3])]
    expected = [Document("doc0", "", DOCS[1]), Document("doc1", "Velmora", DOCS[0]), Document("k2", "", DOCS[2]),
                Document("t", "Grint", DOCS[3])]
    assert as_documents(given) == expected
    path = tmp_path / "docs.jsonl"
    path.write_text('{"title": "Velmora", "text": "Velmora has a mayor."}\n')
    assert as_documents(str(path)) == [Document("1", "Velmora", "Velmora has a mayor.")]
    with pytest.raises(ValueError, match=r'documents\[1\]: expected an object with a string "text" field'):
        as_documents([DOCS[0], {"title": "no text"}])
    rag = rj.REPLUG.from_documents(given[1:3], lm=smollm2, encoder=minilm, k=2)
    assert rag.datastore.titles == ["Velmora", ""] and rag.datastore.sources == ["doc0", "k2"]


def test_pieces_in_the_wrong_order_are_refused_at_once(rag, minilm):
    with pytest.raises(TypeError, match="the retriever is a LocalLM, with no retrieve"):
        type(rag)(minilm, rag.lm, rag.datastore)
    with pytest.raises(TypeError, match="the LM is a DenseEncoder, with no score"):
        type(rag)(minilm, rag.retriever, rag.datastore)


def test_posterior_score_mixes_through_the_shared_mixture(rag, monkeypatch):
    """weights="replug_posterior": the kept passes' token log-probs are mixed by `mixture.mixed_logprobs_jax` with their
    weights, as the LM evaluation mixes (no second hand-written mixture)."""
    from replug_jax.method import mixture

    post = rj.REPLUG(rag.lm, rag.retriever, rag.datastore, k=2, temperature=0.5, weights="replug_posterior",
                     posterior_alpha=0.5, rerank_depth=4)
    calls, inner = [], mixture.mixed_logprobs_jax
    monkeypatch.setattr(mixture, "mixed_logprobs_jax",
                        lambda lps, *a, **kw: calls.append(np.shape(lps)) or inner(lps, *a, **kw))
    got = post.score("The mayor of Velmora is", " Tobias Grint")
    assert calls == [(1, 2, len(got))]
