"""REPLUG as one object for notebooks: a retriever plus a black-box LM, with `score`, `generate` and `answer`.

    import replug_jax as rj
    rag = rj.REPLUG.from_documents(["Velmora is a town whose mayor is Tobias Grint.", ...], lm="smollm2", k=4)
    rag.score("The mayor of Velmora is", " Tobias Grint")   # [T] log p per token under REPLUG's mixture
    rag.generate("The mayor of Velmora is", max_new_tokens=8)
    rag.answer("Who is the mayor of Velmora?")              # the paper's Table 5 QA prompt, ensembled
    rag.kept_passages("The mayor of Velmora is")            # [KeptPassage(id, title, text, score, log_p_input, weight)]

Each of the top-k passages is prepended to the input separately and the LM's per-token probabilities are
mixed with λ = softmax(s / τ) (§3.2), or (`weights="replug_posterior"`) with the LM's posterior over the passages
(method/posterior.py). The calls go through the very functions the jobs use (`passages.document_passes` and
`evaluate.perplexity.mix_windows` for scoring, `evaluate.qa.method_passes` and `evaluate.qa_posterior` for QA), so the
numbers are the jobs' numbers (tests/test_pipeline.py).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import numpy as np

from replug_jax.base import settings
from replug_jax.data.records import QAExample
from replug_jax.evaluate import qa, qa_posterior
from replug_jax.evaluate.demo_passages import few_shot_prefix
from replug_jax.evaluate.perplexity import mix_windows
from replug_jax.method import greedy_match, mixture, posterior
from replug_jax.method.passages import DOC_TEMPLATE, document_passes, passage_text
from replug_jax.retrieval.datastore import Datastore, Document, chunk_documents, document_from_record

WEIGHTS = ("replug", "replug_posterior", "uniform")  # the jobs' method names: the paper's λ, the LM's posterior, 1/k
RETRIEVAL_WEIGHTS = ("replug", "uniform")  # λ from the retrieval alone (no LM call before mixing)
QA = settings.QA_DEFAULTS  # the object's defaults are the QA job's (qa.py): one declaration
RENAMED = {"retrieval": "replug", "posterior": "replug_posterior"}  # the names before 2026-11-28


@dataclasses.dataclass(frozen=True)
class KeptPassage:
    """One passage REPLUG mixes for an input: its datastore `id`, `title` and `text`, the retriever's `score`
    s(d, x), `log_p_input` = log p(x | d) where the posterior weighs (None with the retrieval weights), and `weight`
    λ, its share of the mixture (the kept passages' weights sum to 1), and `fields`, its document's own fields (the
    keys of its row besides "id", "title" and "text"). Best weight first."""

    id: str
    title: str
    text: str
    score: float
    log_p_input: float | None
    weight: float
    fields: dict = dataclasses.field(default_factory=dict)


class REPLUG:
    """A retriever (anything with `retrieve(queries, k) -> (scores [Q, K], rows [Q, K])`) over `datastore`,
    and a black-box LM; `k` passages per input, mixed with λ = softmax(s / `temperature`) (`weights="replug"`,
    the paper) or with the LM's posterior λ ∝ exp(s/τ + α log p(input | passage))
    (`weights="replug_posterior"`, α = `posterior_alpha`, method/posterior.py), which may score the input after the
    top `rerank_depth` passages and keep the k best, or, for comparison, with equal weights λ = 1/k
    (`weights="uniform"`, the official GPT-3 code's mixture)."""

    def __init__(self, lm, retriever, datastore: Datastore, *, k: int = QA["k"], temperature: float = QA["temperature"],
                 doc_template: str = DOC_TEMPLATE, weights: str = settings.QA_WEIGHTS,
                 posterior_alpha: float | None = None, rerank_depth: int | None = None):
        check_mixture(k, temperature, len(datastore), weights, posterior_alpha, rerank_depth)
        posterior_alpha = QA["posterior_alpha"] if posterior_alpha is None else posterior_alpha
        rerank_depth = QA["rerank_depth"] if rerank_depth is None else rerank_depth
        if not callable(getattr(retriever, "retrieve", None)):
            raise TypeError(f"REPLUG(lm, retriever, datastore): the retriever is a {type(retriever).__name__}, with no "
                            "retrieve(queries, k) (REPLUG.from_documents builds one from an encoder)")
        if not callable(getattr(lm, "score", None)):
            raise TypeError(f"REPLUG(lm, retriever, datastore): the LM is a {type(lm).__name__}, with no score() "
                            "(rj.load_lm gives one)")
        self.lm, self.retriever, self.datastore = lm, retriever, datastore
        self.k, self.temperature, self.doc_template = k, temperature, doc_template
        self.weights, self.posterior_alpha = weights, posterior_alpha
        self.depth = min(max(k, rerank_depth), len(datastore)) if weights == "replug_posterior" else k
        self._warned_zero_shot = False

    @classmethod
    def from_documents(cls, documents, *, lm="smollm2", encoder="minilm", k: int = QA["k"],
                       temperature: float = QA["temperature"], doc_tokens: int = QA["doc_tokens"], tokenizer=None,
                       doc_template: str = DOC_TEMPLATE, workdir: str | None = None,
                       drop_empty_documents: bool = False, **mixing) -> "REPLUG":
        """Chunk `documents` (see `as_documents`: texts, {"text", "title"?, "id"?} dicts, `Document`s, or a path as
        the jobs read it) into `doc_tokens`-token passages with the LM's tokenizer, embed them with `encoder` (a
        name or a DenseEncoder) into an exact cosine index; `doc_template`: each passage before the text in
        `score` and `generate` (its {title}, {text} and {passage}); `workdir`: the index saved in
        WORKDIR/index_dense and reused while the encoder and the passages are the same (the jobs'
        `build_dense_index`). `lm`: a name, a server URL, or a loaded LM. With a URL, `tokenizer` (a model name
        as `rj.load_tokenizer` takes, or a TextTokenizer: the server's model's) builds token-id prompts and cuts
        the passages; None: the server's own /tokenize does both (passages cut by
        `models.tokenizer.piece_token_starts`), as the jobs' `lm_tokenizer` key. A document without text is refused
        naming it, or left out and named in a warning with `drop_empty_documents` (the jobs' rule). `mixing`: the
        constructor's weights, posterior_alpha, rerank_depth."""
        from replug_jax.loading import load_encoder, load_lm
        from replug_jax.retrieval.index import DenseIndex
        from replug_jax.retrieval.retriever import DenseRetriever, index_meta

        check_mixture(k, temperature, None, **mixing)  # bad settings and documents are refused before any model loads
        settings.check_value("doc_tokens", doc_tokens, prefix="")
        docs = as_documents(documents)
        remote = isinstance(lm, str) and lm.startswith(("http://", "https://"))
        if tokenizer is not None and not remote:
            raise TypeError("tokenizer= is for an LM given as a server URL (a local or loaded LM has its own)")
        if isinstance(lm, str):
            lm = load_lm(lm, **({"tokenizer": tokenizer} if tokenizer is not None else {}))
        if getattr(lm, "tokenizer", None) is None:
            raise ValueError(f"{lm!r} has no tokenizer to cut passages with (a server without /tokenize): pass "
                             "tokenizer=, the server's model's tokenizer")
        encoder = load_encoder(encoder) if isinstance(encoder, str) else encoder
        store = chunk_documents(docs, lm.tokenizer, chunk_tokens=doc_tokens, drop_empty=drop_empty_documents)
        if workdir:
            from replug_jax.retrieval.build import build_dense_index

            os.makedirs(workdir, exist_ok=True)  # a folder not made yet, as the jobs take theirs (issue 85)
            index, _ = build_dense_index(encoder, store, os.path.join(workdir, "index_dense"), metric="cosine")
        else:
            index = DenseIndex.build(encoder.embed(store.texts), metric="cosine", meta=index_meta(encoder, store))
        return cls(lm, DenseRetriever(encoder, index, store), store, k=k, temperature=temperature,
                   doc_template=doc_template, **mixing)

    @classmethod
    def from_retrieval_file(cls, path, *, lm="smollm2", k: int = QA["k"], temperature: float = QA["temperature"],
                            doc_template: str = DOC_TEMPLATE, tokenizer=None, **mixing) -> "REPLUG":
        """REPLUG over a retrieval file's passages (DPR's or FiD's JSON / JSONL with "ctxs", {"query", "ctxs"} lines,
        a job's retrieval.jsonl; several paths joined by commas or as a list, or a read GivenRetrieval:
        retrieval/given.py): a query is looked up
        by its text among the file's questions and mixes its own given passages, λ = softmax(s / τ) of their given
        scores (no encoder, no index). k above the fewest passages a question is given is refused, naming it; a
        query the file does not hold is refused when asked. `lm`, `tokenizer`: as `from_documents`."""
        from replug_jax.loading import load_lm
        from replug_jax.retrieval.given import GivenRetrieval, read_given

        check_mixture(k, temperature, None, **mixing)  # bad settings and files are refused before any model loads
        given = path if isinstance(path, GivenRetrieval) else read_given(
            path if isinstance(path, (str, list, tuple)) else os.fspath(path))
        given.check_k(k)
        if isinstance(lm, str):
            lm = load_lm(lm, **({"tokenizer": tokenizer} if tokenizer is not None else {}))
        return cls(lm, given, given.store, k=k, temperature=temperature, doc_template=doc_template, **mixing)

    def retrieve(self, queries: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(scores [Q, k], datastore rows [Q, k]; -1 where fewer) of each query's top-k passages."""
        return self.retriever.retrieve(list(queries), self.k)

    def _retrieved_passes(self, queries: Sequence[str], texts: Sequence[str], shots=None) -> list[tuple]:
        """Per input text: (pass contexts: each retrieved passage then the text, after the input's `shots` where
        given, their retrieval log λ = log softmax(s/τ) [D], the scores [D] and datastore rows [D]) of the top
        `depth` passages for its query (k, or the re-ranking depth with posterior weights); one retrieval for all."""
        scores, rows = self.retriever.retrieve(list(queries), self.depth)
        out = []
        for i, text in enumerate(texts):
            contexts, _, _ = document_passes(self.datastore, rows[i : i + 1], [text], [""], self.doc_template,
                                             None if shots is None else [shots[i]])
            out.append((contexts, *self._found(scores[i : i + 1], rows[i : i + 1])))
        return out

    def _found(self, scores, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(log λ = log softmax(s/τ) [D'], scores [D'], datastore rows [D']) of one query's passages found in
        `scores`, `rows` [1, D] (-1 rows left out)."""
        valid = rows >= 0  # [1, D]
        log_w = np.asarray(mixture.log_weights_jax(self._weighed(scores, valid), valid, self.temperature))[0][valid[0]]
        return log_w, scores[0][valid[0]], rows[0][valid[0]]

    def _weighed(self, scores, valid):
        """The scores λ = softmax(· / τ) is taken of: the retrieval's, or with uniform weights 0 for every passage."""
        return mixture.uniform_scores(valid) if self.weights == "uniform" else scores

    def _mixed_passes(self, queries: Sequence[str], texts: Sequence[str], continuations: Sequence[str],
                      top: int = 0, shots=None) -> list:
        """Per input text, retrieved for by its query: (pass contexts, their normalised log λ [k'], the continuation's
        log-probs per pass or None, the kept passages as `KeptPassage`s): the top k by retrieval, or by the posterior
        over the top `depth`, which scores the text after each passage (with its continuation in the same pass); one
        LM call for all. `top` > 0 (an LM with `score_top`): the continuation's scores per pass as `TopScores`;
        `shots`: per input, the text its passes open with (`score_many`)."""
        found = self._retrieved_passes(queries, texts, shots)
        if self.weights in RETRIEVAL_WEIGHTS:
            return [(contexts, log_w, None, self._kept(rows, scores, log_w, None))
                    for contexts, log_w, scores, rows in found]
        flat = [(i, c) for i, (contexts, *_) in enumerate(found) for c in contexts]
        scored = self.lm.score_with_query([posterior.passage_part(c, texts[i]) for i, c in flat],
                                          [texts[i] for i, _ in flat], [continuations[i] for i, _ in flat],
                                          **({"top": top} if top else {}))
        out, at = [], 0
        for contexts, log_w, scores, rows in found:
            mine, at = scored[at : at + len(contexts)], at + len(contexts)
            query_ll = np.array([np.sum(q, dtype=np.float64) for q, _ in mine])  # the passages retrieved come first
            order, kept = posterior.kept_passes(log_w[None], [query_ll], 1.0, self.posterior_alpha, self.k)
            pos = order[0][order[0] >= 0]
            out.append(([contexts[j] for j in pos], kept[0][: len(pos)], [mine[j][1] for j in pos],
                        self._kept(rows[pos], scores[pos], kept[0][: len(pos)], query_ll[pos])))
        return out

    def _kept(self, rows, scores, log_weights, log_p_input) -> list[KeptPassage]:
        """`KeptPassage`s of datastore `rows` [k'] with their scores, log λ and log p(x | d) (None: retrieval
        weights), best weight first."""
        store = self.datastore
        kept = [KeptPassage(store.ids[r], store.titles[r], store.texts[r], float(s),
                            None if log_p_input is None else float(log_p_input[i]), float(np.exp(w)),
                            store.fields.get(store.sources[r], {}))
                for i, (r, s, w) in enumerate(zip(rows, scores, log_weights))]
        return sorted(kept, key=lambda p: -p.weight)

    def kept_passages(self, text: str, query: str | None = None) -> list[KeptPassage]:
        """The passages `score(text, ...)` and `generate(text)` mix, with their ids, titles, retriever scores,
        log p(text | passage) (posterior weights) and λ: what decided REPLUG's output, best weight first."""
        return self._mixed_passes([query if query is not None else text], [text], [""])[0][3]

    def passages(self, query: str) -> list[tuple[float, str, str]]:
        """The query's top-k passages as (score, title, text), best first."""
        scores, rows = self.retrieve([query])
        return [(float(s), self.datastore.titles[r], self.datastore.texts[r]) for s, r in zip(scores[0], rows[0])
                if r >= 0]

    def score(self, context: str, continuation: str, query: str | None = None) -> np.ndarray:
        """log p(y_t | context, y_<t) under REPLUG's mixture, per continuation token: [T] float32. Retrieval is
        for `query` (default: the context); each passage is `doc_template` followed by the context."""
        return self.score_many([context], [continuation], None if query is None else [query])[0]

    def score_many(self, contexts: Sequence[str], continuations: Sequence[str],
                   queries: Sequence[str] | None = None, shots: Sequence[str] | None = None) -> list[np.ndarray]:
        """`score` of many (context, continuation) pairs, each retrieved for by its query (default: its context):
        one retrieval and one LM call for all. `shots` (per pair, e.g. a few-shot block): text before the passage
        in each of the pair's passes (shots ∘ passage ∘ context), where the passage otherwise opens the pass.
        -> per pair [T_i] float32."""
        return self._mixture_scores(contexts, continuations, queries, shots=shots)[0]

    def score_and_greedy(self, contexts: Sequence[str], continuations: Sequence[str],
                         queries: Sequence[str] | None = None,
                         shots: Sequence[str] | None = None) -> tuple[list[np.ndarray], list[bool | None]]:
        """`score_many`, with whether each continuation is what `generations` would decode from its context
        (lm-eval's is_greedy), decided from the same scoring pass by its passes' top tokens
        (method/greedy_match.py), with retrieval's weights or the posterior's (the kept passes, from the pass that
        scores the input's likelihood): True / False, or None where they leave it open or the LM gives no top tokens
        (`score_top`: the local LM does): decode those (`generations`)."""
        return self._mixture_scores(contexts, continuations, queries, greedy=True, shots=shots)

    def _mixture_scores(self, contexts, continuations, queries, greedy: bool = False, shots=None):
        """(mixed log-probs per pair [T_i], is-greedy per pair or None) of `score_many` / `score_and_greedy`."""
        queries = list(contexts) if queries is None else list(queries)
        top = greedy_match.TOP if greedy and hasattr(self.lm, "score_top") else 0
        if self.weights in RETRIEVAL_WEIGHTS:
            scores, rows = self.retrieve(queries)  # [Q, k]
            passes, conts, where = document_passes(self.datastore, rows, contexts, continuations, self.doc_template,
                                                   shots)
            per_input = [[] for _ in contexts]  # per pair, its passes' scores (`TopScores` with top)
            for (i, _), x in zip(where, self.lm.score_top(passes, conts, top) if top else self.lm.score(passes, conts)):
                per_input[i].append(x)
            mask, tau = rows[:, : self.k] >= 0, self.temperature
            scores = self._weighed(scores[:, : self.k], mask)
            log_w = ([w[m] for w, m in zip(np.asarray(mixture.log_weights_jax(scores[:, : self.k], mask, tau)), mask)]
                     if top else [None] * len(contexts))  # λ per pass, for is_greedy only
        else:  # the kept passes, their normalised log λ as scores at τ = 1 (softmax gives them back)
            mixed = self._mixed_passes(queries, contexts, continuations, top, shots)
            per_input, log_w = [x for _, _, x, _ in mixed], [w for _, w, _, _ in mixed]
            scores = np.full((len(mixed), self.k), -np.inf, np.float32)  # [Q, k]
            for i, w in enumerate(log_w):
                scores[i, : len(w)] = w
            mask, tau = np.isfinite(scores), 1.0
        flags = [greedy_match.mixture_is_greedy(x, w) if top and x else None for x, w in zip(per_input, log_w)]
        if top:
            per_input = [[x.logprobs for x in passes] for passes in per_input]
        mixed_lps = mix_windows(per_input, [len(lps[0]) for lps in per_input], scores, mask, tau)
        return [mixed_lps[i] for i in range(len(per_input))], flags  # the LM evaluation's own mixture

    def generate(self, prompt: str, *, max_new_tokens: int = 32, stop: Sequence[str] = ("\n",),
                 query: str | None = None) -> str:
        """REPLUG's ensembled greedy decoding after `prompt` (each pass: a passage, then the prompt); with posterior
        weights they are fixed at the generation's prefill from log p(prompt | passage) (`posterior.generate`)."""
        return self.generations([prompt], max_new_tokens=max_new_tokens, stop=stop,
                                queries=None if query is None else [query])[0].text

    def generations(self, prompts: Sequence[str], *, max_new_tokens: int = 32, stop: Sequence[str] = ("\n",),
                    queries: Sequence[str] | None = None, shots: str = "") -> list:
        """`generate` of many prompts at once (each retrieved for by its query, default the prompt), as whole
        `Generation`s: the text, the token ids chosen and their mixture log-probs, the finish reason
        (lm/blackbox.py). `shots` (e.g. a few-shot block): text before the passage in every pass, the LM's shared
        prefix (tokenised apart and computed once, as the QA job's demo block)."""
        prompts = list(prompts)
        found = self._retrieved_passes(prompts if queries is None else list(queries), prompts)
        contexts, log_w = [f[0] for f in found], [f[1] for f in found]
        if self.weights in RETRIEVAL_WEIGHTS:
            return self.lm.generate(contexts, log_w, max_new_tokens=max_new_tokens, stop=tuple(stop),
                                    shared_prefix=shots)
        return posterior.generate(self.lm, contexts, prompts, log_w, alpha=self.posterior_alpha, keep=self.k,
                                  max_new_tokens=max_new_tokens, stop=tuple(stop), shared_prefix=shots)

    def answer(self, question: str, *, max_new_tokens: int = 16, demos=(), with_passages: bool = False):
        """The answer to `question` with the QA job's prompt ("Knowledge: <passage>\\nQuestion: ...\\nAnswer:"
        per passage) and mixture, after the few-shot `demos`: (question, answer) pairs, rows as `rj.read_questions`
        gives them (or {"question", "answers"} dicts), each shown with its own top passage as the QA job shows its
        demos, or a ready few-shot block (a string); without demos the prompt is zero-shot, said once in a warning.
        `with_passages`: return (answer, the kept passages as `KeptPassage`s) instead of the answer alone."""
        scores, rows = self.retriever.retrieve([question], self.depth)
        log_w, found_scores, found_rows = self._found(scores, rows)  # [D'], the retrieved (-1 rows left out)
        passages = [[passage_text(self.datastore.titles[r], self.datastore.texts[r]) for r in found_rows]]
        example = [QAExample("question", question, ())]
        prefix = self.demo_block(demos)
        if not prefix and not self._warned_zero_shot:
            import warnings

            self._warned_zero_shot = True
            warnings.warn("REPLUG.answer without demos: each pass's prompt is \"Knowledge: <passage>\\nQuestion: "
                          "<question>\\nAnswer:\" alone (zero-shot), and a small LM may answer in a sentence or not "
                          "at all; pass demos= (question, answer) pairs or rows of rj.read_questions (said once)",
                          stacklevel=2)
        if self.weights in RETRIEVAL_WEIGHTS:
            answer = qa.answer_questions(self.lm, example, passages, scores, method=self.weights, ensemble="replug",
                                         demo_prefix=prefix, temperature=self.temperature,
                                         max_new_tokens=max_new_tokens)[0]["prediction"]
            kept = self._kept(found_rows, found_scores, log_w, None)
        else:
            row = qa_posterior.predict(self.lm, example, passages, scores, demo_prefix=prefix, k=self.k,
                                       temperature=self.temperature, alpha=self.posterior_alpha, ensemble="replug",
                                       max_new_tokens=max_new_tokens, with_answers=False, progress=False)[0][0]
            answer, pos = row["prediction"], np.asarray(row["kept_ranks"], int)
            kept = self._kept(found_rows[pos], found_scores[pos], row["log_weights"], row["question_logliks"])
        if not answer.strip():
            import warnings

            warnings.warn("REPLUG.answer: the LM ended its answer at once (an empty answer)"
                          + ("" if prefix else "; a small LM usually needs a few examples first: demos="), stacklevel=2)
        return (answer, kept) if with_passages else answer

    def demo_block(self, demos) -> str:
        """The few-shot block `answer` puts before every pass: `demos` as given when a string, else from (question,
        answer) pairs, each with its own top passage from this datastore (the QA job's `demo_passages="top1"`)."""
        if isinstance(demos, str):
            if demos.endswith(".jsonl") or os.path.isfile(demos):
                raise ValueError(f"demos={demos[:60]!r} is a file name: give (question, answer) pairs (or a "
                                 "few-shot block as text)")
            return demos
        pairs = [demo_pair(d) for d in demos]
        bad = [i for i, d in enumerate(pairs) if not (isinstance(d, (tuple, list)) and len(d) == 2
                                                       and all(isinstance(x, str) and x.strip() for x in d))]
        if bad:
            raise ValueError(f"demos[{bad[0]}] = {pairs[bad[0]]!r}: give (question, answer) pairs of non-empty "
                             "strings, rows of rj.read_questions, or a few-shot block as one string")
        if not pairs:
            return ""
        examples = [QAExample(f"demo{i}", q, (a,)) for i, (q, a) in enumerate(pairs)]
        return few_shot_prefix(self.retriever, self.datastore, examples, True, qa.demo_block)


def demo_pair(demo):
    """A demo as (question, answer): a row of `rj.read_questions` (its first answer) or a {"question", "answers" or
    "answer"} dict as the JSONL files hold; anything else as given (checked by the caller)."""
    if isinstance(demo, QAExample):
        return (demo.question, demo.answers[0]) if demo.answers else demo
    if isinstance(demo, dict) and "question" in demo:
        answers = demo.get("answers", demo.get("answer"))
        answers = [answers] if isinstance(answers, str) else list(answers or [])
        return (demo["question"], answers[0]) if answers else demo
    return demo


def check_mixture(k: int, temperature: float, passages: int | None = None, weights: str = settings.QA_WEIGHTS,
                  posterior_alpha: float | None = None, rerank_depth: int | None = None) -> None:
    """Refuse k outside [1, `passages`] (the datastore's size, when known), a temperature τ of λ = softmax(s / τ)
    that is not positive, unknown weights, a negative α, a re-ranking depth below k, and posterior settings given
    with the retrieval weights (which would ignore them). None: not given (the posterior's defaults, QA_DEFAULTS)."""
    if weights in RENAMED:
        raise ValueError(f"weights={weights!r} is now weights={RENAMED[weights]!r}, the method's name in the jobs")
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: use one of {', '.join(WEIGHTS)}")
    given = {key: value for key, value in (("posterior_alpha", posterior_alpha), ("rerank_depth", rerank_depth))
             if value is not None}
    for key, value in (("k", k), ("temperature", temperature), *given.items()):
        settings.check_value(key, value, prefix="")  # the jobs' ranges (base/settings.py)
    if weights in RETRIEVAL_WEIGHTS and given:
        unread = [f"{key}={value!r}" for key, value in given.items()]
        raise ValueError(f"{' and '.join(unread)} would be ignored: only weights=\"replug_posterior\" reads "
                         f"{'them' if len(unread) > 1 else 'it'} (weights=\"replug\" is the paper's λ)")
    if rerank_depth and rerank_depth < k:  # given (the default re-ranks max(16, k))
        raise ValueError(f"rerank_depth={rerank_depth} must be 0 (k) or at least k={k}")
    if passages is not None and k > passages:
        raise ValueError(f"k={k} must be between 1 and the datastore's {passages} passages")


def as_documents(documents) -> list[Document]:
    """`documents` as `Document`s: a list of texts, of {"text", "title"?, "id"?} dicts or of `Document`s, or the path
    of a file or folder of documents as the jobs read it (JSONL, .txt, a folder of .txt)."""
    if isinstance(documents, (str, os.PathLike)):
        if not os.path.exists(documents):
            raise ValueError(f"documents={str(documents)[:60]!r} is not a file or folder: pass a list of texts "
                             "(or of {\"text\", \"title\"} dicts), even for one document")
        from replug_jax.jobs import prepare

        return prepare.read_documents(os.fspath(documents))
    docs = []
    for i, d in enumerate(documents):
        if isinstance(d, (str, dict)):
            try:
                d = document_from_record({"text": d} if isinstance(d, str) else d, f"doc{i}")
            except ValueError as e:
                raise ValueError(f"documents[{i}]: {e}") from None
        elif not isinstance(d, Document):
            raise TypeError(f"documents[{i}] is a {type(d).__name__}: give texts, {{\"text\", \"title\"?, \"id\"?}} "
                            "dicts or Documents")
        docs.append(d)
    if not docs:
        raise ValueError("no documents given")
    return docs
