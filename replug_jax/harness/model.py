"""REPLUG as an lm-evaluation-harness model, registered as "replug": any harness task, retrieval-augmented.

    python -m replug_jax.harness --model replug --model_args lm=smollm2,corpus=sciq_support,k=4 \\
        --tasks replug_sciq_mc --limit 100          # docs/harness.md

    import lm_eval; from replug_jax.harness.model import REPLUGHarnessLM
    lm_eval.simple_evaluate(model=REPLUGHarnessLM(lm="smollm2", corpus="docs.jsonl", k=4), tasks=[...])

Every request goes through the REPLUG object (replug.py), so the numbers are `REPLUG.score`'s and
`REPLUG.generate`'s, which are the jobs' (tests/test_pipeline.py), retrieving with the instance's own example
(harness/queries.py), each passage before the request's whole context (the object's `doc_template`, "{title}\\n{text}
\\n\\n" unless given), or with `passages=example` after its few-shot block, beside the instance's own text, and with
`passages=example_and_shots` each shot beside its own top passage too (the QA job's layout; docs/harness.md):
  * loglikelihood(context, continuation): the sum of the continuation's per-token log-probs under the mixture;
    is_greedy: whether REPLUG's greedy decoding from the context gives the continuation's tokens (the mixture's own
    next-token argmax at every position), read from the scoring pass's top tokens where they decide it (a local LM:
    method/greedy_match.py), else by decoding the request (`is_greedy=false` skips it);
  * loglikelihood_rolling(text): the LM evaluation's windows (evaluate/windows.py, §6.1) over the whole text, each
    stretch of `stride_tokens` scored after `context_tokens` tokens and retrieved for by the previous
    `query_tokens`; the first stretch has no query and is scored without retrieval, as in the lm_eval job;
  * generate_until(context, {until, max_gen_toks}): REPLUG's ensembled greedy decoding.
With k=0 (or weights=none) no corpus is read and the LM scores the requests alone, by the same contract
(lm/blackbox.py: the context and the continuation tokenised apart).
"""
from __future__ import annotations

import os
import warnings

import lm_eval.models  # noqa: F401 (lm-eval's own models first: it imports them only while its registry is empty)
import ml_collections
import numpy as np
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from replug_jax.base import settings
from replug_jax.base.errors import InputError
from replug_jax.evaluate.windows import document_windows
from replug_jax.harness import offline_tasks
from replug_jax.harness.queries import QueryResolver
from replug_jax.jobs import input_checks
from replug_jax.jobs.prepare import LM_CACHE_FILE
from replug_jax.method import greedy_match
from replug_jax.method.passages import DOC_TEMPLATE, format_docs
from replug_jax.models import chat_templates
from replug_jax.replug import REPLUG, WEIGHTS, as_documents, check_mixture

QA = settings.QA_DEFAULTS
WINDOWS = {"stride_tokens": 128, "query_tokens": 128, "context_tokens": 128}  # experiments/configs/lm_eval.py's
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's own default where a task sets no max_gen_toks
CHUNK = 64  # requests per LM call (the LM batches them itself)
INCLUDE_ENV = "REPLUG_JAX_HARNESS_INCLUDE"  # include paths `python -m replug_jax.harness` passes on (os.pathsep)
# where each passage goes in a request's pass: before the whole context; after the few-shot block, beside the instance's
# own text; that, with each shot beside its own top passage too (the QA job's and the paper's Table 5 layout)
PASSAGE_LAYOUTS = ("context", "example", "example_and_shots")


def lm_eval_pair(context: str, continuation: str) -> tuple[str, str]:
    """(context, continuation) as lm-eval's backends score them (`TemplateLM._encode_pair`, hf, vllm and the API
    models alike): the context's trailing whitespace moves to the front of the continuation ("... is " + "Paris" is
    scored as "... is" + " Paris", the word's own token)."""
    spaces = len(context) - len(context.rstrip())
    return (context[:-spaces], context[-spaces:] + continuation) if spaces else (context, continuation)


def check_arguments(*, unknown=(), k=QA["k"], weights=settings.QA_WEIGHTS, corpus=None, retrieval=None,
                    temperature=QA["temperature"], posterior_alpha=None, rerank_depth=None, lm="smollm2",
                    tokenizer=None, doc_tokens=QA["doc_tokens"], passages="context", **windows) -> None:
    """The model's arguments checked without loading anything (`python -m replug_jax.harness` calls it before lm-eval
    indexes its tasks): an `InputError` naming the first mistake."""
    weights = "none" if weights is None else weights  # lm-eval's parser reads weights=none as None
    if unknown:
        raise InputError(f"--model_args {', '.join(sorted(unknown))}: not an argument of the replug model (lm, "
                         "tokenizer, encoder, corpus, retrieval, k, weights, temperature, posterior_alpha, rerank_depth, "
                         "doc_tokens, doc_template, query, passages, include_path, is_greedy, stride_tokens, "
                         "query_tokens, context_tokens, workdir, cache, drop_empty_documents)")
    if passages not in PASSAGE_LAYOUTS:
        raise InputError(f"passages={passages!r}: use one of {', '.join(PASSAGE_LAYOUTS)} (where each passage goes: "
                         "before the whole context, or beside the instance's own text after the few-shot block)")
    try:
        for key, value in windows.items():
            settings.check_value(key, value, prefix="")
        if weights != "none" and k != 0:
            if weights not in WEIGHTS:
                raise ValueError(f"weights={weights!r}: use one of none, {', '.join(WEIGHTS)}")
            if retrieval:  # the passages as given (retrieval/given.py): no corpus, no encoder
                if corpus:
                    raise ValueError(f"corpus={corpus!r} and retrieval={retrieval!r}: give one (retrieval= is each "
                                     "question's passages as given; corpus= is retrieved from)")
                check_mixture(k, temperature, None, weights, posterior_alpha, rerank_depth)
                for path in str(retrieval).split(","):
                    if not os.path.isfile(path):
                        raise ValueError(f"retrieval={path!r} is not a file (DPR's / FiD's JSON or JSONL with ctxs)")
                return
            if not corpus:
                raise ValueError("the replug model needs corpus= (a JSONL or .txt file, a folder of .txt files, or "
                                 f"{offline_tasks.CORPUS_NAME!r}) or retrieval= (a retrieval file, DPR's format); "
                                 "k=0 runs the LM without retrieval")
            check_mixture(k, temperature, None, weights, posterior_alpha, rerank_depth)
            if corpus != offline_tasks.CORPUS_NAME and not corpus.startswith("tfds:") and not os.path.exists(corpus):
                raise ValueError(f"corpus={corpus!r} is not a file or folder (a JSONL or .txt file, a folder of .txt "
                                 f"files, or {offline_tasks.CORPUS_NAME!r})")
            check_corpus_size(corpus, k, doc_tokens, lm, tokenizer)
    except ValueError as e:
        raise InputError(str(e)) from None


def no_chat_template(lm: str) -> str:
    return (f"--apply_chat_template: lm={lm!r} has no chat template (its tokenizer holds none; a server's /tokenize "
            "gives none: name its model's tokenizer with tokenizer=), so there is none to apply: leave the flag out")


def check_chat_template(lm, tokenizer: str | None) -> None:
    """A chat template asked for an LM whose tokenizer (the local one; for a URL, tokenizer=) holds none, refused
    before a model loads: the tokenizer alone is read (a GGUF's metadata, a folder's files)."""
    if not isinstance(lm, str):
        return
    name = tokenizer or (None if lm.startswith(("http://", "https://")) else lm)
    if name is None:
        raise InputError(no_chat_template(lm))
    from replug_jax.loading import load_tokenizer

    if chat_templates.template_of(load_tokenizer(name)) is None:
        raise InputError(no_chat_template(lm))


def check_corpus_size(corpus: str, k: int, doc_tokens: int, lm, tokenizer: str | None) -> None:
    """k above a small corpus's passages refused before a model loads, as the jobs refuse it
    (jobs/input_checks.py): by its bytes' bound, and where that leaves it open by the LM's tokenizer alone."""
    if not os.path.isfile(corpus):
        return
    config = ml_collections.ConfigDict({"job": "qa", "corpus": corpus, "k": k, "doc_tokens": doc_tokens,
                                        "lm": lm if isinstance(lm, str) else "", "lm_tokenizer": tokenizer or ""})
    try:
        input_checks.check_corpus_size(config)
    except InputError as e:  # the jobs' words, in --model_args' names
        raise ValueError(str(e).replace("--config.", "")) from None


@register_model("replug")
class REPLUGHarnessLM(LM):
    """lm-eval's LM interface over a `REPLUG` (module docstring). Arguments, as `--model_args key=value,...`: lm (a
    name, a path, a server URL, or from Python a loaded LM), tokenizer (for a URL: the server's model's tokenizer;
    none: its /tokenize), encoder, corpus (a file or folder as the jobs read it, or "sciq_support": the offline
    tasks' paragraphs), retrieval (instead of corpus: a retrieval file, DPR's or FiD's JSON / JSONL with "ctxs",
    each request's passages those of its query's row, looked up by the query's text: retrieval/given.py), k (0: no retrieval), weights (replug, replug_posterior, uniform or none), temperature,
    posterior_alpha, rerank_depth, doc_tokens, doc_template, query (harness/queries.py), passages (context, example
    or example_and_shots: where each passage goes, `PASSAGE_LAYOUTS`), include_path, is_greedy,
    stride_tokens, query_tokens, context_tokens, workdir (the index saved and reused there, and the LM's answers
    cached there unless cache=false, so a rerun resumes), drop_empty_documents (true: a corpus's documents without
    text left out, named in a warning; else refused naming them). Defaults are the REPLUG object's
    (`settings.QA_DEFAULTS`)."""

    def __init__(self, lm: str = "smollm2", corpus: str | None = None, encoder: str = "minilm", k: int = QA["k"],
                 retrieval: str | None = None,
                 weights: str = settings.QA_WEIGHTS, temperature: float = QA["temperature"],
                 posterior_alpha: float | None = None, rerank_depth: int | None = None,
                 doc_tokens: int = QA["doc_tokens"], doc_template: str = DOC_TEMPLATE, tokenizer: str | None = None,
                 query: str = "doc_to_text", passages: str = "context", include_path: str | None = None,
                 is_greedy: bool = True,
                 stride_tokens: int = WINDOWS["stride_tokens"], query_tokens: int = WINDOWS["query_tokens"],
                 context_tokens: int = WINDOWS["context_tokens"], workdir: str | None = None, cache: bool = True,
                 drop_empty_documents: bool = False, batch_size=None, max_batch_size=None, device=None, **unknown):
        super().__init__()
        weights = "none" if weights is None else weights  # lm-eval's parser reads weights=none as None
        check_arguments(unknown=unknown, k=k, weights=weights, corpus=corpus, retrieval=retrieval,
                        temperature=temperature,
                        posterior_alpha=posterior_alpha, rerank_depth=rerank_depth, stride_tokens=stride_tokens,
                        query_tokens=query_tokens, context_tokens=context_tokens, lm=lm, tokenizer=tokenizer,
                        doc_tokens=doc_tokens, passages=passages)
        self.method = "none" if weights == "none" or k == 0 else weights
        paths = [p for p in (include_path or "").split(os.pathsep) + os.environ.get(INCLUDE_ENV, "").split(os.pathsep)
                 if p]
        self.queries = QueryResolver(query, include_path=paths or [offline_tasks.default_folder()])
        self.is_greedy, self.windows = bool(is_greedy), {"stride_tokens": stride_tokens, "query_tokens": query_tokens,
                                                         "context_tokens": context_tokens}
        self._warned: set = set()
        self.greedy_counts = {"from scoring": 0, "decoded": 0}  # how each is_greedy was found (`logliks_and_greedy`)
        self.passages = passages
        self._blocks: dict = {}  # (task, few-shot block) -> it with each shot's own passage (example_and_shots)
        for key, value in (("corpus", corpus), ("retrieval", retrieval)):
            if self.method == "none" and value is not None:
                warnings.warn(f"{key}={value!r} is not read: k=0 / weights=none scores with the LM alone", stacklevel=2)
        documents = given = None
        if self.method != "none" and retrieval:  # a file that cannot be read is refused before a model loads
            from replug_jax.retrieval.given import read_given

            given = read_given(str(retrieval))
            given.check_k(k)
        elif self.method != "none":  # a corpus that cannot be read is refused before a model loads
            try:
                documents = as_documents(offline_tasks.corpus_file() if corpus == offline_tasks.CORPUS_NAME
                                         else corpus)
            except ValueError as e:
                raise InputError(f"corpus={corpus!r}: {e}") from None
        self.model_args = {"lm": lm if isinstance(lm, str) else type(lm).__name__, "corpus": corpus,
                           **({"retrieval": retrieval} if retrieval else {}),
                           "encoder": encoder if isinstance(encoder, str) else type(encoder).__name__, "k": k,
                           "method": self.method, "workdir": workdir}
        if isinstance(lm, str):
            from replug_jax.loading import load_lm

            lm = load_lm(lm, **({"tokenizer": tokenizer} if tokenizer else {}))
        if workdir and cache:  # a rerun resumes: every score and answer the LM gave is read back (as the jobs do)
            from replug_jax.lm.cache import CachedLM

            lm = CachedLM(lm, os.path.join(workdir, LM_CACHE_FILE))
        if self.method == "none":
            self.rag = None
            self.lm = lm
        elif given is not None:
            self.rag = REPLUG.from_retrieval_file(given, lm=lm, k=k, temperature=temperature,
                                                  doc_template=doc_template, weights=weights,
                                                  posterior_alpha=posterior_alpha, rerank_depth=rerank_depth)
            self.lm = self.rag.lm
        else:
            self.rag = REPLUG.from_documents(documents, lm=lm, encoder=encoder, k=k, temperature=temperature,
                                             doc_tokens=doc_tokens, doc_template=doc_template, workdir=workdir,
                                             weights=weights, posterior_alpha=posterior_alpha,
                                             rerank_depth=rerank_depth, drop_empty_documents=drop_empty_documents)
            self.lm = self.rag.lm

    # ------------------------------------------------------------------ lm-eval's chat templates
    @property
    def tokenizer_name(self) -> str:
        """What lm-eval's request cache keys a chat-templated run by: the LM and its template."""
        import hashlib

        template = chat_templates.template_of(self.lm.tokenizer) or ""
        return f"{self.model_args['lm']}-{hashlib.sha256(template.encode()).hexdigest()[:12]}".replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The LM's chat template (--apply_chat_template); refused in one line where it has none."""
        template = chat_templates.template_of(self.lm.tokenizer)
        if chat_template and template is None:
            raise InputError(no_chat_template(self.model_args["lm"]))
        return template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        """lm-eval's chat history (system instruction, shots as turns with --fewshot_as_multiturn, the request) as
        the LM's template writes it (models/chat_templates.py); passages are then written before it, as before any
        context."""
        return chat_templates.render(self.lm.tokenizer, chat_history, add_generation_prompt)

    # ------------------------------------------------------------------ lm-eval's three requests
    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """(log p(continuation | context), is_greedy) per request, under REPLUG's mixture; `CHUNK` requests per LM
        call."""
        out = []
        for chunk in self._chunks(requests, "loglikelihood"):
            contexts, continuations = zip(*(lm_eval_pair(*instance.args) for instance in chunk))
            queries = self._queries(chunk)
            shots, contexts = self._layout(chunk, contexts)
            if self.is_greedy:
                out += list(zip(*self.logliks_and_greedy(contexts, continuations, queries, shots)))
            else:
                out += [(ll, self._not_greedy())
                        for ll in self.continuation_logliks(contexts, continuations, queries, shots)]
        return out

    def loglikelihood_rolling(self, requests) -> list[float]:
        """log p(text) per request: the LM evaluation's windows over every token of the text."""
        out = []
        for i, instance in enumerate(tqdm(requests, desc=f"replug {self.method}: rolling",
                                          disable=len(requests) < 2)):
            (text,) = instance.args
            windows = document_windows(f"request{i}", text, self.lm.tokenizer, whole=True, **self.windows)
            first, rest = windows[:1], windows[1:]  # the first stretch has no query: the LM's alone
            logliks = self.continuation_logliks([w.prefix for w in first], [w.continuation for w in first], None)
            if rest:
                logliks += self.continuation_logliks([w.prefix for w in rest], [w.continuation for w in rest],
                                                     [w.query for w in rest] if self.rag is not None else None)
            out.append(float(np.sum(logliks, dtype=np.float64)))
        return out

    def generate_until(self, requests) -> list[str]:
        """REPLUG's greedy ensembled answer per request, cut before the first of its `until` strings; requests with
        the same `until` and `max_gen_toks` decoded together."""
        out = [None] * len(requests)
        settings_of = [self._generation_settings(instance) for instance in requests]
        for key in dict.fromkeys(settings_of):
            at = [i for i, s in enumerate(settings_of) if s == key]
            done = 0
            for chunk in self._chunks([requests[i] for i in at], "generate_until"):
                shots, contexts = self._layout(chunk, [instance.args[0] for instance in chunk])
                gens = self.decode(contexts, key[1], key[0], self._queries(chunk), shots)
                for i, g in zip(at[done:], gens):
                    out[i] = g.text
                done += len(chunk)
        return out

    # ------------------------------------------------------------------ many requests at once
    def continuation_logliks(self, contexts, continuations, queries, shots=None) -> list[float]:
        """log p(continuation | context) per pair: the mixture's, retrieving for each query (each pass `shots` ∘
        passage ∘ context where `shots` are given: `_layout`), or the LM's alone without queries (no retrieval, or a
        window's first stretch)."""
        if self.rag is None or queries is None:
            lps = self.lm.score(list(contexts), list(continuations))
        else:
            lps = self.rag.score_many(list(contexts), list(continuations), list(queries), shots)
        return [float(np.sum(lp, dtype=np.float64)) for lp in lps]

    def logliks_and_greedy(self, contexts, continuations, queries, shots=None) -> tuple[list[float], list[bool]]:
        """(log p(continuation | context), is_greedy) per pair: is_greedy from the scoring pass's own top tokens
        where they decide it (method/greedy_match.py: a local LM, REPLUG or alone), by greedy decoding where they do
        not (an LM without `score_top`, posterior weights, a near-tie). `greedy_counts` adds up which was which."""
        if self.rag is not None and queries is not None:
            lps, flags = self.rag.score_and_greedy(list(contexts), list(continuations), list(queries), shots)
        elif hasattr(self.lm, "score_top"):
            scored = self.lm.score_top(list(contexts), list(continuations), greedy_match.TOP)
            lps, flags = [x.logprobs for x in scored], [greedy_match.mixture_is_greedy([x], [0.0]) for x in scored]
        else:
            lps, flags = self.lm.score(list(contexts), list(continuations)), [None] * len(contexts)
        open_ = [i for i, f in enumerate(flags) if f is None]
        if open_:
            decoded = self.greedy([contexts[i] for i in open_], [continuations[i] for i in open_],
                                  None if queries is None else [queries[i] for i in open_],
                                  None if shots is None else [shots[i] for i in open_])
            for i, g in zip(open_, decoded):
                flags[i] = g
        self.greedy_counts["from scoring"] += len(flags) - len(open_)
        self.greedy_counts["decoded"] += len(open_)
        return [float(np.sum(lp, dtype=np.float64)) for lp in lps], [bool(f) for f in flags]

    def decode(self, contexts, max_new_tokens: int, stop: tuple, queries, shots=None) -> list:
        """REPLUG's greedy `Generation` after each context (the LM's alone without retrieval); with `shots` (per
        context: `_layout`), those of one few-shot block decoded together, the block their shared prefix."""
        if self.rag is None:
            return self.lm.generate([[c] for c in contexts], [np.zeros(1, np.float32)] * len(contexts),
                                    max_new_tokens=max_new_tokens, stop=stop)
        shots = [""] * len(contexts) if shots is None else list(shots)
        out = [None] * len(contexts)
        for block in dict.fromkeys(shots):
            at = [i for i, b in enumerate(shots) if b == block]
            gens = self.rag.generations([contexts[i] for i in at], max_new_tokens=max_new_tokens, stop=stop,
                                        queries=[queries[i] for i in at], shots=block)
            for i, g in zip(at, gens):
                out[i] = g
        return out

    def greedy(self, contexts, continuations, queries, shots=None) -> list[bool]:
        """Whether greedy decoding from each context gives exactly its continuation's tokens (those of one length
        decoded together)."""
        wanted = [list(self.lm.tokenizer.encode(c)) for c in continuations]
        out = [False] * len(wanted)
        for n in sorted({len(w) for w in wanted}):
            at = [i for i, w in enumerate(wanted) if len(w) == n]
            gens = self.decode([contexts[i] for i in at], n, (), None if queries is None else [queries[i] for i in at],
                               None if shots is None else [shots[i] for i in at])
            for i, g in zip(at, gens):
                out[i] = list(g.token_ids[:n]) == wanted[i]
        return out

    def _queries(self, instances) -> list[str] | None:
        return [self.queries(instance) for instance in instances] if self.rag is not None else None

    def _layout(self, instances, contexts) -> tuple[list[str] | None, list[str]]:
        """(each request's few-shot block or None, the rest of its context) as `passages=` places the passage
        between them: None, the contexts whole with passages=context (or no retrieval); else each context split
        before the instance's own text (doc_to_text), its block with each shot's own top passage before the shot's
        text where passages=example_and_shots."""
        if self.passages == "context" or self.rag is None:
            return None, list(contexts)
        shots, rest = [], []
        for instance, context in zip(instances, contexts):
            own = self.queries.own_text(instance).rstrip()
            at = context.rfind(own)
            if at < 0:
                raise InputError(f"passages={self.passages}: the example's own text (doc_to_text of "
                                 f"{instance.task_name!r} #{instance.doc_id}, {own[:40]!r}) is not in the request's "
                                 "context (a chat template?), so there is no place beside it for the passage: use "
                                 "passages=context")
            block = context[:at]
            if self.passages == "example_and_shots":
                block = self._block_with_passages(instance.task_name, block)
            shots.append(block)
            rest.append(context[at:])
        return shots, rest

    def _block_with_passages(self, task_name: str, block: str) -> str:
        """The few-shot `block` with each shot's own top passage (`doc_template`) before the shot's text, retrieved
        for by the shot's query (the task's few-shot docs found in the block by their text), as the QA job shows its
        demos; the shots are found once per block."""
        key = (task_name, block)
        if key not in self._blocks:
            found = {}  # where a shot's text starts in the block -> (its text, its query): the longest text there
            for text, query in self.queries.shots(task_name):
                at = block.find(text)
                if at >= 0 and len(text) > len(found.get(at, ("",))[0]):
                    found[at] = (text, query)
            if not found and block.strip():
                self._warn_once(f"shots:{task_name}", f"passages=example_and_shots: {task_name}: no few-shot doc's "
                                "text found in the block before the example, so its shots get no passages")
            starts = sorted(found)
            if starts:
                _, rows = self.rag.retriever.retrieve([found[at][1] for at in starts], 1)  # [S, 1]
                docs = format_docs(self.rag.datastore, rows[:, 0], self.rag.doc_template)
                for at, doc in reversed(list(zip(starts, docs))):  # from the end: earlier positions stay put
                    block = block[:at] + doc + block[at:]
            self._blocks[key] = block
        return self._blocks[key]

    def _chunks(self, requests, kind: str):
        """`requests` in chunks of `CHUNK`, under a progress bar."""
        with tqdm(total=len(requests), desc=f"replug {self.method}: {kind}", disable=len(requests) < 2) as bar:
            for start in range(0, len(requests), CHUNK):
                chunk = requests[start : start + CHUNK]
                yield chunk
                bar.update(len(chunk))

    def _generation_settings(self, instance) -> tuple[tuple, int]:
        """(stop strings, max new tokens) of a generate_until request; sampling asked for is said once per task."""
        kwargs = dict(instance.args[1] or {})
        until = kwargs.pop("until", None) or ()
        until = (until,) if isinstance(until, str) else tuple(until)
        if kwargs.get("do_sample") or kwargs.get("temperature"):
            self._warn_once(f"sampling:{instance.task_name}", f"{instance.task_name}: do_sample / temperature in "
                            f"{kwargs} ignored: REPLUG decodes greedily")
        return until, int(kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))

    def _not_greedy(self) -> bool:
        self._warn_once("is_greedy", "is_greedy=false: every request's is_greedy is reported False, so greedy-match "
                                     "metrics (a loglikelihood task's acc, multiple choice's exact_match) read 0")
        return False

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

    def get_model_info(self) -> dict:
        """What results.json's config records of the model beside its model_args."""
        return dict(self.model_args)
