"""Every setting a job, the REPLUG object or the LSR loop takes: its type, range and meaning, declared once.

`SETTINGS` maps each config key (experiments/configs/*.py) to a `Setting`: a range (`Whole`, `Number`, `Choice`,
`Flag`, `Text`, `Several`, `Names`) and one line saying what it does. `check_settings(values)` refuses, in one
line naming the key, a value of the wrong type or outside its range, and a key no job reads; the command line
(jobs/input_checks.py, before any model loads), the experiments scripts (through the same check), the REPLUG object
(replug.py) and `LSRSettings` (train/loop.py) all check through it, and `--help --config FILE` prints it. A config
key without an entry here is refused at run time and fails tests/test_settings.py.

What a single value cannot tell is checked where the other values are known (jobs/input_checks.py): a file that
does not exist, an unknown model, k beyond the datastore, a re-ranking depth below k, swap_after >= refresh_every.
Where a library module branches on a choice it keeps its own tuple (lsr_loss.DIRECTIONS, ...);
tests/test_settings.py checks that the two agree.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

from replug_jax.base.errors import InputError


def _is_whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # numpy's integers too


@dataclasses.dataclass(frozen=True)
class Whole:
    """A whole number of at least `least` (and at most `most`); `none`: what None means, where None is allowed."""

    least: int
    most: int | None = None
    none: str = ""

    def problem(self, value) -> str | None:
        if value is None and self.none:
            return None
        if not _is_whole(value) or value < self.least or self.most is not None and value > self.most:
            return self.says()
        return None

    def says(self) -> str:
        upper = f" and at most {self.most}" if self.most is not None else ""
        return f"a whole number, at least {self.least}{upper}" + (f" (or None: {self.none})" if self.none else "")


@dataclasses.dataclass(frozen=True)
class Number:
    """A finite number `above` / `least` (exclusive / inclusive lower bound) and `below` / `most` (upper)."""

    above: float | None = None
    least: float | None = None
    below: float | None = None
    most: float | None = None
    none: str = ""

    def problem(self, value) -> str | None:
        if value is None and self.none:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return self.says()
        if (self.above is not None and not value > self.above or self.least is not None and not value >= self.least
                or self.below is not None and not value < self.below or self.most is not None and not value <= self.most):
            return self.says()
        return None

    def says(self) -> str:
        bounds = [f"above {self.above:g}" if self.above is not None else "",
                  f"at least {self.least:g}" if self.least is not None else "",
                  f"below {self.below:g}" if self.below is not None else "",
                  f"at most {self.most:g}" if self.most is not None else ""]
        text = "a number" + (", " + " and ".join(b for b in bounds if b) if any(bounds) else "")
        return text + (f" (or None: {self.none})" if self.none else "")


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of `choices` (strings)."""

    choices: tuple[str, ...]

    def problem(self, value) -> str | None:
        return None if isinstance(value, str) and value in self.choices else self.says()

    def says(self) -> str:
        return "one of " + ", ".join(repr(c) for c in self.choices)


@dataclasses.dataclass(frozen=True)
class Flag:
    """True or False."""

    def problem(self, value) -> str | None:
        return None if isinstance(value, bool) else self.says()

    def says(self) -> str:
        return "True or False"


@dataclasses.dataclass(frozen=True)
class Text:
    """A string whose accepted values are `what` (a file, a model name, ...: checked in jobs/input_checks.py)."""

    what: str

    def problem(self, value) -> str | None:
        return None if isinstance(value, str) else self.says()

    def says(self) -> str:
        return f"a string: {self.what}"


@dataclasses.dataclass(frozen=True)
class Several:
    """A tuple (or list) of values each in `item` (empty allowed)."""

    item: Whole | Number | Text

    def problem(self, value) -> str | None:
        if not isinstance(value, (tuple, list)) or any(self.item.problem(v) for v in value):
            return self.says()
        return None

    def says(self) -> str:
        return f"a tuple, each item {self.item.says()}"


@dataclasses.dataclass(frozen=True)
class Names:
    """Names as a comma-separated string ("none,replug", as the command line gives them) or a tuple of strings; which
    names a job knows is its own (jobs/input_checks.py `job_methods`)."""

    what: str

    def problem(self, value) -> str | None:
        if isinstance(value, str) or isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value):
            return None
        return self.says()

    def says(self) -> str:
        return f"{self.what}, comma-separated or a tuple of strings"


Range = Whole | Number | Choice | Flag | Text | Several | Names


@dataclasses.dataclass(frozen=True)
class Setting:
    range: Range
    meaning: str


def _s(range_: Range, meaning: str) -> Setting:  # keeps each entry on its line
    return Setting(range_, meaning)


MODEL = "a packaged name, a local folder or file, a hub id (org/name), or for the LM an http(s) server URL"
DATA = "a JSONL file of {text, title?, id?}, a .txt file or folder of them, a packaged name, or tfds:NAME:SPLIT[:TEXT[:TITLE]]"
DTYPES = ("auto", "float32", "bfloat16", "float16")

SETTINGS: dict[str, Setting] = {
    # what runs
    "job": _s(Choice(("lm_eval", "lsr", "qa", "mmlu")), "the job this config runs"),
    "methods": _s(Names("methods of the job"), "what is evaluated, in order (README: each job's methods)"),
    # data
    "corpus": _s(Text(f"{DATA}, DPR's psgs_w100.tsv, or gensim_wiki"), "the documents retrieved from (the datastore)"),
    "retrieval_file": _s(Text("DPR's / FiD's JSON or JSONL with ctxs, or {query, ctxs} lines; several joined by commas"),
                         "QA and multiple choice: each question's passages as given (no corpus, no index; "
                         "retrieval/given.py)"),
    "max_passages": _s(Whole(0), "a DPR .tsv corpus: read only its first N passages (0: all)"),
    "eval_data": _s(Text(DATA), "held-out documents whose windows are scored"),
    "questions": _s(Text("a JSONL file of {question, answers}, nq_open, trivia_qa, sciq, mmlu, demo, olmes:TASK:FORM, "
                         "or tfds:NAME:SPLIT"), "the questions answered"),
    "demos": _s(Text("as questions take, or \"\": the first `shots` questions, removed from them"),
                "the few-shot demonstrations"),
    "split": _s(Text("a split of the questions' data set (validation, test, dev, train)"), "the questions' split"),
    "demo_split": _s(Text("a split of the demos' data set"), "the demos' split"),
    "subjects": _s(Several(Text("an MMLU subject")), "MMLU subjects evaluated (empty: all 57)"),
    "max_questions": _s(Whole(0), "questions evaluated (0: all)"),
    "question_offset": _s(Whole(0), "questions skipped first (after the demos are removed): a dev split, then held out"),
    "shots": _s(Whole(0), "few-shot demonstrations in each prompt"),
    "eval_fraction": _s(Number(least=0, below=1), "gensim_wiki: the share of articles held out for evaluation"),
    "train_fraction": _s(Number(least=0, below=1), "gensim_wiki: the share of articles kept for LSR training"),
    "wiki_split": _s(Choice(("by_article", "related")), "gensim_wiki: whole articles to one part, or \"related\": the "
                     "opening of each held-out article also in the datastore"),
    "held_out_fraction": _s(Number(above=0, below=1), "wiki_split related: the held-out share of each article"),
    "max_eval_docs": _s(Whole(1), "held-out documents scored"),
    "max_windows_per_doc": _s(Whole(0), "windows scored per held-out document (0: all)"),
    "train_data": _s(Text(f"{DATA}, or questions (sciq, nq_open, trivia_qa, a JSONL of {{question, answers}})"),
                     "LSR's training documents or questions (disjoint from the datastore)"),
    "train_split": _s(Text("a split of the training questions' data set"), "LSR on questions: their split"),
    "train_offset": _s(Whole(0, none="300 for sciq, whose first rows sciq.py evaluates; else 0"),
                       "LSR on questions: rows of train_data skipped"),
    "max_train_examples": _s(Whole(0), "LSR training examples read (0: all)"),
    # models
    "lm": _s(Text(MODEL), "the black-box LM (as rj.load_lm takes it)"),
    "lm_tokenizer": _s(Text("\"\" (the LM's own; a server's /tokenize) or, for a server URL, a model name"),
                       "for an LM behind a server URL: the tokenizer that cuts text locally"),
    "encoder": _s(Text(MODEL.split(", or for")[0]), "the retriever's encoder (as rj.load_encoder takes it)"),
    "retriever_workdir": _s(Text("an LSR job's workdir (local or gs://), or \"\""),
                            "replug_lsr: the LSR job whose trained retriever is evaluated"),
    # the HTTP client (an LM behind a server URL only)
    "lm_timeout": _s(Number(above=0), "seconds one server request may take before it is retried"),
    "lm_retries": _s(Whole(0), "retries of a failed server request before the run fails"),
    "lm_concurrency": _s(Whole(1), "server requests in flight at once"),
    "lm_prompts_per_request": _s(Whole(0), "prompts per completions request (0: the probe decides)"),
    # the datastore and the index
    "doc_tokens": _s(Whole(1), "passage length in LM tokens when documents are cut into the datastore"),
    "drop_empty_documents": _s(Flag(), "leave out documents with no text (each named in a warning); else they are "
                                       "refused"),
    "metric": _s(Choice(("cosine", "ip")), "retrieval score: cosine similarity or the unnormalised inner product"),
    "index_factory": _s(Text("a FAISS index_factory string (Flat: exact)"), "the FAISS index built over the passages"),
    "index_backend": _s(Choice(("faiss", "device")), "search in a FAISS index on the host, or exactly on the devices"),
    "device_index_dtype": _s(Choice(("float32", "bfloat16")), "index_backend device: the embeddings' dtype there"),
    "embedding_dtype": _s(Choice(("float32", "float16")), "the corpus embeddings' dtype on disk"),
    "cache_dir": _s(Text("a local folder, or \"\": the workdir"), "where the datastore, embeddings and index live; "
                    "runs over one corpus may share it"),
    "lm_cache": _s(Text("\"workdir\" (WORKDIR/lm_cache.sqlite), a local file, or \"\": none"),
                   "SQLite cache of the LM's scores and answers: the same command rerun resumes"),
    # REPLUG
    "k": _s(Whole(1), "passages retrieved per input (LSR: per training query; eval_k at evaluation)"),
    "eval_k": _s(Whole(0), "LSR: passages ensembled at evaluation (0: k)"),
    "k_sweep": _s(Several(Whole(1)), "other k also reported (the passes of the largest k reused)"),
    "temperature": _s(Number(above=0), "τ of REPLUG's weights λ = softmax(s / τ)"),
    "temperature_sweep": _s(Several(Number(above=0)), "other τ also reported for REPLUG (the same passes)"),
    "bm25_temperature": _s(Number(above=0), "τ of the bm25 method's weights over BM25 scores"),
    "posterior_alpha": _s(Number(least=0), "replug_posterior: λ ∝ exp(s/τ + α log p(input | passage)); 0: REPLUG's"),
    "rerank_depth": _s(Whole(0), "replug_posterior: passages scored before the k best are kept (0: k)"),
    "posterior_evidence": _s(Choice(("question", "demos")), "replug_posterior in QA: ℓ = log p(question | passage) "
                             "zero-shot, or after the demos"),
    "ensemble": _s(Choice(("replug", "vote")), "QA's replug method: the per-token mixture, or the official code's vote"),
    "demo_passages": _s(Choice(("top1", "answer")), "each demo's passage: its top-1, or its best-ranked holding its "
                        "answer"),
    "query_with_options": _s(Flag(), "multiple choice: the options are part of the retrieval query"),
    "scoring": _s(Choice(("letters", "options")), "multiple choice: score the option letters, or each option's text"),
    "option_metric": _s(Choice(("", "acc", "acc_per_char", "acc_per_token")),
                        "scoring options: which accuracy decides (\"\": an OLMES file's own)"),
    # windows and generation
    "query_tokens": _s(Whole(1), "LM evaluation: the previous tokens that form the retrieval query"),
    "context_tokens": _s(Whole(1), "LM evaluation: LM context before each scored stretch"),
    "stride_tokens": _s(Whole(1), "LM evaluation: tokens scored per window"),
    "windows_file": _s(Flag(), "LM evaluation: WORKDIR/windows.jsonl with each window's passages and λ"),
    "max_new_tokens": _s(Whole(1), "greedy decoding stops at a newline or after this many tokens"),
    "answer_nll": _s(Flag(), "QA: also report the gold answer's NLL under each method's mixture"),
    "answer_nll_demos": _s(Flag(), "QA: the answer NLL's passes with the demo block (True) or zero-shot (False)"),
    # running
    "lm_batch_size": _s(Whole(1), "sequences per LM forward pass"),
    "lm_max_length": _s(Whole(0), "LM window in tokens (0: the LM's own)"),
    "lm_model_parallel": _s(Whole(1), "devices holding one copy of the LM's weights between them"),
    "lm_generation_questions": _s(Whole(1), "questions a local LM decodes at once (their passes' caches on the "
                                            "devices together: python -m replug_jax.plan says what fits a TPU)"),
    "encoder_batch_size": _s(Whole(1), "texts per encoder forward pass"),
    "seed": _s(Whole(0), "seed of every random choice (data split, random passages, shuffling)"),
    "multihost": _s(Flag(), "TPU VM hosts: jax.distributed.initialize() finds the others"),
    "dtype": _s(Choice(DTYPES), "compute dtype (auto: bfloat16 on TPU/GPU, float32 on CPU)"),
    "param_dtype": _s(Choice(DTYPES), "weights' dtype (auto: as dtype; LSR trains the retriever in float32)"),
    # REPLUG LSR
    "steps": _s(Whole(1), "LSR training steps"),
    "batch_size": _s(Whole(1), "LSR training queries per step"),
    "learning_rate": _s(Number(above=0), "LSR: peak learning rate (AdamW, linear warmup and decay)"),
    "warmup_fraction": _s(Number(least=0, below=1), "LSR: the share of steps spent warming the learning rate up"),
    "clip_norm": _s(Number(above=0, none="no clipping"), "LSR: gradients clipped to this global norm"),
    "gamma": _s(Number(above=0), "LSR: γ of the retrieval likelihood P_R = softmax(s / γ)"),
    "beta": _s(Number(above=0), "LSR: β of the LM likelihood Q = softmax(ℓ / β)"),
    "direction": _s(Choice(("pr_q", "q_pr")), "LSR's loss: KL(P_R ‖ Q) as the paper, or KL(Q ‖ P_R) as Atlas"),
    "lm_score": _s(Choice(("sum", "mean")), "LSR: ℓ sums the target's token log-probabilities (the paper) or averages"),
    "lsr_target": _s(Choice(("answer", "question")), "LSR: ℓ scores the continuation after d ∘ x (the paper), or x "
                     "after d (ART)"),
    "train_documents": _s(Flag(), "LSR: also train the document side, re-embedding the corpus (False: queries only)"),
    "recompute_activations": _s(Flag(), "LSR train step: keep only each encoder layer's input and recompute its "
                                "activations for the gradient (a third more compute, a batch's activations no longer "
                                "held: for a batch that does not fit a chip)"),
    "lsr_temperature": _s(Number(least=0), "τ of replug_lsr at evaluation (0: temperature)"),
    "refresh_every": _s(Whole(1), "LSR: steps between re-embeddings of the corpus"),
    "swap_after": _s(Whole(0), "LSR: steps between a refresh's request and its swap (0: synchronous)"),
    "train_query_tokens": _s(Whole(1), "LSR on text: the query window's tokens"),
    "train_continuation_tokens": _s(Whole(0), "LSR on text: the continuation's tokens (the answer target's y)"),
    "query_max_tokens": _s(Whole(0), "LSR train step: encoder tokens per query (0: the encoder's own length)"),
    "doc_max_tokens": _s(Whole(0), "LSR train step: encoder tokens per document (0: the encoder's own length)"),
    "checkpoint_every": _s(Whole(1), "LSR: steps between checkpoints"),
    "keep_checkpoints": _s(Whole(1), "LSR: checkpoints kept"),
    "log_every": _s(Whole(1), "LSR: steps between metric lines"),
}


HTTP_CLIENT = ("lm_timeout", "lm_retries", "lm_concurrency")  # read only for an LM behind a server URL


def check_value(key: str, value: Any, prefix: str = "--config.") -> None:
    """Refuse `value` for `key` when it is outside the declared range (InputError, one line naming both)."""
    if key not in SETTINGS:
        raise InputError(f"{prefix}{key}: not a setting of any job (python -m replug_jax.main --help --config FILE "
                         "lists a config's keys)")
    problem = SETTINGS[key].range.problem(value)
    if problem:
        raise InputError(f"{prefix}{key}={value!r}: must be {problem} — {SETTINGS[key].meaning}")


def check_settings(values: Mapping[str, Any], prefix: str = "--config.") -> None:
    """Every key of `values` (a config, a dict) declared and in its range; the first problem raises InputError."""
    for key, value in values.items():
        check_value(key, value, prefix)


_PLACES = {key: i for i, key in enumerate(SETTINGS)}


def declared_order(key: str) -> int:
    """`key`'s place in `SETTINGS` (grouped by what it sets), for listing a config's keys; undeclared keys last."""
    return _PLACES.get(key, len(SETTINGS))


def describe(key: str) -> str:
    """`key`'s meaning and range on one line, as `--help --config FILE` prints them."""
    setting = SETTINGS[key]
    return f"{setting.meaning} [{setting.range.says()}]"


# REPLUG's recommended QA setting (README "Recommended"; experiments/configs/qa.py says how it was chosen), declared
# once: the REPLUG object's defaults (replug.py) and experiments/configs/qa.py's values, so that the object and the QA
# job, given nothing, mix alike (tests/test_settings.py). The LM evaluation and multiple-choice configs keep the paper's
# weights at τ 1.
QA_WEIGHTS = "replug_posterior"  # the object's `weights`; the QA job runs it among its methods
QA_DEFAULTS = {"k": 4, "temperature": 0.03, "posterior_alpha": 0.5, "rerank_depth": 16, "doc_tokens": 128}

