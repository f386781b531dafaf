"""The REPLUG LSR job: train the retriever with LM supervision, then evaluate none / REPLUG / REPLUG LSR.

Only this module (and main.py) reads configs; it turns them into `LSRSettings` and plain arguments.
"""
from __future__ import annotations

import dataclasses
import os

import jax
from absl import logging

from replug_jax import distributed, sharding
from replug_jax.jobs import lm_eval as eval_run
from replug_jax.jobs import setup
from replug_jax.models.weights import load_params, save_params
from replug_jax.retrieval.retriever import DenseRetriever
from replug_jax.train.data import check_disjoint, training_examples
from replug_jax.train.loop import LSRSettings, train_lsr


TRAINED_RETRIEVER = "retriever.safetensors"  # in an LSR workdir: the trained retriever's parameters


def load_trained_encoder(encoder, lsr_workdir: str):
    """(`encoder` with the parameters an LSR job trained (WORKDIR/retriever.safetensors), named "+lsr",
    whether the documents were trained too: False means the trained encoder embeds queries only and
    searches an index built by the original `encoder`)."""
    path = os.path.join(lsr_workdir, TRAINED_RETRIEVER)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no trained retriever (run the LSR job with --workdir {lsr_workdir} first)")
    params, meta = load_params(path, jax.device_get(encoder.params))
    if meta.get("encoder") not in (None, encoder.name):
        raise ValueError(f"{path} was trained from encoder {meta['encoder']!r}, not {encoder.name!r}")
    return encoder.with_params(params, name=f"{encoder.name}+lsr"), meta.get("train_documents", "true") == "true"


def trained_retriever(encoder, trained, train_documents: bool, store, index, workdir: str, config) -> DenseRetriever:
    """The REPLUG LSR retriever: the trained encoder on both sides (an index re-embedded with it in
    WORKDIR/index_lsr), or, query-side only, the trained query encoder over the original `index`."""
    if not train_documents:
        return DenseRetriever(trained, index, store, document_encoder=encoder)
    index_lsr = setup.build_dense_index(trained, store, workdir, metric=config.metric, factory=config.index_factory,
                                           embedding_dtype=config.embedding_dtype, name="lsr")
    return DenseRetriever(trained, index_lsr, store)


def lsr_settings(config) -> LSRSettings:
    names = {f.name for f in LSRSettings.__dataclass_fields__.values()}
    values = {name: config[name] for name in names if name in config}
    values["index_factory"] = config.index_factory
    return LSRSettings(**values)


def run_lsr(config, workdir: str) -> dict:
    if config.get("index_backend", "faiss") != "faiss":
        raise ValueError("the LSR job searches (and refreshes) FAISS indexes: index_backend must be 'faiss'")
    if sharding.spans_processes(sharding.job_lm_mesh(config.get("lm_model_parallel", 1))):
        raise ValueError(f"lm_model_parallel={config.lm_model_parallel} spans processes, but LSR training gives each "
                         "process its own examples: use at most one host's devices for the LM's model axis")
    prepared = eval_run.prepare(config, workdir)  # models, datastore, index
    train_docs = setup.read_documents(prepared.paths["train"])
    check_disjoint(train_docs, prepared.store)
    eval_ids = {d.id for d in setup.read_documents(prepared.paths["eval"])}
    if eval_ids & {d.id for d in train_docs}:
        raise ValueError("training and evaluation documents overlap")
    examples = training_examples(train_docs, prepared.tokenizer, query_tokens=config.train_query_tokens,
                                 continuation_tokens=config.train_continuation_tokens, seed=config.seed,
                                 max_examples=config.get("max_train_examples") or None)
    settings = lsr_settings(config)
    logging.info("LSR: %d training examples, %s", len(examples), settings)
    trained = train_lsr(prepared.encoder, prepared.lm, prepared.store, examples, os.path.join(workdir, "lsr"), settings,
                        initial_index=prepared.index)
    encoder_lsr = prepared.encoder.with_params(trained["params"], name=f"{config.encoder}+lsr")
    if distributed.is_lead():
        save_params(trained["params"], os.path.join(workdir, TRAINED_RETRIEVER),
                    {"encoder": config.encoder, "train_documents": str(settings.train_documents).lower()})
    retrievers = setup.make_retrievers(config.methods, prepared.encoder, prepared.store, prepared.index, config.seed)
    retrievers["replug_lsr"] = trained_retriever(prepared.encoder, encoder_lsr, settings.train_documents, prepared.store,
                                                 prepared.index, workdir, config)
    extra = {"lsr": {**dataclasses.asdict(settings), "training_examples": len(examples), **trained["stats"]}}
    tau_lsr = config.get("lsr_temperature") or config.temperature  # both are reported: τ and γ are in the sweep
    return eval_run.evaluate_and_report(config, workdir, prepared, retrievers, extra, temperatures={"replug_lsr": tau_lsr},
                                        temperature_sweep=(settings.gamma, config.temperature, tau_lsr))
