"""REPLUG as one object for notebooks: a retriever plus a black-box LM, with `score`, `generate` and `answer`.

    import replug_jax as rj
    rag = rj.REPLUG.from_documents(["Velmora is a town whose mayor is Tobias Grint.", ...], lm="smollm2", k=4)
    rag.score("The mayor of Velmora is", " Tobias Grint")   # [T] log p per token under REPLUG's mixture
    rag.generate("The mayor of Velmora is", max_new_tokens=8)
    rag.answer("Who is the mayor of Velmora?")              # the paper's Table 5 QA prompt, ensembled

Each of the top-k passages is prepended to the input separately and the LM's per-token probabilities are
mixed with λ = softmax(s / τ) (§3.2). The calls go through the very functions the jobs use
(`passages.document_passes` and `evaluate.lm.ensemble` for scoring, `evaluate.qa.method_passes` for QA),
so the numbers are the jobs' numbers (tests/test_rag.py).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from replug_jax import replug
from replug_jax.data.records import QAExample
from replug_jax.evaluate import qa
from replug_jax.evaluate.lm import ensemble
from replug_jax.passages import DOC_TEMPLATE, document_passes, passage_text
from replug_jax.retrieval.datastore import Datastore, Document, chunk_documents


class REPLUG:
    """A retriever (anything with `retrieve(queries, k) -> (scores [Q, K], rows [Q, K])`) over `datastore`,
    and a black-box LM; `k` passages per input, mixed with λ = softmax(s / `temperature`)."""

    def __init__(self, lm, retriever, datastore: Datastore, *, k: int = 4, temperature: float = 1.0,
                 doc_template: str = DOC_TEMPLATE):
        if not 1 <= k <= len(datastore):
            raise ValueError(f"k={k} must be between 1 and the datastore's {len(datastore)} passages")
        self.lm, self.retriever, self.datastore = lm, retriever, datastore
        self.k, self.temperature, self.doc_template = k, temperature, doc_template

    @classmethod
    def from_documents(cls, documents, *, lm="smollm2", encoder="minilm", k: int = 4, temperature: float = 1.0,
                       doc_tokens: int = 128) -> "REPLUG":
        """Chunk `documents` (texts, `Document`s, or a path as the jobs read it) into `doc_tokens`-token passages
        with the LM's tokenizer, embed them with `encoder` (a name or a DenseEncoder) into an exact cosine index.
        `lm`: a name, a server URL, or a loaded LM."""
        import replug_jax as rj
        from replug_jax import workspace
        from replug_jax.retrieval.index import DenseIndex
        from replug_jax.retrieval.retriever import DenseRetriever, index_meta

        lm = rj.load_lm(lm) if isinstance(lm, str) else lm
        encoder = rj.load_encoder(encoder) if isinstance(encoder, str) else encoder
        if isinstance(documents, str):
            documents = workspace.read_documents(documents)
        docs = [d if isinstance(d, Document) else Document(f"doc{i}", "", d) for i, d in enumerate(documents)]
        store = chunk_documents(docs, lm.tokenizer, chunk_tokens=doc_tokens)
        index = DenseIndex.build(encoder.embed(store.texts), metric="cosine", meta=index_meta(encoder, store))
        return cls(lm, DenseRetriever(encoder, index, store), store, k=k, temperature=temperature)

    def retrieve(self, queries: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(scores [Q, k], datastore rows [Q, k]; -1 where fewer) of each query's top-k passages."""
        return self.retriever.retrieve(list(queries), self.k)

    def passages(self, query: str) -> list[tuple[float, str, str]]:
        """The query's top-k passages as (score, title, text), best first."""
        scores, rows = self.retrieve([query])
        return [(float(s), self.datastore.titles[r], self.datastore.texts[r]) for s, r in zip(scores[0], rows[0])
                if r >= 0]

    def score(self, context: str, continuation: str, query: str | None = None) -> np.ndarray:
        """log p(y_t | context, y_<t) under REPLUG's mixture, per continuation token: [T] float32. Retrieval is
        for `query` (default: the context); each passage is `doc_template` followed by the context."""
        scores, rows = self.retrieve([query if query is not None else context])
        contexts, continuations, _ = document_passes(self.datastore, rows, [context], [continuation],
                                                     self.doc_template)
        lps = self.lm.score(contexts, continuations)
        return ensemble([lps], [len(lps[0])], scores, rows, self.k, self.temperature)[0]

    def generate(self, prompt: str, *, max_new_tokens: int = 32, stop: Sequence[str] = ("\n",),
                 query: str | None = None) -> str:
        """REPLUG's ensembled greedy decoding after `prompt` (each pass: a passage, then the prompt)."""
        scores, rows = self.retrieve([query if query is not None else prompt])
        contexts, _, _ = document_passes(self.datastore, rows, [prompt], [""], self.doc_template)
        valid = rows >= 0
        log_w = np.asarray(replug.ensemble_log_weights(scores, valid, self.temperature))[0][valid[0]]
        return self.lm.generate([contexts], [log_w], max_new_tokens=max_new_tokens, stop=tuple(stop))[0].text

    def answer(self, question: str, *, max_new_tokens: int = 16, demos: str = "") -> str:
        """The answer to `question` with the QA job's prompt ("Knowledge: <passage>\\nQuestion: ...\\nAnswer:"
        per passage) and mixture, after the few-shot block `demos` (e.g. `evaluate.qa.demo_block(...)`)."""
        scores, rows = self.retrieve([question])
        passages = [[passage_text(self.datastore.titles[r], self.datastore.texts[r]) for r in rows[0] if r >= 0]]
        return qa.answer_questions(self.lm, [QAExample("question", question, ())], passages, scores, method="replug",
                                   ensemble="replug", demo_prefix=demos, temperature=self.temperature,
                                   max_new_tokens=max_new_tokens)[0]["prediction"]
