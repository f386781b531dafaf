"""The REPLUG object of the public API: its numbers are the jobs' (per-token mixture by hand, QA answers equal
the QA job's function on the same passages), and bad k is refused."""
import numpy as np
import pytest

import replug_jax as rj
from replug_jax.data.records import QAExample
from replug_jax.evaluate import qa
from replug_jax.passages import DOC_TEMPLATE, passage_text

DOCS = ["Velmora is a small town in the hills. Its mayor is Tobias Grint, elected in 2019.",
        "The river Oster flows through Karsk, a city known for its glass factories.",
        "Glass from Karsk is exported to many countries; the factories date from 1850.",
        "Tobias Grint was a teacher before he became the mayor of Velmora."]


@pytest.fixture(scope="module")
def rag(smollm2, minilm):
    return rj.REPLUG.from_documents(DOCS, lm=smollm2, encoder=minilm, k=2, temperature=0.5)


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


def test_answer_and_generate_are_the_jobs(rag, smollm2):
    question = "Who is the mayor of Velmora?"
    scores, rows = rag.retrieve([question])
    passages = [[passage_text(rag.datastore.titles[r], rag.datastore.texts[r]) for r in rows[0]]]
    job = qa.answer_questions(smollm2, [QAExample("q", question, ())], passages, scores, method="replug",
                              ensemble="replug", demo_prefix="", temperature=0.5, max_new_tokens=6)
    assert rag.answer(question, max_new_tokens=6) == job[0]["prediction"]
    text = rag.generate("Velmora's mayor", max_new_tokens=4, stop=())
    assert isinstance(text, str) and text


def test_k_larger_than_the_datastore_is_refused(rag):
    with pytest.raises(ValueError, match="k=9 must be between 1 and the datastore's"):
        rj.REPLUG(rag.lm, rag.retriever, rag.datastore, k=9)
