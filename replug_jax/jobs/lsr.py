"""The REPLUG LSR job: train the retriever with LM supervision.

On text documents (`train_data`: JSONL / .txt / "gensim_wiki"), it then evaluates none / REPLUG / REPLUG LSR
on held-out windows. On question–answer pairs (`train_data`: "sciq", "nq_open", "trivia_qa" or a JSONL of
{"question", "answers"}; with `lsr_target="question"` the rows may be questions alone), it trains over the
downstream corpus and leaves WORKDIR/retriever.safetensors (and WORKDIR/train_questions.json) for the QA job's
`replug_lsr` method (`--config.retriever_workdir=WORKDIR`), which refuses to evaluate a question that training
saw. `lsr_target` (recorded in results.json's "lsr" with the KL direction): "answer" scores y after d ∘ x (the
paper), "question" scores x after d (ART). Only this module (and main.py) reads configs.
"""
from __future__ import annotations

import dataclasses
import os
import time

from absl import logging

from replug_jax.base import console
from replug_jax.base.errors import InputError
from replug_jax.data import question_sets
from replug_jax.jobs import bucket_workdirs, prepare, results_file, trained_retriever
from replug_jax.jobs.input_checks import read_methods
from replug_jax.jobs.window_report import evaluate_and_report, warn_early
from replug_jax.method.passages import QA_DOC_TEMPLATE
from replug_jax.parallel import distributed, sharding
from replug_jax.train.queries import (
    check_disjoint,
    first_training_row,
    qa_training_examples,
    trained_questions_record,
    training_examples,
    trains_on_questions,
)
from replug_jax.train.loop import LSRSettings, train_lsr

TRAIN_QUESTIONS = prepare.TRAIN_QUESTIONS


def _train_and_save(config, workdir: str, prepared_encoder, lm, store, examples, settings: LSRSettings, index,
                    questions: dict | None = None) -> dict:
    """Run the LSR loop in WORKDIR/lsr and save the trained retriever in WORKDIR (`trained_retriever.save`; QA
    pairs: with the training `questions` record)."""
    logging.info("LSR: %d training examples, %s", len(examples), settings)
    trained = train_lsr(prepared_encoder, lm, store, examples, os.path.join(workdir, "lsr"), settings,
                        initial_index=index, on_checkpoint=bucket_workdirs.sync)  # a bucket gets each checkpoint
    if distributed.is_lead():
        trained_retriever.save(workdir, trained["params"], encoder=config.encoder,
                               train_documents=settings.train_documents, questions=questions)
    return trained


def run_lsr(config, workdir: str) -> dict:
    if config.get("index_backend", "faiss") != "faiss":
        raise InputError("the LSR job searches (and refreshes) FAISS indexes: index_backend must be 'faiss'")
    if sharding.spans_processes(sharding.job_lm_mesh(config.get("lm_model_parallel", 1))):
        raise InputError(f"lm_model_parallel={config.lm_model_parallel} spans processes, but LSR training gives each "
                         "process its own examples: use at most one host's devices for the LM's model axis")
    if trains_on_questions(config.train_data):
        return run_lsr_on_questions(config, workdir)
    methods = read_methods(config)
    warn_early(config)  # a k sweep beyond k, said before the models load
    prepared = prepare.prepare(config, workdir)  # models, datastore, index
    train_docs = prepare.read_documents(prepared.paths["train"])
    check_disjoint(train_docs, prepared.store)
    eval_ids = {d.id for d in prepare.read_documents(prepared.paths["eval"])}
    if eval_ids & {d.id for d in train_docs}:
        raise InputError("training and evaluation documents overlap")
    examples = training_examples(train_docs, prepared.tokenizer, query_tokens=config.train_query_tokens,
                                 continuation_tokens=config.train_continuation_tokens, seed=config.seed,
                                 max_examples=config.get("max_train_examples") or None)
    settings = LSRSettings.from_mapping(config)
    trained = _train_and_save(config, workdir, prepared.encoder, prepared.lm, prepared.store, examples, settings,
                              prepared.index)
    encoder_lsr = prepared.encoder.with_params(trained["params"], name=f"{config.encoder}+lsr")
    retrievers = prepare.make_retrievers(methods, prepared.encoder, prepared.store, prepared.index,
                                           config.seed)
    retrievers["replug_lsr"] = prepare.trained_retriever(
        prepared.encoder, encoder_lsr, settings.train_documents, prepared.store, prepared.index, workdir,
        metric=config.metric, factory=config.index_factory, embedding_dtype=config.embedding_dtype)
    extra = {"lsr": {**dataclasses.asdict(settings), "training_examples": len(examples), **trained["stats"]}}
    tau_lsr = config.get("lsr_temperature") or config.temperature  # both are reported: τ and γ are in the sweep
    return evaluate_and_report(config, workdir, prepared, retrievers, extra, temperatures={"replug_lsr": tau_lsr},
                               temperature_sweep=(settings.gamma, config.temperature, tau_lsr))


def training_questions(config) -> list:
    """The QA training pairs: `train_data`'s `train_split` from `first_training_row` on (SciQ's evaluated questions
    come first, so its default offset keeps training disjoint; a user's file trains on all rows unless
    `train_offset` is set). With `lsr_target="question"` a JSONL's rows may be questions without answers."""
    target = config.get("lsr_target", "answer")
    try:
        questions = question_sets.load_qa(config.train_data, config.get("train_split", "validation"),
                                            answers_required=target != "question")
    except question_sets.MissingAnswers as e:
        raise question_sets.MissingAnswers(
            f"{e} for --config.lsr_target={target!r} (LSR scores the gold answer); questions without answers "
            "train with --config.lsr_target=question (ℓ = log p(question | passage))") from None
    return questions[first_training_row(config.train_data, config.get("train_offset")):]


def run_lsr_on_questions(config, workdir: str) -> dict:
    """LSR on question–answer pairs over the downstream corpus; writes the trained retriever, the training
    questions and WORKDIR/results.json (settings, counts, seconds); the QA job evaluates it."""
    started = time.time()
    os.makedirs(workdir, exist_ok=True)
    target = config.get("lsr_target", "answer")
    questions = training_questions(config)  # before the models: a file without answers is refused in seconds
    examples = qa_training_examples(questions, seed=config.seed, max_examples=config.get("max_train_examples") or None,
                                    target=target)
    what = "question-answer pairs" if target == "answer" else "questions (ℓ = log p(question | passage))"
    console.phase(f"training: {len(examples)} {what} from {config.train_data!r} "
                  f"(rows {first_training_row(config.train_data, config.get('train_offset'))} on)")
    prepared = prepare.prepare_downstream(config, workdir)  # models (the LM behind lm_cache), datastore, index
    encoder, lm, store, index = prepared.encoder, prepared.lm, prepared.store, prepared.index
    settings = dataclasses.replace(LSRSettings.from_mapping(config), doc_template=QA_DOC_TEMPLATE)
    trained = _train_and_save(config, workdir, encoder, lm, store, examples, settings, index,
                              trained_questions_record(config.train_data, examples))
    results = {"task": "lsr_qa", "train_data": config.train_data, "training_questions": len(examples),
               "corpus": config.corpus, "datastore_passages": len(store), "encoder": config.encoder, "lm": config.lm,
               "lsr": {**dataclasses.asdict(settings), **trained["stats"]}, "seconds": time.time() - started}
    results["config"] = results_file.config_record(config)
    if distributed.is_lead():
        results_file.save(results, workdir)
        console.phase(f"trained retriever in {os.path.join(workdir, prepare.TRAINED_RETRIEVER)}; evaluate it with "
                      f"the QA job: --config.methods=...,replug_lsr --config.retriever_workdir={workdir}")
    return results
